"""The traces of agent turns (one row per turn, written after its reply is handed to the outbox)
and the users' `/private` switch that keeps theirs out: a private user's turns are not traced,
and a trace of theirs from before is never listed for export."""

from __future__ import annotations

import functools
from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import (
    NOT_DONE,
    StoreBase,
    commits_next,
    insert_values,
    loop_first,
    loop_insert,
    to_record,
)
from openclaw.store.loop_writer import LoopWriter
from openclaw.store.models import MessageRow, TraceRow, UsageRow, UserRow
from openclaw.store.records import Message, MessageRole, parse_user_key, user_key
from openclaw.store.trace_records import Trace, TraceStatus


async def _is_private(session: AsyncSession, user: str) -> bool:
    channel, external_id = parse_user_key(user)
    return bool(await session.scalar(select(UserRow.private).where(
        UserRow.channel == channel, UserRow.external_id == external_id)))


@functools.cache
def _insert_once(dialect: str) -> Any:
    """The trace INSERT that stores nothing for a message traced already, built once (a
    statement made per call costs more in construction than the INSERT); values as parameters."""
    insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
    return insert(TraceRow.__table__).on_conflict_do_nothing()


def _private_query() -> Any:
    return select(UserRow.private).where(UserRow.channel == bindparam("channel"),
                                         UserRow.external_id == bindparam("external_id"))


def _last_user_message_query() -> Any:
    return select(func.max(MessageRow.id)).where(
        MessageRow.conversation_id == bindparam("conversation_id"),
        MessageRow.role == MessageRole.USER, MessageRow.id <= bindparam("last_message_id"))


def _add_trace_on_loop(store: StoreBase, writer: LoopWriter, *, user: str, conversation_id: int,
                       status: TraceStatus | str, started_at: datetime,
                       inbound_event_id: int | None = None, first_message_id: int | None = None,
                       last_message_id: int | None = None, prompt_version: str = "",
                       model: str = "", sampling: dict[str, Any] | None = None,
                       duration_ms: int = 0, first_token_ms: int | None = None, steps: int = 0,
                       tool_calls: int = 0, tool_errors: int = 0, last_tool_failed: bool = False,
                       reply_chars: int = 0, usage: tuple[int, int] | None = None) -> int | None:
    """add_trace's statements on the loop's writer (base.loop_first), in one transaction."""
    try:
        channel, external_id = parse_user_key(user)
        status = TraceStatus(status)
    except ValueError:  # the ordinary path raises it
        return NOT_DONE

    def body(execute: Any) -> int | None:
        if usage is not None:
            execute(*loop_insert(writer, UsageRow, dict(
                at=store.now(), user=user, conversation_id=conversation_id,
                prompt_tokens=usage[0], completion_tokens=usage[1])))
        private = execute(writer.prepare("private", _private_query),
                          {"channel": channel, "external_id": external_id}).fetchone()
        if private is not None and private[0]:
            return None
        first = first_message_id
        if first is None and last_message_id is not None:
            first = execute(writer.prepare("last user message", _last_user_message_query),
                            {"conversation_id": conversation_id,
                             "last_message_id": last_message_id}).fetchone()[0]
        values = _trace_values(
            inbound_event_id=inbound_event_id, user=user, conversation_id=conversation_id,
            first_message_id=first, last_message_id=last_message_id,
            prompt_version=prompt_version, model=model, sampling=sampling, started_at=started_at,
            duration_ms=duration_ms, first_token_ms=first_token_ms, steps=steps,
            tool_calls=tool_calls, tool_errors=tool_errors, last_tool_failed=last_tool_failed,
            reply_chars=reply_chars, status=status)
        cursor = execute(writer.prepare(("trace", tuple(values)), lambda: _insert_once("sqlite"),
                                        tuple(values)), values)
        return cursor.lastrowid if cursor.rowcount == 1 else None

    return writer.transaction(body)


def _trace_values(**values: Any) -> dict[str, Any]:
    """A trace row's values by column (TraceRow.user is "user_key"), its texts cut to fit."""
    values["prompt_version"] = values["prompt_version"][:160]
    values["model"] = values["model"][:256]
    columns = TraceRow.__mapper__.columns
    return {columns[key].key: value for key, value in values.items()}


class TraceStore(StoreBase):
    """The Store's traces and users' privacy switch."""

    async def set_private(self, user: str, private: bool) -> bool:
        """Turn `user`'s `/private` on or off; False when the store has no row for them."""
        channel, external_id = parse_user_key(user)
        async with self.transaction() as session:
            result = await session.execute(
                update(UserRow).where(UserRow.channel == channel,
                                      UserRow.external_id == external_id)
                .values(private=private, updated_at=self.now())
                .execution_options(synchronize_session=False))
            return result.rowcount > 0

    async def is_private(self, user: str) -> bool:
        async with self.transaction() as session:
            return await _is_private(session, user)

    async def private_users(self) -> set[str]:
        """The keys of the users who are private now."""
        async with self.transaction() as session:
            rows = await session.execute(
                select(UserRow.channel, UserRow.external_id).where(UserRow.private))
            return {user_key(channel, external_id) for channel, external_id in rows}

    @loop_first(_add_trace_on_loop)
    async def add_trace(self, *, user: str, conversation_id: int, status: TraceStatus | str,
                        started_at: datetime, inbound_event_id: int | None = None,
                        first_message_id: int | None = None, last_message_id: int | None = None,
                        prompt_version: str = "", model: str = "",
                        sampling: dict[str, Any] | None = None, duration_ms: int = 0,
                        first_token_ms: int | None = None, steps: int = 0, tool_calls: int = 0,
                        tool_errors: int = 0, last_tool_failed: bool = False,
                        reply_chars: int = 0, usage: tuple[int, int] | None = None) -> int | None:
        """Record one turn, in one transaction; its id. None, and no trace stored, when the user
        is private or the message already has a trace (a turn taken up again after a restart).
        `first_message_id` None: the conversation's last user message up to `last_message_id`
        (a turn taken up again stored its user message in the run before). `usage`: the turn's
        (prompt, completion) tokens, stored in the same transaction as `add_usage` would store
        them (stored also when no trace is), so that the turn's writes after its reply are one."""
        async with self.transaction() as session:
            if usage is not None:
                await insert_values(session, UsageRow, at=self.now(), user=user,
                                    conversation_id=conversation_id, prompt_tokens=usage[0],
                                    completion_tokens=usage[1])
            if await _is_private(session, user):
                return None
            if first_message_id is None and last_message_id is not None:
                first_message_id = await session.scalar(
                    select(func.max(MessageRow.id)).where(
                        MessageRow.conversation_id == conversation_id,
                        MessageRow.role == MessageRole.USER, MessageRow.id <= last_message_id))
            # A second trace of the message is not stored: ON CONFLICT, not a savepoint, so the
            # usage row above stays and no SAVEPOINT / RELEASE round trips are made.
            await commits_next(session)
            values = _trace_values(
                inbound_event_id=inbound_event_id, user=user,
                conversation_id=conversation_id, first_message_id=first_message_id,
                last_message_id=last_message_id, prompt_version=prompt_version,
                model=model, sampling=sampling, started_at=started_at,
                duration_ms=duration_ms, first_token_ms=first_token_ms, steps=steps,
                tool_calls=tool_calls, tool_errors=tool_errors,
                last_tool_failed=last_tool_failed, reply_chars=reply_chars,
                status=TraceStatus(status))
            result = await session.execute(_insert_once(self.dialect), values)
            if result.rowcount != 1:
                return None
            return result.inserted_primary_key[0]

    async def list_traces(self, since: datetime | None = None, until: datetime | None = None, *,
                          user: str | None = None, include_private: bool = False) -> list[Trace]:
        """Traces started in [since, until), oldest first; a private user's left out unless
        `include_private` (a report of counts, which holds none of their words)."""
        query = select(TraceRow).order_by(TraceRow.started_at, TraceRow.id)
        if since is not None:
            query = query.where(TraceRow.started_at >= since)
        if until is not None:
            query = query.where(TraceRow.started_at < until)
        if user is not None:
            query = query.where(TraceRow.user == user)
        async with self.transaction() as session:
            traces = [to_record(Trace, row) for row in await session.scalars(query)]
        if include_private or not traces:
            return traces
        private = await self.private_users()
        return [t for t in traces if t.user not in private]

    async def trace_messages(self, traces: Collection[Trace]) -> dict[int, list[Message]]:
        """Each trace's messages (by trace id), in order: one query per conversation."""
        ranges: dict[int, list[Trace]] = {}
        for trace in traces:
            if trace.first_message_id is not None and trace.last_message_id is not None:
                ranges.setdefault(trace.conversation_id, []).append(trace)
        out: dict[int, list[Message]] = {t.id: [] for t in traces}
        async with self.transaction() as session:
            for conversation_id, those in ranges.items():
                low = min(t.first_message_id for t in those)
                high = max(t.last_message_id for t in those)
                rows = await session.scalars(
                    select(MessageRow).where(MessageRow.conversation_id == conversation_id,
                                             MessageRow.id.between(low, high))
                    .order_by(MessageRow.id))
                messages = [to_record(Message, row) for row in rows]
                for trace in those:
                    out[trace.id] = [m for m in messages
                                     if trace.first_message_id <= m.id <= trace.last_message_id]
        return out
