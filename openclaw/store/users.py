"""Users (one row per person and channel, with a status and a role) and the pairing codes by which
a stranger asks the admin to be let in.

The users-table methods take (channel, external_id), as connectors see a person; the others take
the user key "channel:external_id".
"""

from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import StoreBase, to_record
from openclaw.store.columns import storable
from openclaw.store.models import InboundEventRow, PairingCodeRow, PairingRefusalRow, UserRow
from openclaw.store.pairing import count_issued, make_room, record_refusal, why_refused
from openclaw.store.records import (
    PairingCode,
    PairingLimits,
    PairingRefusal,
    PairingRequest,
    UnknownUserError,
    User,
    UserStatus,
    parse_user_key,
    user_key,
)

# 32 symbols without 0/O and 1/I, so a code read aloud or typed from a phone survives; 8 of them
# give 40 bits, and `secrets` makes them unguessable.
PAIRING_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"
PAIRING_CODE_LENGTH = 8
DEFAULT_LIMITS = PairingLimits()
# Of a stranger's first message, kept to be answered once they are approved: a question, not a
# document (a longer one is cut; one message per code, so a stranger cannot fill the store).
KEPT_MESSAGE_CHARS = 2000


def new_pairing_code() -> str:
    return "".join(secrets.choice(PAIRING_ALPHABET) for _ in range(PAIRING_CODE_LENGTH))


def normalize_pairing_code(code: str) -> str:
    """What a person types ("abcd-2345 ") to what is stored ("ABCD2345")."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


async def find_user(session: AsyncSession, channel: str, external_id: str) -> UserRow | None:
    """The users row of (channel, external_id), in `session`; None if there is none."""
    return await session.scalar(
        select(UserRow).where(UserRow.channel == channel, UserRow.external_id == external_id))


async def require_user(session: AsyncSession, user: str) -> UserRow:
    """The users row of the key `user`; UnknownUserError if there is none."""
    row = await find_user(session, *parse_user_key(user))
    if row is None:
        raise UnknownUserError(f"no user {user!r} in the store; call Store.ensure_user first")
    return row


def _live_code(now: datetime) -> tuple[Any, Any]:
    return PairingCodeRow.used_at.is_(None), PairingCodeRow.expires_at > now


class UserStore(StoreBase):
    """The Store's users and pairing codes."""

    # -- users ---------------------------------------------------------------------------------

    async def get_user(self, channel: str, external_id: str | int) -> User | None:
        async with self.transaction() as session:
            row = await find_user(session, channel, str(external_id))
            return None if row is None else to_record(User, row)

    async def ensure_user(self, channel: str, external_id: str | int, display_name: str | None = None,
                          status: UserStatus | str = UserStatus.PENDING) -> User:
        """Insert the user with `status`, or return the existing one (its status is never changed
        here; only its display name is refreshed when a new one is given)."""
        external_id, status = str(external_id), UserStatus(status)

        async def op(session: AsyncSession) -> User:
            row = await find_user(session, channel, external_id)
            now = self.now()
            if row is None:
                row = UserRow(channel=channel, external_id=external_id, display_name=display_name,
                              status=status, role=None, created_at=now, updated_at=now)
                session.add(row)
                await session.flush()
            elif display_name is not None and storable(display_name) != row.display_name:
                row.display_name, row.updated_at = display_name, now
            return to_record(User, row)

        return await self.retrying(op)

    async def set_user_status(self, channel: str, external_id: str | int, status: UserStatus | str,
                              role: str | None = None) -> User:
        """Set status (and role, when given; None leaves it), creating the user if it is new. A
        user no longer pending loses their live pairing codes: one approved after a block would
        undo it."""
        external_id, status = str(external_id), UserStatus(status)

        async def op(session: AsyncSession) -> User:
            row = await find_user(session, channel, external_id)
            now = self.now()
            if row is None:
                row = UserRow(channel=channel, external_id=external_id, display_name=None, status=status,
                              role=role, created_at=now, updated_at=now)
                session.add(row)
                await session.flush()
            else:
                if status is not UserStatus.PENDING and row.status is UserStatus.PENDING:
                    await session.execute(
                        update(PairingCodeRow).where(PairingCodeRow.user_id == row.id,
                                                     PairingCodeRow.used_at.is_(None))
                        .values(used_at=now).execution_options(synchronize_session=False))
                row.status, row.updated_at = status, now
                if role is not None:
                    row.role = role
            return to_record(User, row)

        return await self.retrying(op)

    async def list_users(self, status: UserStatus | str | None = None) -> list[User]:
        query = select(UserRow).order_by(UserRow.id)
        if status is not None:
            query = query.where(UserRow.status == UserStatus(status))
        async with self.transaction() as session:
            return [to_record(User, row) for row in await session.scalars(query)]

    async def private_chat_of(self, user: str, look_back: int = 20) -> str | None:
        """The private chat `user` last wrote to the bot from (among their `look_back` latest
        messages), where the daemon can reach them; None if it knows of none."""
        query = (select(InboundEventRow.chat_id, InboundEventRow.payload)
                 .where(InboundEventRow.user == user).order_by(InboundEventRow.id.desc())
                 .limit(look_back))
        async with self.transaction() as session:
            for chat_id, payload in (await session.execute(query)).all():
                if not (payload or {}).get("is_group"):
                    return chat_id
        return None

    # -- pairing -------------------------------------------------------------------------------

    async def create_pairing_code(self, user: str, limits: PairingLimits = DEFAULT_LIMITS) -> str | None:
        """The code of request_pairing."""
        return (await self.request_pairing(user, limits)).code

    async def request_pairing(self, user: str, limits: PairingLimits = DEFAULT_LIMITS, *,
                              chat_id: str | None = None, message: str = "") -> PairingRequest:
        """The user's unexpired code, else a new one if `limits` allow it, made room for among the
        waiting ones (pairing.make_room); no code, counted among the refused requests, if they do
        not; none for a user no longer pending (blocked or allowed meanwhile, by another
        process). `chat_id` and `message`: where they asked and what they wrote, kept with the
        code to be answered once it is approved: one message per code, the first with text,
        cut to KEPT_MESSAGE_CHARS."""
        kept = message[:KEPT_MESSAGE_CHARS] or None

        async def op(session: AsyncSession) -> PairingRequest:
            row = await require_user(session, user)
            if row.status is not UserStatus.PENDING:
                return PairingRequest(None)
            now = self.now()
            mine = await session.scalar(
                select(PairingCodeRow).where(PairingCodeRow.user_id == row.id, *_live_code(now))
                .order_by(PairingCodeRow.id.desc()).limit(1))
            if mine is not None:
                if mine.message is None and kept is not None and chat_id is not None:
                    mine.chat_id, mine.message = chat_id, kept
                return PairingRequest(mine.code)
            if reason := await why_refused(session, user, limits, now):
                await record_refusal(session, user, reason, now)
                return PairingRequest(None)
            await make_room(session, row.id, limits, now)
            code = new_pairing_code()  # a clash with an old code fails the flush; the retry redraws
            session.add(PairingCodeRow(code=code, user_id=row.id, created_at=now,
                                       expires_at=now + timedelta(seconds=limits.ttl_s), used_at=None,
                                       chat_id=chat_id, message=kept if chat_id is not None else None))
            await count_issued(session, user, now)
            await session.flush()
            return PairingRequest(code, new=True)

        return await self.retrying(op)

    async def retire_pairing_codes(self, users: set[str]) -> int:
        """End the live codes of `users` (the ones the config decides for: nobody answers their
        request any more) and drop what they kept; how many."""
        keys = UserRow.channel + ":" + UserRow.external_id
        async with self.transaction() as session:
            now = self.now()
            result = await session.execute(
                update(PairingCodeRow)
                .where(*_live_code(now),
                       PairingCodeRow.user_id.in_(select(UserRow.id).where(keys.in_(users))))
                .values(used_at=now, chat_id=None, message=None)
                .execution_options(synchronize_session=False))
            return result.rowcount

    async def list_pairing_refusals(self) -> list[PairingRefusal]:
        """Strangers refused a pairing code lately (PairingLimits bounds how many), the latest
        first."""
        query = (select(PairingRefusalRow, UserRow.display_name)
                 .outerjoin(UserRow, PairingRefusalRow.user == UserRow.channel + ":" + UserRow.external_id)
                 .order_by(PairingRefusalRow.last_at.desc(), PairingRefusalRow.id.desc()))
        async with self.transaction() as session:
            rows = (await session.execute(query)).all()
            return [to_record(PairingRefusal, row, display_name=name) for row, name in rows]

    async def list_pairing_codes(self, include_expired: bool = False) -> list[PairingCode]:
        """Codes waiting for approval, oldest first; with include_expired, every code ever issued."""
        query = (select(PairingCodeRow, UserRow).join(UserRow, PairingCodeRow.user_id == UserRow.id)
                 .order_by(PairingCodeRow.id))
        async with self.transaction() as session:
            if not include_expired:
                query = query.where(*_live_code(self.now()))
            rows = (await session.execute(query)).all()
            return [to_record(PairingCode, code, user=user_key(u.channel, u.external_id),
                              display_name=u.display_name) for code, u in rows]

    async def approve_pairing(self, code: str, *, role: str | None = None,
                              admin: bool = False) -> User | None:
        """Use an unexpired, unused code: mark it used and allow its user, with `role` and as an
        owner (`admin`) when given. None if there is none."""
        return await self._answer_pairing(code, UserStatus.ALLOWED, role, admin)

    async def deny_pairing(self, code: str) -> User | None:
        """Use an unexpired, unused code to refuse its user: blocked, so no more codes are sent
        to them. None if there is no such code."""
        return await self._answer_pairing(code, UserStatus.BLOCKED)

    async def _answer_pairing(self, code: str, status: UserStatus, role: str | None = None,
                              admin: bool = False) -> User | None:
        code = normalize_pairing_code(code)
        async with self.transaction() as session:
            now = self.now()
            # A conditional UPDATE, so two admins approving at once cannot both succeed.
            # Only for a user still waiting: approving must not undo a block made meanwhile.
            pending = select(UserRow.id).where(UserRow.status == UserStatus.PENDING)
            result = await session.execute(
                update(PairingCodeRow).where(PairingCodeRow.code == code, *_live_code(now),
                                             PairingCodeRow.user_id.in_(pending))
                .values(used_at=now).execution_options(synchronize_session=False))
            if result.rowcount != 1:
                return None
            user_id = await session.scalar(select(PairingCodeRow.user_id).where(PairingCodeRow.code == code))
            row = await session.get(UserRow, user_id)
            assert row is not None  # the foreign key guarantees it
            row.status, row.updated_at = status, now
            if role is not None:
                row.role = role
            if admin:
                row.admin = True
            if status is not UserStatus.ALLOWED:  # a refused stranger's message is not kept
                await session.execute(update(PairingCodeRow).where(PairingCodeRow.code == code)
                                      .values(chat_id=None, message=None)
                                      .execution_options(synchronize_session=False))
            return to_record(User, row)
