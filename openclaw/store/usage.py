"""The two logs every turn appends to: token usage (one row per model call, summed for the daily
cap and /status) and the audit log (one row per skill call: what ran, for whom, and how it ended)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import (
    NOT_DONE,
    StoreBase,
    insert_record,
    insert_values,
    loop_first,
    loop_insert,
    to_record,
)
from openclaw.store.loop_writer import LoopWriter
from openclaw.store.models import AUDIT_SKILL_CHARS, AuditRow, UsageRow
from openclaw.store.records import AuditEntry


def audit_values(*, skill: str, **values: Any) -> dict[str, Any]:
    """An audit row's values (add_audit's arguments and `at`), as stored."""
    return dict(values, skill=skill[:AUDIT_SKILL_CHARS])  # the model's to name, as long as it likes


async def insert_audit(session: AsyncSession, *, last: bool = False,
                       **values: Any) -> AuditEntry:
    """One audit row (add_audit's, or one stored with a tool call's result: add_message)."""
    return await insert_record(session, AuditRow, AuditEntry, last, **audit_values(**values))


def _add_usage_on_loop(store: StoreBase, writer: LoopWriter, user: str, prompt_tokens: int,
                       completion_tokens: int, conversation_id: int | None = None) -> None:
    """add_usage's INSERT on the loop's writer (base.loop_first)."""
    done = writer.write([loop_insert(writer, UsageRow, dict(
        at=store.now(), user=user, conversation_id=conversation_id,
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))])
    return NOT_DONE if done is None else None


class UsageStore(StoreBase):
    """The Store's usage rows and audit log."""

    # -- audit log -----------------------------------------------------------------------------

    async def add_audit(self, user: str, skill: str, arguments: Any | None, decision: str, *,
                        exit_status: int | None = None, duration_ms: int | None = None,
                        output_bytes: int | None = None, detail: str | None = None) -> AuditEntry:
        async with self.transaction() as session:
            return await insert_audit(
                session, last=True, at=self.now(), user=user, skill=skill, arguments=arguments,
                decision=decision, exit_status=exit_status, duration_ms=duration_ms,
                output_bytes=output_bytes, detail=detail)

    async def list_audit(self, limit: int = 100, user: str | None = None, *,
                         skill: str | None = None, since: datetime | None = None,
                         decision: str | None = None) -> list[AuditEntry]:
        """Newest first; each filter given narrows the rows."""
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if user is not None:
            query = query.where(AuditRow.user == user)
        if skill is not None:
            query = query.where(AuditRow.skill == skill)
        if since is not None:
            query = query.where(AuditRow.at >= since)
        if decision is not None:
            query = query.where(AuditRow.decision == decision)
        async with self.transaction() as session:
            return [to_record(AuditEntry, row) for row in await session.scalars(query)]

    # -- usage ---------------------------------------------------------------------------------

    @loop_first(_add_usage_on_loop)
    async def add_usage(self, user: str, prompt_tokens: int, completion_tokens: int,
                        conversation_id: int | None = None) -> None:
        async with self.transaction() as session:
            await insert_values(session, UsageRow, last=True, at=self.now(), user=user,
                                conversation_id=conversation_id, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens)

    async def tokens_today(self, user: str | None = None, since: datetime | None = None) -> int:
        """Prompt + completion tokens since `since` (default: today's midnight UTC), one user or all."""
        if since is None:
            since = self.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        total = UsageRow.prompt_tokens + UsageRow.completion_tokens
        query = select(func.coalesce(func.sum(total), 0)).where(UsageRow.at >= since)
        if user is not None:
            query = query.where(UsageRow.user == user)
        async with self.transaction() as session:
            return int(await session.scalar(query) or 0)
