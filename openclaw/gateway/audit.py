"""The audit log as people read it: `openclaw audit` (the admin, every user) and /audit (a user,
their own last calls). Everything shown passes visible(): arguments are the model's words."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from openclaw.gateway.contract import literal_block
from openclaw.gateway.tool_lines import cut
from openclaw.store.records import AuditEntry
from skills.base import visible

ARGUMENTS_SHOWN = 60  # characters of a call's arguments in a table row
_RELATIVE = re.compile(r"^(\d+)\s*([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str, now: datetime) -> datetime:
    """`--since`: a span back from now ("30m", "12h", "7d", "2w") or a date/time ("2026-12-01",
    "2026-12-01T08:00", UTC unless it names its offset)."""
    text = text.strip()
    if match := _RELATIVE.match(text):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a span (30m, 12h, 7d, 2w) nor a date "
                         "(2026-12-01, 2026-12-01T08:00)") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def arguments_text(arguments: Any) -> str:
    """A call's arguments on one line, as shown: JSON, control characters escaped."""
    if arguments is None:
        return ""
    return visible(json.dumps(arguments, ensure_ascii=False, separators=(", ", ": ")))


def took(duration_ms: int | None) -> str:
    if duration_ms is None:
        return ""
    return f"{duration_ms} ms" if duration_ms < 1000 else f"{duration_ms / 1000:.1f} s"


def outcome_text(entry: AuditEntry) -> str:
    """How a call ended: "allowed exit 0 1.2 s", "denied"..."""
    parts = [entry.decision]
    if entry.exit_status is not None:
        parts.append(f"exit {entry.exit_status}")
    return " ".join(parts + [took(entry.duration_ms)]).rstrip()


TABLE_HEAD = f"{'when (UTC)':<16}  {'user':<24}  {'skill':<12}  {'decision':<11}  {'exit':>4}  " \
             f"{'time':>7}  arguments"


def table_row(entry: AuditEntry) -> str:
    """One row of `openclaw audit`: who, when, skill, decision, exit, duration, arguments cut."""
    exit_status = "" if entry.exit_status is None else str(entry.exit_status)
    return (f"{entry.at.astimezone(UTC):%Y-%m-%d %H:%M}  {visible(entry.user):<24}  "
            f"{visible(entry.skill):<12}  {entry.decision:<11}  {exit_status:>4}  "
            f"{took(entry.duration_ms):>7}  "
            f"{cut(arguments_text(entry.arguments), ARGUMENTS_SHOWN)}").rstrip()


def as_json(entry: AuditEntry) -> dict[str, Any]:
    """A row whole, for `--json`: arguments as stored (the audit already cut long values)."""
    return {"id": entry.id, "at": entry.at.astimezone(UTC).isoformat(), "user": entry.user,
            "skill": entry.skill, "arguments": entry.arguments, "decision": entry.decision,
            "exit_status": entry.exit_status, "duration_ms": entry.duration_ms,
            "output_bytes": entry.output_bytes, "detail": entry.detail}


def chat_lines(entries: list[AuditEntry]) -> str:
    """/audit: the user's own last calls, newest first, a line each."""
    if not entries:
        return "No tool calls of yours are on record."
    # Literal: what ran is shown as it was, never as Markdown ("**x**" bold, "||x||" hidden).
    return "Your last tool calls, newest first:\n" + literal_block("\n".join(
        f"{e.at.astimezone(UTC):%m-%d %H:%M} UTC  {visible(e.skill)} "
        f"{cut(arguments_text(e.arguments), ARGUMENTS_SHOWN)} — {outcome_text(e)}"
        for e in entries))
