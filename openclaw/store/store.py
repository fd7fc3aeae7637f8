"""The `Store`: the daemon's persistent state behind one async API, one short transaction per call.

Every method returns frozen records (see records.py), never live ORM rows, so results are safe to
keep after the session closes. Users are passed as the key "channel:external_id" wherever a method
acts for a user; the users-table methods take the pair because that is how connectors see them.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from sqlalchemy import and_, delete, func, insert, or_, select, text, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from openclaw.store.engine import BUSY_TIMEOUT_MS, create_engine
from openclaw.store.migrate import current_revision, migrate
from openclaw.store.models import (
    AUDIT_SKILL_CHARS,
    AuditRow,
    ConversationRow,
    InboundEventRow,
    MessageRow,
    OutboundMessageRow,
    PairingCodeRow,
    ReminderRow,
    SummaryRow,
    UsageRow,
    UserRow,
    storable,
)
from openclaw.store.records import (
    AuditEntry,
    Conversation,
    ConversationStatus,
    InboundEvent,
    InboundStatus,
    Message,
    MessageRole,
    MovedChat,
    OutboundMessage,
    OutboundStatus,
    PairingCode,
    Reminder,
    ReminderStatus,
    StoreUnavailableError,
    Summary,
    UnknownUserError,
    User,
    UserStatus,
    parse_user_key,
    user_key,
)
from sandbox.to_end import run_to_end

# 32 symbols without 0/O and 1/I, so a code read aloud or typed from a phone survives; 8 of them
# give 40 bits, and `secrets` makes them unguessable.
PAIRING_ALPHABET = "23456789ABCDEFGHJKLMNPQRSTUVWXYZ"
PAIRING_CODE_LENGTH = 8
CLOSE_WAIT_S = 15.0  # Store.close waits this long at most for calls still running

Clock = Callable[[], datetime]
R = TypeVar("R")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _record(cls: type[R], row: Any, **extra: Any) -> R:
    values = {f.name: getattr(row, f.name) for f in fields(cls) if f.name not in extra}
    return cls(**values, **extra)


async def _insert(session: AsyncSession, model: type, record: type[R], **values: Any) -> R:
    """INSERT one row as a plain statement and return it as `record` (`values` plus the new id).
    For rows written on every turn: the ORM's unit of work (add, flush, identity map) costs more
    than the statement itself. SQLite gives the id from the cursor, PostgreSQL by RETURNING."""
    result = await session.execute(_insert_statement(model), _parameters(model, values))
    return record(id=result.inserted_primary_key[0], **values)


def _parameters(model: type, values: dict[str, Any]) -> dict[str, Any]:
    """Values by attribute name to parameters by column (AuditRow.user is column "user_key")."""
    columns = model.__mapper__.columns
    return {columns[key].key: value for key, value in values.items()}


@functools.cache
def _insert_statement(model: type) -> Any:
    # Built once: a statement made per call spends more on construction and its cache key than on
    # the INSERT; the values go in as parameters.
    return insert(model.__table__)


class _NoRoom(Exception):
    """Rolls back a reminder that would take a user past their limit."""


def new_pairing_code() -> str:
    return "".join(secrets.choice(PAIRING_ALPHABET) for _ in range(PAIRING_CODE_LENGTH))


def normalize_pairing_code(code: str) -> str:
    """What a person types ("abcd-2345 ") to what is stored ("ABCD2345")."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


class Store:
    """Open with `await Store.open(url)` (applies migrations); close with `await store.close()`."""

    def __init__(self, engine: AsyncEngine, *, clock: Clock | None = None):
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._clock = clock or _utcnow
        self._calls: set[asyncio.Task[Any]] = set()  # running, each in a task of its own (_whole)

    @classmethod
    async def open(cls, url: str | URL, *, migrate_schema: bool = True, clock: Clock | None = None,
                   busy_timeout_ms: int = BUSY_TIMEOUT_MS, echo: bool = False) -> Store:
        engine = None
        try:
            engine = create_engine(url, busy_timeout_ms=busy_timeout_ms, echo=echo)
            if migrate_schema:
                await migrate(engine)
        except BaseException as err:
            if engine is not None:
                await engine.dispose()
            if not isinstance(err, SQLAlchemyError | OSError):
                raise
            shown = make_url(url).render_as_string(hide_password=True)
            raise StoreUnavailableError(
                f"cannot open the store at {shown}: {getattr(err, 'orig', None) or err}; "
                "check [store] url in the config, that its folder is writable or its server is up"
            ) from err
        return cls(engine, clock=clock)

    async def close(self) -> None:
        # Calls still running finish first (up to a limit: a hung server must not hang a stop):
        # disposed under them, their connections would be terminated mid-transaction. wait, not
        # gather, which would cancel them if this is cancelled.
        if self._calls:
            await asyncio.wait(self._calls, timeout=CLOSE_WAIT_S)
        await self.engine.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    async def schema_revision(self) -> str | None:
        return await current_revision(self.engine)

    def now(self) -> datetime:
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError("the store's clock returned a naive datetime; it must return UTC-aware ones")
        return now

    # -- transactions --------------------------------------------------------------------------

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[AsyncSession]:
        async with self._sessions() as session, session.begin():
            yield session

    async def _retrying(self, op: Callable[[AsyncSession], Awaitable[R]], attempts: int = 3) -> R:
        """Run `op` in a transaction, again if a concurrent writer won a unique index first.

        The retry then finds the winner's row (get-or-create) or draws a fresh value (codes).
        """
        for attempt in range(attempts):
            try:
                async with self._tx() as session:
                    return await op(session)
            except IntegrityError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    # -- users ---------------------------------------------------------------------------------

    @staticmethod
    async def _user_row(session: AsyncSession, channel: str, external_id: str) -> UserRow | None:
        return await session.scalar(
            select(UserRow).where(UserRow.channel == channel, UserRow.external_id == external_id))

    async def _require_user(self, session: AsyncSession, user: str) -> UserRow:
        row = await self._user_row(session, *parse_user_key(user))
        if row is None:
            raise UnknownUserError(f"no user {user!r} in the store; call Store.ensure_user first")
        return row

    async def get_user(self, channel: str, external_id: str | int) -> User | None:
        async with self._tx() as session:
            row = await self._user_row(session, channel, str(external_id))
            return None if row is None else _record(User, row)

    async def ensure_user(self, channel: str, external_id: str | int, display_name: str | None = None,
                          status: UserStatus | str = UserStatus.PENDING) -> User:
        """Insert the user with `status`, or return the existing one (its status is never changed
        here; only its display name is refreshed when a new one is given)."""
        external_id, status = str(external_id), UserStatus(status)

        async def op(session: AsyncSession) -> User:
            row = await self._user_row(session, channel, external_id)
            now = self.now()
            if row is None:
                row = UserRow(channel=channel, external_id=external_id, display_name=display_name,
                              status=status, role=None, created_at=now, updated_at=now)
                session.add(row)
                await session.flush()
            elif display_name is not None and storable(display_name) != row.display_name:
                row.display_name, row.updated_at = display_name, now
            return _record(User, row)

        return await self._retrying(op)

    async def set_user_status(self, channel: str, external_id: str | int, status: UserStatus | str,
                              role: str | None = None) -> User:
        """Set status (and role, when given; None leaves it), creating the user if it is new. A
        user no longer pending loses their live pairing codes: one approved after a block would
        undo it."""
        external_id, status = str(external_id), UserStatus(status)

        async def op(session: AsyncSession) -> User:
            row = await self._user_row(session, channel, external_id)
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
            return _record(User, row)

        return await self._retrying(op)

    async def list_users(self, status: UserStatus | str | None = None) -> list[User]:
        query = select(UserRow).order_by(UserRow.id)
        if status is not None:
            query = query.where(UserRow.status == UserStatus(status))
        async with self._tx() as session:
            return [_record(User, row) for row in await session.scalars(query)]

    # -- pairing -------------------------------------------------------------------------------

    @staticmethod
    def _live_code(now: datetime) -> tuple[Any, Any]:
        return PairingCodeRow.used_at.is_(None), PairingCodeRow.expires_at > now

    async def create_pairing_code(self, user: str, ttl_s: float = 3600, max_pending: int = 3) -> str | None:
        """The user's unexpired code, else a new one; None while `max_pending` other users wait,
        and for a user no longer pending (blocked or allowed meanwhile, by another process)."""

        async def op(session: AsyncSession) -> str | None:
            row = await self._require_user(session, user)
            if row.status is not UserStatus.PENDING:
                return None
            now = self.now()
            live = self._live_code(now)
            mine = await session.scalar(
                select(PairingCodeRow.code).where(PairingCodeRow.user_id == row.id, *live)
                .order_by(PairingCodeRow.id.desc()).limit(1))
            if mine is not None:
                return mine
            others = await session.scalar(
                select(func.count()).select_from(PairingCodeRow)
                .where(PairingCodeRow.user_id != row.id, *live))
            if (others or 0) >= max_pending:
                return None
            code = new_pairing_code()  # a clash with an old code fails the flush; the retry redraws
            session.add(PairingCodeRow(code=code, user_id=row.id, created_at=now,
                                       expires_at=now + timedelta(seconds=ttl_s), used_at=None))
            await session.flush()
            return code

        return await self._retrying(op)

    async def list_pairing_codes(self, include_expired: bool = False) -> list[PairingCode]:
        """Codes waiting for approval, oldest first; with include_expired, every code ever issued."""
        query = (select(PairingCodeRow, UserRow).join(UserRow, PairingCodeRow.user_id == UserRow.id)
                 .order_by(PairingCodeRow.id))
        async with self._tx() as session:
            if not include_expired:
                query = query.where(*self._live_code(self.now()))
            rows = (await session.execute(query)).all()
            return [_record(PairingCode, code, user=user_key(u.channel, u.external_id),
                            display_name=u.display_name) for code, u in rows]

    async def approve_pairing(self, code: str) -> User | None:
        """Use an unexpired, unused code: mark it used and allow its user. None if there is none."""
        return await self._answer_pairing(code, UserStatus.ALLOWED)

    async def deny_pairing(self, code: str) -> User | None:
        """Use an unexpired, unused code to refuse its user: blocked, so no more codes are sent
        to them. None if there is no such code."""
        return await self._answer_pairing(code, UserStatus.BLOCKED)

    async def _answer_pairing(self, code: str, status: UserStatus) -> User | None:
        code = normalize_pairing_code(code)
        async with self._tx() as session:
            now = self.now()
            # A conditional UPDATE, so two admins approving at once cannot both succeed.
            # Only for a user still waiting: approving must not undo a block made meanwhile.
            pending = select(UserRow.id).where(UserRow.status == UserStatus.PENDING)
            result = await session.execute(
                update(PairingCodeRow).where(PairingCodeRow.code == code, *self._live_code(now),
                                             PairingCodeRow.user_id.in_(pending))
                .values(used_at=now).execution_options(synchronize_session=False))
            if result.rowcount != 1:
                return None
            user_id = await session.scalar(select(PairingCodeRow.user_id).where(PairingCodeRow.code == code))
            row = await session.get(UserRow, user_id)
            assert row is not None  # the foreign key guarantees it
            row.status, row.updated_at = status, now
            return _record(User, row)

    # -- conversations -------------------------------------------------------------------------

    async def active_conversation(self, user: str, chat_id: str | int,
                                  channel: str | None = None) -> Conversation:
        """The user's active conversation in this chat, started if there is none.

        `channel` defaults to the user's own channel (the part of the key before ':').
        """
        chat_id = str(chat_id)
        channel = channel or parse_user_key(user)[0]

        async def op(session: AsyncSession) -> Conversation:
            owner = await self._require_user(session, user)
            row = await session.scalar(
                select(ConversationRow).where(
                    ConversationRow.user_id == owner.id, ConversationRow.channel == channel,
                    ConversationRow.chat_id == chat_id,
                    ConversationRow.status == ConversationStatus.ACTIVE,
                ).order_by(ConversationRow.id.desc()).limit(1))
            if row is None:
                now = self.now()
                row = ConversationRow(user_id=owner.id, channel=channel, chat_id=chat_id,
                                      status=ConversationStatus.ACTIVE, created_at=now, updated_at=now,
                                      archived_at=None)
                session.add(row)
                await session.flush()  # the partial unique index rejects a concurrent twin here
            return _record(Conversation, row)

        return await self._retrying(op)

    async def get_conversation(self, conversation_id: int) -> Conversation | None:
        async with self._tx() as session:
            row = await session.get(ConversationRow, conversation_id)
            return None if row is None else _record(Conversation, row)

    async def archive_conversation(self, conversation_id: int) -> bool:
        """Archive it (what `/new` does); False if it was not active."""
        async with self._tx() as session:
            now = self.now()
            result = await session.execute(
                update(ConversationRow)
                .where(ConversationRow.id == conversation_id,
                       ConversationRow.status == ConversationStatus.ACTIVE)
                .values(status=ConversationStatus.ARCHIVED, archived_at=now, updated_at=now)
                .execution_options(synchronize_session=False))
            return result.rowcount == 1

    # -- messages ------------------------------------------------------------------------------

    async def add_message(self, conversation_id: int, role: MessageRole | str, content: str,
                          tool_calls: Any | None = None, tool_call_id: str | None = None,
                          token_count: int | None = None) -> Message:
        role = MessageRole(role)
        try:
            async with self._tx() as session:
                # One INSERT, on the hot path of every turn; the conversation's foreign key (not a
                # separate look-up) rejects a message for a conversation that does not exist.
                return await _insert(session, MessageRow, Message, conversation_id=conversation_id,
                                     role=role, content=content, tool_calls=tool_calls,
                                     tool_call_id=tool_call_id, token_count=token_count,
                                     created_at=self.now())
        except IntegrityError as err:
            raise LookupError(f"conversation {conversation_id} does not exist; no message added") from err

    async def list_messages(self, conversation_id: int, after_id: int | None = None,
                            limit: int | None = None) -> list[Message]:
        """Messages in the order they were added (by id), optionally only those after `after_id`."""
        query = select(MessageRow).where(MessageRow.conversation_id == conversation_id)
        if after_id is not None:
            query = query.where(MessageRow.id > after_id)
        query = query.order_by(MessageRow.id).limit(limit)
        async with self._tx() as session:
            return [_record(Message, row) for row in await session.scalars(query)]

    # -- inbound events ------------------------------------------------------------------------

    async def record_inbound(self, channel: str, message_id: str | int, user: str, chat_id: str | int,
                             text: str, payload: Any | None = None) -> tuple[InboundEvent, bool]:
        """Persist an incoming message before it is acknowledged. `is_new` is False for a redelivery
        (same channel and message id), which must not be answered again."""
        parse_user_key(user)
        message_id, chat_id = str(message_id), str(chat_id)
        try:
            async with self._tx() as session:
                event = await _insert(session, InboundEventRow, InboundEvent, channel=channel,
                                      message_id=message_id, user=user, chat_id=chat_id, text=text,
                                      payload=payload, status=InboundStatus.RECEIVED, error=None,
                                      received_at=self.now(), processed_at=None)
                return event, True
        except IntegrityError as clash:
            # The unique (channel, message_id) index decides races, on SQLite and PostgreSQL alike.
            async with self._tx() as session:
                row = await session.scalar(select(InboundEventRow).where(
                    InboundEventRow.channel == channel, InboundEventRow.message_id == message_id))
                if row is None:
                    raise clash
                return _record(InboundEvent, row), False

    async def mark_inbound(self, event_id: int, status: InboundStatus | str,
                           error: str | None = None) -> None:
        status = InboundStatus(status)
        async with self._tx() as session:
            done = None if status is InboundStatus.RECEIVED else self.now()
            result = await session.execute(
                update(InboundEventRow).where(InboundEventRow.id == event_id)
                .values(status=status, processed_at=done, error=error)
                .execution_options(synchronize_session=False))
            if result.rowcount != 1:
                raise LookupError(f"inbound event {event_id} does not exist")

    async def pending_inbound(self, limit: int | None = None) -> list[InboundEvent]:
        """Events received but neither processed nor failed, oldest first (crash recovery)."""
        query = (select(InboundEventRow).where(InboundEventRow.status == InboundStatus.RECEIVED)
                 .order_by(InboundEventRow.id).limit(limit))
        async with self._tx() as session:
            return [_record(InboundEvent, row) for row in await session.scalars(query)]

    # -- outbound messages ---------------------------------------------------------------------

    async def add_reply(self, channel: str, chat_id: str | int, pieces: list[str], *,
                        conversation_id: int | None = None,
                        answers: int | None = None) -> list[OutboundMessage]:
        """Store a reply's pieces as pending and, in the same transaction, mark the inbound event
        it `answers` processed: after a crash the reply is re-sent (the outbox) but the turn is
        never run a second time."""
        async with self._tx() as session:
            if answers is not None:
                await session.execute(
                    update(InboundEventRow).where(InboundEventRow.id == answers)
                    .values(status=InboundStatus.PROCESSED, processed_at=self.now(), error=None)
                    .execution_options(synchronize_session=False))
            return await self._add_outbound(session, channel, chat_id, pieces, conversation_id,
                                            answers)

    async def _add_outbound(self, session: AsyncSession, channel: str, chat_id: str | int,
                            pieces: list[str], conversation_id: int | None,
                            answers: int | None) -> list[OutboundMessage]:
        now = self.now()
        # One INSERT per piece, in order: the ids keep the order the pieces are sent in.
        return [await _insert(session, OutboundMessageRow, OutboundMessage,
                              conversation_id=conversation_id, inbound_event_id=answers,
                              channel=channel, chat_id=str(chat_id), text=piece,
                              status=OutboundStatus.PENDING, attempts=0, external_message_id=None,
                              error=None, created_at=now, updated_at=now, sent_at=None)
                for piece in pieces]

    async def mark_outbound(self, outbound_id: int, status: OutboundStatus | str,
                            external_message_id: str | int | None = None,
                            error: str | None = None) -> OutboundMessage:
        """Record one delivery attempt: attempts += 1, `error` is the latest attempt's (None clears).

        `pending` means "try again"; `sent` is final and sets sent_at.
        """
        status, now = OutboundStatus(status), self.now()
        row_cls = OutboundMessageRow
        values: dict[Any, Any] = {row_cls.status: status, row_cls.attempts: row_cls.attempts + 1,
                                  row_cls.error: error, row_cls.updated_at: now}
        if external_message_id is not None:
            values[row_cls.external_message_id] = str(external_message_id)
        if status is OutboundStatus.SENT:
            values[row_cls.sent_at] = now
        every_column = [column.label(key) for key, column in row_cls.__mapper__.columns.items()]
        async with self._tx() as session:
            # The WHERE keeps a sent message's status final. Then the row is read back: not by
            # RETURNING, which SQLite has only from 3.35 (Debian 11 and RHEL 9 ship 3.34).
            changed = await session.execute(
                update(row_cls.__table__)
                .where(row_cls.id == outbound_id, row_cls.status != OutboundStatus.SENT)
                .values(values))
            row = (await session.execute(
                select(*every_column).where(row_cls.id == outbound_id))).one_or_none()
            if row is None:
                raise LookupError(f"outbound message {outbound_id} does not exist")
            if changed.rowcount != 1:
                raise ValueError(f"outbound message {outbound_id} was already sent; its status is final")
            return _record(OutboundMessage, row)

    async def fail_unsent(self, outbound_ids: Iterable[int], error: str) -> int:
        """Give up those of `outbound_ids` still pending (pieces that lost their meaning before
        they went out); how many. Sent ones stay as they are."""
        row_cls = OutboundMessageRow
        async with self._tx() as session:
            result = await session.execute(
                update(row_cls.__table__)
                .where(row_cls.id.in_(list(outbound_ids)), row_cls.status == OutboundStatus.PENDING)
                .values(status=OutboundStatus.FAILED, error=error, updated_at=self.now()))
            return result.rowcount

    async def list_outbound(self, limit: int = 100) -> list[OutboundMessage]:
        """Oldest first, every status: what was sent, what waits for a retry, what failed."""
        query = select(OutboundMessageRow).order_by(OutboundMessageRow.id).limit(limit)
        async with self._tx() as session:
            return [_record(OutboundMessage, row) for row in await session.scalars(query)]

    async def pending_outbound(self, channel: str | None = None, chat_id: str | None = None,
                               limit: int | None = None) -> list[OutboundMessage]:
        """Oldest first; all chats, or one."""
        query = select(OutboundMessageRow).where(OutboundMessageRow.status == OutboundStatus.PENDING)
        if channel is not None:
            query = query.where(OutboundMessageRow.channel == channel,
                                OutboundMessageRow.chat_id == str(chat_id))
        query = query.order_by(OutboundMessageRow.id).limit(limit)
        async with self._tx() as session:
            return [_record(OutboundMessage, row) for row in await session.scalars(query)]

    # -- reminders -----------------------------------------------------------------------------

    async def add_reminder(self, user: str, chat_id: str | int, text: str, due_at: datetime, *,
                           repeat: str | None = None, timezone: str = "UTC",
                           local_time: str | None = None,
                           max_active: int | None = None) -> Reminder | None:
        """A reminder delivered to `chat_id` on the user's channel at `due_at`, meant as wall-clock
        `local_time` in `timezone` (default: due_at's there); None, and nothing stored, when the
        user would have more than `max_active` active ones. It gets the user's next number: one
        more than any of theirs, cancelled and done ones included, so none is ever given twice."""
        channel, _ = parse_user_key(user)
        if local_time is None:
            local_time = due_at.astimezone(ZoneInfo(timezone)).time().isoformat()
        # Read by the INSERT itself, so no other add of this user can come in between: on SQLite
        # the INSERT holds the write lock before it reads, on PostgreSQL the advisory lock below
        # makes a second add wait. UNIQUE (user_key, number) is the backstop (and _retrying).
        next_number = (select(func.coalesce(func.max(ReminderRow.number), 0) + 1)
                       .where(ReminderRow.user == user).scalar_subquery())

        async def op(session: AsyncSession) -> Reminder:
            if self.dialect == "postgresql":
                # Also keeps two adds at once from both seeing room under max_active.
                await session.execute(select(func.pg_advisory_xact_lock(func.hashtext(user))))
            row = ReminderRow(number=next_number, user=user, channel=channel, chat_id=str(chat_id),
                              text=text, due_at=due_at, repeat=repeat, timezone=timezone,
                              local_time=local_time, status=ReminderStatus.ACTIVE, fired_count=0,
                              created_at=self.now(), fired_at=None)
            session.add(row)
            await session.flush()
            await session.refresh(row, ["number"])  # the database worked it out
            if max_active is not None and await session.scalar(
                    select(func.count()).select_from(ReminderRow).where(
                        ReminderRow.user == user, ReminderRow.status == ReminderStatus.ACTIVE)
            ) > max_active:
                raise _NoRoom
            return _record(Reminder, row)

        try:
            return await self._retrying(op)
        except _NoRoom:  # rolled back
            return None

    async def active_reminders(self, user: str | None = None, *, due_by: datetime | None = None,
                               exclude: Iterable[int] = (), limit: int | None = None) -> list[Reminder]:
        """Active reminders, soonest first: one user's or everyone's, those due by `due_by`,
        without the ids in `exclude`."""
        query = select(ReminderRow).where(ReminderRow.status == ReminderStatus.ACTIVE)
        if user is not None:
            query = query.where(ReminderRow.user == user)
        if due_by is not None:
            query = query.where(ReminderRow.due_at <= due_by)
        if exclude := list(exclude):
            query = query.where(ReminderRow.id.not_in(exclude))
        query = query.order_by(ReminderRow.due_at, ReminderRow.id).limit(limit)
        async with self._tx() as session:
            return [_record(Reminder, row) for row in await session.scalars(query)]

    async def cancel_reminder(self, user: str, number: int) -> Reminder | None:
        """Cancel the user's own active reminder by the number they see; None when they have no
        active one with that number."""
        mine = (ReminderRow.user == user, ReminderRow.number == number)
        async with self._tx() as session:
            # A conditional UPDATE: one delivered meanwhile stays done, not cancelled.
            result = await session.execute(
                update(ReminderRow).where(*mine, ReminderRow.status == ReminderStatus.ACTIVE)
                .values(status=ReminderStatus.CANCELLED).execution_options(synchronize_session=False))
            if result.rowcount != 1:
                return None
            return _record(Reminder, await session.scalar(select(ReminderRow).where(*mine)))

    async def cancel_chat_reminders(self, channel: str, chat_id: str | int) -> list[Reminder]:
        """Cancel every active reminder meant for this chat (it refuses the bot for good);
        the ones cancelled."""
        async with self._tx() as session:
            return await self._change_chat_reminders(session, channel, str(chat_id),
                                                     {"status": ReminderStatus.CANCELLED})

    async def move_chat(self, channel: str, chat_id: str | int, new_chat_id: str | int) -> MovedChat:
        """The chat lives on as `new_chat_id` (a Telegram group upgraded to a supergroup): in one
        transaction its active conversations, its undelivered replies (in their order), its
        messages not answered yet and its active reminders move there, so its history and what it
        is owed go on under the new id.
        Nothing is left under the old id, so a second call for the same move (the other service
        message, a later refusal) moves nothing. A user who already has an active conversation
        under the new id (the move came late) keeps the one that moved, with the chat's history;
        the other is archived, as /new would."""
        old, new = str(chat_id), str(new_chat_id)
        async with self._tx() as session:
            now = self.now()
            active = (ConversationRow.channel == channel,
                      ConversationRow.status == ConversationStatus.ACTIVE)
            # First, or the move would break "one active conversation per user and chat".
            movers = select(ConversationRow.user_id).where(*active, ConversationRow.chat_id == old)
            await session.execute(
                update(ConversationRow)
                .where(*active, ConversationRow.chat_id == new, ConversationRow.user_id.in_(movers))
                .values(status=ConversationStatus.ARCHIVED, archived_at=now, updated_at=now)
                .execution_options(synchronize_session=False))
            conversations = list(await session.scalars(
                select(ConversationRow).where(*active, ConversationRow.chat_id == old)
                .order_by(ConversationRow.id)))
            # The same rows, ids kept: the outbox sends a chat's pending replies in id order.
            outbound = list(await session.scalars(
                select(OutboundMessageRow).where(OutboundMessageRow.channel == channel,
                                                 OutboundMessageRow.chat_id == old,
                                                 OutboundMessageRow.status == OutboundStatus.PENDING)
                .order_by(OutboundMessageRow.id)))
            for row in conversations + outbound:
                row.chat_id, row.updated_at = new, now
            # After a restart Gateway.recover answers them in the chat they name: the new one,
            # which takes replies (and holds their conversation). Answered ones keep their id.
            await session.execute(
                update(InboundEventRow)
                .where(InboundEventRow.channel == channel, InboundEventRow.chat_id == old,
                       InboundEventRow.status == InboundStatus.RECEIVED)
                .values(chat_id=new)
                .execution_options(synchronize_session=False))
            reminders = await self._change_chat_reminders(session, channel, old, {"chat_id": new})
            return MovedChat([_record(Conversation, row) for row in conversations],
                             [_record(OutboundMessage, row) for row in outbound], reminders)

    @staticmethod
    async def _change_chat_reminders(session: AsyncSession, channel: str, chat_id: str,
                                     values: dict[str, Any]) -> list[Reminder]:
        rows = list(await session.scalars(
            select(ReminderRow).where(ReminderRow.channel == channel,
                                      ReminderRow.chat_id == str(chat_id),
                                      ReminderRow.status == ReminderStatus.ACTIVE)
            .order_by(ReminderRow.id)))
        for row in rows:
            for key, value in values.items():
                setattr(row, key, value)
        await session.flush()
        return [_record(Reminder, row) for row in rows]

    async def fire_reminder(self, reminder_id: int, due_at: datetime, next_due: datetime | None,
                            pieces: list[str], *, conversation_id: int | None = None
                            ) -> list[OutboundMessage] | None:
        """One delivery of the reminder that was due at `due_at`, in one transaction: it moves to
        `next_due` (None: done) and `pieces` are stored for the outbox to send. None, and nothing
        stored, when it was cancelled or already delivered meanwhile."""
        async with self._tx() as session:
            now = self.now()
            moved = await session.execute(
                update(ReminderRow)
                .where(ReminderRow.id == reminder_id, ReminderRow.status == ReminderStatus.ACTIVE,
                       ReminderRow.due_at == due_at)
                .values(due_at=next_due or due_at, fired_at=now,
                        fired_count=ReminderRow.fired_count + 1,
                        status=ReminderStatus.ACTIVE if next_due else ReminderStatus.DONE)
                .execution_options(synchronize_session=False))
            if moved.rowcount != 1:
                return None
            row = await session.get(ReminderRow, reminder_id)
            return await self._add_outbound(session, row.channel, row.chat_id, pieces,
                                            conversation_id, None)

    # -- summaries -----------------------------------------------------------------------------

    async def add_summary(self, conversation_id: int, up_to_message_id: int, content: str,
                          token_count: int) -> Summary:
        async with self._tx() as session:
            row = SummaryRow(conversation_id=conversation_id, up_to_message_id=up_to_message_id,
                             content=content, token_count=token_count, created_at=self.now())
            session.add(row)
            await session.flush()
            return _record(Summary, row)

    async def latest_summary(self, conversation_id: int) -> Summary | None:
        """The summary reaching furthest into the conversation."""
        query = (select(SummaryRow).where(SummaryRow.conversation_id == conversation_id)
                 .order_by(SummaryRow.up_to_message_id.desc(), SummaryRow.id.desc()).limit(1))
        async with self._tx() as session:
            row = await session.scalar(query)
            return None if row is None else _record(Summary, row)

    # -- audit log -----------------------------------------------------------------------------

    async def add_audit(self, user: str, skill: str, arguments: Any | None, decision: str, *,
                        exit_status: int | None = None, duration_ms: int | None = None,
                        output_bytes: int | None = None, detail: str | None = None) -> AuditEntry:
        skill = skill[:AUDIT_SKILL_CHARS]  # the model's to name, as long as it likes
        async with self._tx() as session:
            return await _insert(session, AuditRow, AuditEntry, at=self.now(), user=user, skill=skill,
                                 arguments=arguments, decision=decision, exit_status=exit_status,
                                 duration_ms=duration_ms, output_bytes=output_bytes, detail=detail)

    async def list_audit(self, limit: int = 100, user: str | None = None) -> list[AuditEntry]:
        """Newest first."""
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if user is not None:
            query = query.where(AuditRow.user == user)
        async with self._tx() as session:
            return [_record(AuditEntry, row) for row in await session.scalars(query)]

    # -- usage ---------------------------------------------------------------------------------

    async def add_usage(self, user: str, prompt_tokens: int, completion_tokens: int,
                        conversation_id: int | None = None) -> None:
        async with self._tx() as session:
            await session.execute(_insert_statement(UsageRow), _parameters(UsageRow, {
                "at": self.now(), "user": user, "conversation_id": conversation_id,
                "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}))

    async def tokens_today(self, user: str | None = None, since: datetime | None = None) -> int:
        """Prompt + completion tokens since `since` (default: today's midnight UTC), one user or all."""
        if since is None:
            since = self.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        total = UsageRow.prompt_tokens + UsageRow.completion_tokens
        query = select(func.coalesce(func.sum(total), 0)).where(UsageRow.at >= since)
        if user is not None:
            query = query.where(UsageRow.user == user)
        async with self._tx() as session:
            return int(await session.scalar(query) or 0)

    # -- forgetting a user ---------------------------------------------------------------------

    # What a forgotten user's audit rows say instead of their arguments and detail.
    FORGOTTEN_AUDIT_DETAIL = "arguments and detail removed by `openclaw users forget`"

    async def forget_user(self, user: str, *, dry_run: bool = False) -> dict[str, int]:
        """Delete everything stored about `user`, in one transaction, and say how many rows of
        each kind went (with `dry_run`, how many would; nothing changes): their conversations
        with their messages and summaries, their inbound messages, the replies of those
        conversations, to those messages and to their own chat (pairing codes were sent there),
        their reminders, pairing codes and usage, and their users row, so they are unknown again.
        Their audit rows stay, the admin's record of what ran, with the arguments and detail
        (their words: commands, mail, file contents) blanked; "audit rows blanked" counts those.

        Only for a store no daemon is using: a running one keeps conversation ids in memory, and
        SQLite gives a deleted id to the next new row (see `openclaw users forget`)."""
        channel, external_id = parse_user_key(user)
        is_user = and_(UserRow.channel == channel, UserRow.external_id == external_id)
        user_id = select(UserRow.id).where(is_user)
        conversations = select(ConversationRow.id).where(ConversationRow.user_id.in_(user_id))
        inbound = select(InboundEventRow.id).where(InboundEventRow.user == user)
        blanked = {"arguments": None, "detail": self.FORGOTTEN_AUDIT_DETAIL}
        # kind: (table, which rows, None to delete them or the values to set). In this order:
        # what refers to a conversation or an inbound message goes before it.
        changes: dict[str, tuple[Any, Any, dict[str, Any] | None]] = {
            "messages": (MessageRow, MessageRow.conversation_id.in_(conversations), None),
            "summaries": (SummaryRow, SummaryRow.conversation_id.in_(conversations), None),
            "outbound messages": (OutboundMessageRow, or_(
                OutboundMessageRow.conversation_id.in_(conversations),
                OutboundMessageRow.inbound_event_id.in_(inbound),
                # Their private chat has their id on Telegram (and the console), not on Discord:
                # a code sent to a Discord user before pairing (nothing else) is not found.
                and_(OutboundMessageRow.channel == channel,
                     OutboundMessageRow.chat_id == external_id)), None),
            "inbound messages": (InboundEventRow, InboundEventRow.user == user, None),
            "reminders": (ReminderRow, ReminderRow.user == user, None),
            "usage rows": (UsageRow, UsageRow.user == user, None),
            "pairing codes": (PairingCodeRow, PairingCodeRow.user_id.in_(user_id), None),
            "conversations": (ConversationRow, ConversationRow.user_id.in_(user_id), None),
            "users": (UserRow, is_user, None),
            "audit rows blanked": (AuditRow, and_(AuditRow.user == user, or_(
                AuditRow.arguments.is_not(None),
                AuditRow.detail.is_distinct_from(self.FORGOTTEN_AUDIT_DETAIL))), blanked),
        }
        counts: dict[str, int] = {}
        sqlite = self.dialect == "sqlite"
        async with self._tx() as session:
            if sqlite and not dry_run:  # freed pages are zeroed, not left holding their words
                await session.execute(text("PRAGMA secure_delete = ON"))
            for kind, (table, where, values) in changes.items():
                if dry_run:
                    counts[kind] = await session.scalar(
                        select(func.count()).select_from(table).where(where))
                    continue
                change = delete(table) if values is None else update(table).values(**values)
                result = await session.execute(
                    change.where(where).execution_options(synchronize_session=False))
                counts[kind] = result.rowcount
        if sqlite and not dry_run:  # nor the old pages in the write-ahead log
            async with self._tx() as session:
                await session.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        return counts


def _whole(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Runs a Store call in a task of its own, which a cancel of its caller does not reach: the
    call commits or rolls back whole, and only then does its caller get the cancel, so what it
    wrote is known to be there. Cut short inside a statement, SQLAlchemy treats the connection as
    broken: it terminates it, opens a new one, and, when a second cancel comes during that (a
    /stop after a /new, a drain after a /stop), logs "Exception closing connection" and "Task was
    destroyed but it is pending"; and what a stopped turn writes as it ends (its mark, its
    tokens) is lost. Costs a task, about 25 us, per call."""
    @functools.wraps(method)
    async def call(self: Store, *args: Any, **kwargs: Any) -> R:
        task = asyncio.ensure_future(method(self, *args, **kwargs))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return await run_to_end(task)
    return call


# Every public coroutine method, but close (which waits for the calls).
for _name, _method in list(vars(Store).items()):
    if not _name.startswith("_") and _name != "close" and inspect.iscoroutinefunction(_method):
        setattr(Store, _name, _whole(_method))
