"""The `Store`: the daemon's persistent state behind one async API, one short transaction per call.

It joins the parts, one per aggregate: users and pairing codes (users.py), conversations with
their messages and summaries (conversations.py), the delivery journal of inbound and outbound
messages (journal.py), reminders (reminders.py), usage and the audit log (usage.py). What touches
all of them, a chat that moves and a user forgotten, is here. Every method returns frozen records
(records.py), never live ORM rows, so results are safe to keep after the session closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import and_, delete, func, or_, select, text, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from openclaw.store.base import Clock, calls_run_whole, insert_record, to_record
from openclaw.store.conversations import ConversationStore
from openclaw.store.engine import BUSY_TIMEOUT_MS, create_engine, sqlite_file
from openclaw.store.feedback import FeedbackStore
from openclaw.store.jobs import JobStore
from openclaw.store.journal import JournalStore
from openclaw.store.loop_writer import LoopWriter
from openclaw.store.mcp_pins import McpPinStore
from openclaw.store.memory import MemoryStore
from openclaw.store.migrate import current_revision, migrate
from openclaw.store.models import (
    AuditRow,
    ConversationRow,
    FeedbackRow,
    HeartbeatRow,
    InboundEventRow,
    JobRow,
    JobRunRow,
    MemoryRow,
    MemorySettingRow,
    MessageRow,
    OutboundMessageRow,
    PairingCodeRow,
    PairingIssuedRow,
    PairingRefusalRow,
    PromptPinRow,
    ReminderRow,
    SummaryRow,
    TraceRow,
    UsageRow,
    UserRow,
)
from openclaw.store.prompts import PromptStore
from openclaw.store.records import (
    Conversation,
    ConversationStatus,
    InboundEvent,
    InboundStatus,
    MovedChat,
    OutboundMessage,
    OutboundStatus,
    StoreUnavailableError,
    UserStatus,
    Welcome,
    parse_user_key,
    user_key,
)
from openclaw.store.reminders import ReminderStore, change_chat_reminders
from openclaw.store.traces import TraceStore
from openclaw.store.usage import UsageStore
from openclaw.store.users import UserStore


async def _loop_writer(engine: AsyncEngine) -> LoopWriter | None:
    path = sqlite_file(engine.url)
    if path is None:  # PostgreSQL, or a SQLite database in memory (one connection sees it)
        return None
    async with engine.connect():
        pass  # the first connection of the driver puts the file in WAL mode
    return LoopWriter.open(path, engine.dialect)


@calls_run_whole
class Store(UserStore, ConversationStore, JobStore, JournalStore, ReminderStore, UsageStore,
            McpPinStore, MemoryStore, FeedbackStore, TraceStore, PromptStore):
    """Open with `await Store.open(url)` (applies migrations); close with `await store.close()`.
    Each public coroutine method runs whole (base.run_whole): a cancel reaches its caller only
    once the call has committed or rolled back."""

    @classmethod
    async def open(cls, url: str | URL, *, migrate_schema: bool = True, clock: Clock | None = None,
                   busy_timeout_ms: int = BUSY_TIMEOUT_MS, echo: bool = False,
                   loop_writes: bool = False) -> Store:
        """`loop_writes`: on a SQLite file, the turn's own writes run on the event loop's thread
        (loop_writer.py), as the daemon opens it; otherwise every call runs on the driver's
        thread (the CLI's short commands gain nothing from a second connection)."""
        engine = None
        try:
            engine = create_engine(url, busy_timeout_ms=busy_timeout_ms, echo=echo)
            if migrate_schema:
                await migrate(engine)
            writer = await _loop_writer(engine) if loop_writes else None
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
        return cls(engine, clock=clock, loop_writer=writer)

    async def schema_revision(self) -> str | None:
        return await current_revision(self.engine)

    # -- a chat that moves ---------------------------------------------------------------------

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
        async with self.transaction() as session:
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
            reminders = await change_chat_reminders(session, channel, old, {"chat_id": new})
            return MovedChat([to_record(Conversation, row) for row in conversations],
                             [to_record(OutboundMessage, row) for row in outbound], reminders)

    # -- a stranger let in ----------------------------------------------------------------------

    async def take_welcomes(self, greeting: Callable[[bool], str]) -> list[Welcome]:
        """Each stranger approved since the last call (by whichever process), taken once: in one
        transaction `greeting(kept)` is stored for the outbox in the chat they asked from and the
        message kept with their code becomes an inbound event to answer, so a crash loses
        neither and a second call takes neither again."""
        async with self.transaction() as session:
            now = self.now()
            approved = (await session.execute(
                select(PairingCodeRow.id, PairingCodeRow.code, PairingCodeRow.chat_id,
                       PairingCodeRow.message, UserRow.channel, UserRow.external_id,
                       UserRow.display_name)
                .join(UserRow, PairingCodeRow.user_id == UserRow.id)
                .where(PairingCodeRow.chat_id.is_not(None), PairingCodeRow.used_at.is_not(None),
                       UserRow.status == UserStatus.ALLOWED)
                .order_by(PairingCodeRow.id))).all()
            welcomes = []
            for code_id, code, chat_id, message, channel, external_id, name in approved:
                await session.execute(update(PairingCodeRow).where(PairingCodeRow.id == code_id)
                                      .values(chat_id=None, message=None)
                                      .execution_options(synchronize_session=False))
                await self._add_outbound(session, channel, chat_id, [greeting(bool(message))],
                                         None, None)
                event = None if not message else await insert_record(
                    session, InboundEventRow, InboundEvent, channel=channel,
                    # Unique among the channel's message ids, which are the service's numbers.
                    message_id=f"pairing-{code}-{int(now.timestamp())}",
                    user=user_key(channel, external_id), chat_id=chat_id, text=message,
                    payload={"display_name": name, "attachments": [], "notice": None,
                             "is_group": False},
                    status=InboundStatus.RECEIVED, error=None, received_at=now, processed_at=None)
                welcomes.append(Welcome(channel, chat_id, event))
            return welcomes

    # -- forgetting a user ---------------------------------------------------------------------

    # What a forgotten user's audit rows say instead of their arguments and detail.
    FORGOTTEN_AUDIT_DETAIL = "arguments and detail removed by `openclaw users forget`"

    async def forget_user(self, user: str, *, dry_run: bool = False) -> dict[str, int]:
        """Delete everything stored about `user`, in one transaction, and say how many rows of
        each kind went (with `dry_run`, how many would; nothing changes): their conversations
        with their messages and summaries, their inbound messages, the replies of those
        conversations, to those messages and to their own chat (pairing codes were sent there),
        their grades of replies (and others' grades of their replies), their reminders, heartbeat
        (its checklist is their words), scheduled jobs and their runs, pairing codes (and the
        counts and refusals of them), usage, traces and prompt pins, and their users row, so they
        are unknown again.
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
            "feedback": (FeedbackRow, or_(FeedbackRow.user == user,
                                          FeedbackRow.inbound_event_id.in_(inbound)), None),
            "inbound messages": (InboundEventRow, InboundEventRow.user == user, None),
            "reminders": (ReminderRow, ReminderRow.user == user, None),
            "heartbeats": (HeartbeatRow, HeartbeatRow.user == user, None),
            "job runs": (JobRunRow, JobRunRow.job_id.in_(
                select(JobRow.id).where(JobRow.user == user)), None),
            "jobs": (JobRow, JobRow.user == user, None),
            "memory entries": (MemoryRow, MemoryRow.user == user, None),
            "memory settings": (MemorySettingRow, MemorySettingRow.user == user, None),
            "usage rows": (UsageRow, UsageRow.user == user, None),
            "pairing codes": (PairingCodeRow, PairingCodeRow.user_id.in_(user_id), None),
            "pairing codes counted": (PairingIssuedRow, PairingIssuedRow.user == user, None),
            "pairing refusals": (PairingRefusalRow, PairingRefusalRow.user == user, None),
            "prompt pins": (PromptPinRow, PromptPinRow.user == user, None),
            "traces": (TraceRow, or_(TraceRow.user == user,
                                     TraceRow.conversation_id.in_(conversations)), None),
            "conversations": (ConversationRow, ConversationRow.user_id.in_(user_id), None),
            "users": (UserRow, is_user, None),
            "audit rows blanked": (AuditRow, and_(AuditRow.user == user, or_(
                AuditRow.arguments.is_not(None),
                AuditRow.detail.is_distinct_from(self.FORGOTTEN_AUDIT_DETAIL))), blanked),
        }
        counts: dict[str, int] = {}
        sqlite = self.dialect == "sqlite"
        async with self.transaction() as session:
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
            async with self.transaction() as session:
                # The memory index keeps a deleted entry's words in its older segments until
                # they merge: merged now, their pages freed (and zeroed) like the rows'.
                await session.execute(text(
                    "INSERT INTO memories_fts(memories_fts) VALUES ('optimize')"))
            async with self.transaction() as session:
                await session.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        return counts
