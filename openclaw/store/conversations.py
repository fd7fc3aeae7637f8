"""Conversations (one active per user and chat; /new archives it), their messages in the order
they were added, and the summaries that compact their older turns (agent.context)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import NOT_DONE, StoreBase, insert_record, loop_first, loop_insert, to_record
from openclaw.store.loop_writer import LoopWriter
from openclaw.store.models import AuditRow, ConversationRow, MessageRow, SummaryRow
from openclaw.store.records import (
    Conversation,
    ConversationStatus,
    Message,
    MessageRole,
    Summary,
    parse_user_key,
)
from openclaw.store.usage import audit_values, insert_audit
from openclaw.store.users import require_user


def _add_message_on_loop(store: StoreBase, writer: LoopWriter, conversation_id: int,
                         role: MessageRole | str, content: str, tool_calls: Any | None = None,
                         tool_call_id: str | None = None, token_count: int | None = None,
                         prompt_version: str | None = None,
                         audit: dict[str, Any] | None = None) -> Message:
    """add_message's statements on the loop's writer (base.loop_first)."""
    done = _add_messages_on_loop(store, writer, conversation_id, [dict(
        role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id,
        token_count=token_count, prompt_version=prompt_version)], audit)
    return done if done is NOT_DONE else done[0]


def _add_messages_on_loop(store: StoreBase, writer: LoopWriter, conversation_id: int,
                          messages: list[dict[str, Any]],
                          audit: dict[str, Any] | None = None) -> list[Message]:
    """add_messages' statements on the loop's writer (base.loop_first): the audit row and the
    messages in one transaction; the foreign key still refuses an unknown conversation (then the
    ordinary path runs and says so)."""
    now = store.now()
    rows = []
    for message in messages:
        try:
            rows.append(_message_values(conversation_id, now, **message))
        except (ValueError, TypeError):
            return NOT_DONE
    steps = [loop_insert(writer, MessageRow, values) for values in rows]
    if audit is not None:
        steps.insert(0, loop_insert(writer, AuditRow, audit_values(at=now, **audit)))
    done = writer.write(steps)
    if done is None:
        return NOT_DONE
    return [Message(id=lastrowid, **values)
            for values, (_count, lastrowid) in zip(rows, done[len(done) - len(rows):], strict=True)]


def _message_values(conversation_id: int, now: Any, role: MessageRole | str, content: str,
                    tool_calls: Any | None = None, tool_call_id: str | None = None,
                    token_count: int | None = None,
                    prompt_version: str | None = None) -> dict[str, Any]:
    """A message row's values (a role it does not know: ValueError)."""
    return dict(conversation_id=conversation_id, role=MessageRole(role), content=content,
                tool_calls=tool_calls, tool_call_id=tool_call_id, token_count=token_count,
                created_at=now, prompt_version=prompt_version)


@functools.cache
def _token_count() -> Any:
    """set_token_count's UPDATE, built once."""
    table = MessageRow.__table__
    return (update(table).where(table.c.id == bindparam("message_id"))
            .values(token_count=bindparam("tokens")))


def _set_token_count_on_loop(store: StoreBase, writer: LoopWriter, message_id: int,
                             tokens: int) -> None:
    """No row changed (no such message): the ordinary path says so."""
    done = writer.write([(writer.prepare("token_count", _token_count),
                          {"message_id": message_id, "tokens": tokens})])
    return None if done is not None and done[0][0] == 1 else NOT_DONE


class ConversationStore(StoreBase):
    """The Store's conversations, messages and summaries."""

    # -- conversations -------------------------------------------------------------------------

    async def active_conversation(self, user: str, chat_id: str | int,
                                  channel: str | None = None) -> Conversation:
        """The user's active conversation in this chat, started if there is none.

        `channel` defaults to the user's own channel (the part of the key before ':').
        """
        chat_id = str(chat_id)
        channel = channel or parse_user_key(user)[0]

        async def op(session: AsyncSession) -> Conversation:
            owner = await require_user(session, user)
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
            return to_record(Conversation, row)

        return await self.retrying(op)

    async def get_conversation(self, conversation_id: int) -> Conversation | None:
        async with self.transaction() as session:
            row = await session.get(ConversationRow, conversation_id)
            return None if row is None else to_record(Conversation, row)

    async def archive_conversation(self, conversation_id: int) -> bool:
        """Archive it (what `/new` does); False if it was not active."""
        async with self.transaction() as session:
            now = self.now()
            result = await session.execute(
                update(ConversationRow)
                .where(ConversationRow.id == conversation_id,
                       ConversationRow.status == ConversationStatus.ACTIVE)
                .values(status=ConversationStatus.ARCHIVED, archived_at=now, updated_at=now)
                .execution_options(synchronize_session=False))
            return result.rowcount == 1

    # -- messages ------------------------------------------------------------------------------

    @loop_first(_add_message_on_loop)
    async def add_message(self, conversation_id: int, role: MessageRole | str, content: str,
                          tool_calls: Any | None = None, tool_call_id: str | None = None,
                          token_count: int | None = None,
                          prompt_version: str | None = None,
                          audit: dict[str, Any] | None = None) -> Message:
        """`audit`: a tool call's audit row (add_audit's arguments), stored in the same
        transaction as its result, this message: a crash leaves both or neither."""
        return (await self._insert_messages(conversation_id, [dict(
            role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id,
            token_count=token_count, prompt_version=prompt_version)], audit))[0]

    @loop_first(_add_messages_on_loop)
    async def add_messages(self, conversation_id: int, messages: list[dict[str, Any]],
                           audit: dict[str, Any] | None = None) -> list[Message]:
        """Several messages (each add_message's fields: role, content, tool_calls, ...), in this
        order, in one transaction with `audit`: a model step whose calls only read stored with
        its first result, say (agent.loop)."""
        return await self._insert_messages(conversation_id, messages, audit)

    async def _insert_messages(self, conversation_id: int, messages: list[dict[str, Any]],
                               audit: dict[str, Any] | None) -> list[Message]:
        now = self.now()
        rows = [_message_values(conversation_id, now, **message) for message in messages]
        try:
            async with self.transaction() as session:
                if audit is not None:
                    await insert_audit(session, at=now, **audit)
                # One INSERT a message, on the hot path of every turn; the conversation's foreign
                # key (not a separate look-up) rejects a message for a conversation that does not
                # exist.
                return [await insert_record(session, MessageRow, Message,
                                            last=i == len(rows) - 1, **values)
                        for i, values in enumerate(rows)]
        except IntegrityError as err:
            raise LookupError(f"conversation {conversation_id} does not exist; no message added") from err

    @loop_first(_set_token_count_on_loop, after_reply=True)
    async def set_token_count(self, message_id: int, tokens: int) -> None:
        """A stored message's token count, known after it was stored (the agent counts the user's
        message once the reply is out). LookupError for a message that does not exist."""
        async with self.transaction() as session:
            result = await session.execute(_token_count(), {"message_id": message_id,
                                                            "tokens": tokens})
            if result.rowcount != 1:
                raise LookupError(f"message {message_id} does not exist; no token count stored")

    async def list_messages(self, conversation_id: int, after_id: int | None = None,
                            limit: int | None = None) -> list[Message]:
        """Messages in the order they were added (by id), optionally only those after `after_id`."""
        query = select(MessageRow).where(MessageRow.conversation_id == conversation_id)
        if after_id is not None:
            query = query.where(MessageRow.id > after_id)
        query = query.order_by(MessageRow.id).limit(limit)
        async with self.transaction() as session:
            return [to_record(Message, row) for row in await session.scalars(query)]

    # -- summaries -----------------------------------------------------------------------------

    async def add_summary(self, conversation_id: int, up_to_message_id: int, content: str,
                          token_count: int) -> Summary:
        async with self.transaction() as session:
            row = SummaryRow(conversation_id=conversation_id, up_to_message_id=up_to_message_id,
                             content=content, token_count=token_count, created_at=self.now())
            session.add(row)
            await session.flush()
            return to_record(Summary, row)

    async def latest_summary(self, conversation_id: int) -> Summary | None:
        """The summary reaching furthest into the conversation."""
        query = (select(SummaryRow).where(SummaryRow.conversation_id == conversation_id)
                 .order_by(SummaryRow.up_to_message_id.desc(), SummaryRow.id.desc()).limit(1))
        async with self.transaction() as session:
            row = await session.scalar(query)
            return None if row is None else to_record(Summary, row)
