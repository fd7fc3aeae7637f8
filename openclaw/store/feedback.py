"""Users' grades of our replies (the `feedback` table), and the look-ups that find which turn a
grade is for: the turn a sent piece belongs to (a reaction names the piece), the last turn
answered to a user in a chat (/good, /bad, "that's wrong"), the message before this one (a
retry). What counts as which grade is decided in openclaw/feedback.py."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, or_, select, update

from openclaw.store.base import StoreBase, insert_record, to_record
from openclaw.store.feedback_records import Feedback, FeedbackKind, FeedbackSource
from openclaw.store.models import FeedbackRow, InboundEventRow, OutboundMessageRow
from openclaw.store.records import InboundEvent, OutboundStatus, parse_user_key

IDS_PER_QUERY = 500  # ids in one IN (...): well under every backend's limit on parameters


class FeedbackStore(StoreBase):
    """The Store's feedback rows."""

    async def grade(self, user: str, inbound_event_id: int, kind: FeedbackKind | str,
                    source: FeedbackSource | str) -> Feedback:
        """`user`'s grade of the reply to turn `inbound_event_id`: replaces their earlier one from
        the same `source` (a 👎 after a 👍), and stands beside those from other sources."""
        parse_user_key(user)
        kind, source = FeedbackKind(kind), FeedbackSource(source)
        mine = (FeedbackRow.user == user, FeedbackRow.inbound_event_id == inbound_event_id,
                FeedbackRow.source == source)

        async def op(session) -> Feedback:
            now = self.now()
            changed = await session.execute(
                update(FeedbackRow).where(*mine).values(kind=kind, at=now)
                .execution_options(synchronize_session=False))
            if changed.rowcount:
                return to_record(Feedback, await session.scalar(select(FeedbackRow).where(*mine)))
            return await insert_record(session, FeedbackRow, Feedback, user=user,
                                       inbound_event_id=inbound_event_id, kind=kind,
                                       source=source, at=now)

        return await self.retrying(op)  # two grades at once: the second updates the first's row

    async def ungrade(self, user: str, inbound_event_id: int, source: FeedbackSource | str,
                      kind: FeedbackKind | str | None = None) -> bool:
        """Delete `user`'s grade of that turn from `source`; with `kind`, only if it is still that
        one (a 👍 taken back after a 👎 replaced it leaves the 👎). Whether one went."""
        where = [FeedbackRow.user == user, FeedbackRow.inbound_event_id == inbound_event_id,
                 FeedbackRow.source == FeedbackSource(source)]
        if kind is not None:
            where.append(FeedbackRow.kind == FeedbackKind(kind))
        async with self.transaction() as session:
            gone = await session.execute(delete(FeedbackRow).where(*where)
                                         .execution_options(synchronize_session=False))
            return gone.rowcount > 0

    async def feedback_kinds(self, inbound_event_ids: Iterable[int]) -> dict[int, list[str]]:
        """The kinds of grade each of these turns got, oldest first; a turn with none is left
        out."""
        ids = sorted(set(inbound_event_ids))
        kinds: dict[int, list[str]] = {}
        async with self.transaction() as session:
            for start in range(0, len(ids), IDS_PER_QUERY):
                rows = await session.execute(
                    select(FeedbackRow.inbound_event_id, FeedbackRow.kind)
                    .where(FeedbackRow.inbound_event_id.in_(ids[start:start + IDS_PER_QUERY]))
                    .order_by(FeedbackRow.id))
                for event_id, kind in rows:
                    kinds.setdefault(event_id, []).append(str(kind))
        return kinds

    async def list_feedback(self, inbound_event_id: int | None = None) -> list[Feedback]:
        """Every grade (of one turn), oldest first."""
        query = select(FeedbackRow).order_by(FeedbackRow.id)
        if inbound_event_id is not None:
            query = query.where(FeedbackRow.inbound_event_id == inbound_event_id)
        async with self.transaction() as session:
            return [to_record(Feedback, row) for row in await session.scalars(query)]

    # -- which turn -------------------------------------------------------------------------

    async def turn_of_sent(self, channel: str, chat_id: str | int,
                           external_message_id: str | int) -> int | None:
        """The turn (its inbound event's id) whose reply holds the piece the service calls
        `external_message_id` in `chat_id`, or in a sub-chat of it (a Telegram forum topic,
        keyed "chat/topic": a reaction names only the chat); None for anything else (a reply to
        a command, a message not ours). Every piece of a long reply names its turn."""
        chat = str(chat_id)
        out = OutboundMessageRow
        query = (select(out.inbound_event_id)
                 .where(out.channel == channel, out.external_message_id == str(external_message_id),
                        out.inbound_event_id.is_not(None), out.conversation_id.is_not(None),
                        or_(out.chat_id == chat, out.chat_id.startswith(chat + "/", autoescape=True)))
                 .order_by(out.id.desc()).limit(1))
        async with self.transaction() as session:
            return await session.scalar(query)

    async def last_answered_turn(self, channel: str, chat_id: str | int, user: str) -> int | None:
        """The turn of `user`'s whose reply was the last one delivered in this chat (a model's
        answer, not a command's); None when there is none."""
        out, inbound = OutboundMessageRow, InboundEventRow
        query = (select(out.inbound_event_id)
                 .join(inbound, inbound.id == out.inbound_event_id)
                 .where(out.channel == channel, out.chat_id == str(chat_id),
                        out.status == OutboundStatus.SENT, out.conversation_id.is_not(None),
                        inbound.user == user)
                 .order_by(out.id.desc()).limit(1))
        async with self.transaction() as session:
            return await session.scalar(query)

    async def previous_inbound(self, user: str, chat_id: str | int,
                               before_id: int) -> InboundEvent | None:
        """`user`'s message in this chat just before inbound event `before_id`, or None."""
        query = (select(InboundEventRow)
                 .where(InboundEventRow.user == user, InboundEventRow.chat_id == str(chat_id),
                        InboundEventRow.id < before_id)
                 .order_by(InboundEventRow.id.desc()).limit(1))
        async with self.transaction() as session:
            row = await session.scalar(query)
            return None if row is None else to_record(InboundEvent, row)
