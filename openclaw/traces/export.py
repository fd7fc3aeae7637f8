"""Traces as chat-format JSONL for supervised fine-tuning: one line per turn, its messages as the
model saw and wrote them (OpenAI-style: the system prompt, the user's message, assistant
messages with `tool_calls`, `tool` messages with their `tool_call_id`, the final reply), the
tools it was offered, and what produced it and how it was graded. Every string is redacted
(redact.py); a private user's turns are never listed (Store.list_traces)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from openclaw.store import Store
from openclaw.store.records import Message
from openclaw.store.trace_records import Trace
from openclaw.traces.grade import GRADES, grades
from openclaw.traces.redact import Redactor

ANY = "any"
GRADE_CHOICES = (*GRADES, ANY)


@dataclass
class Exported:
    """An export's lines, and how many traces of the period were left out and why."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    other_grade: int = 0
    incomplete: int = 0  # no final reply stored (a stopped turn, a failed one before its reply)


def complete(messages: list[Message]) -> bool:
    """Whether a turn's messages make a training example: its user message first, then every
    tool call answered, and a final reply without calls."""
    if not messages or messages[0].role != "user" or messages[-1].role != "assistant" \
            or messages[-1].tool_calls:
        return False
    asked = {c.get("id") for m in messages if m.role == "assistant" for c in m.tool_calls or ()}
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    return asked <= answered


def example(trace: Trace, messages: list[Message], system: str, tools: list[dict] | None,
            grade: str, redactor: Redactor) -> dict[str, Any]:
    """One JSONL line: the turn's chat, its tools and its metadata, redacted."""
    chat = [{"role": "system", "content": system}, *(m.as_chat() for m in messages)]
    line: dict[str, Any] = {"messages": chat}
    if tools:
        line["tools"] = tools
    line["metadata"] = {
        "trace_id": trace.id, "prompt_version": trace.prompt_version, "model": trace.model,
        "sampling": trace.sampling, "grade": grade, "status": str(trace.status),
        "started_at": trace.started_at.isoformat(), "duration_ms": trace.duration_ms,
        "first_token_ms": trace.first_token_ms, "steps": trace.steps,
        "tool_calls": trace.tool_calls, "tool_errors": trace.tool_errors}
    return redactor.value(line)


async def export_traces(store: Store, redactor: Redactor, *, system: Callable[[Trace], str],
                        since: datetime | None = None, until: datetime | None = None,
                        grade: str = ANY, tools: Callable[[Trace], list[dict] | None] = lambda t: None
                        ) -> Exported:
    """The export of the traces started in [since, until) with `grade` ("any": all), oldest
    first. `system`: the system prompt a trace's turn was answered with; `tools`: the tools it
    was offered (None: not known)."""
    if grade not in GRADE_CHOICES:
        raise ValueError(f"unknown grade {grade!r}: one of {', '.join(GRADE_CHOICES)}")
    traces = await store.list_traces(since, until)
    graded = await grades(store, traces)
    chosen = [t for t in traces if grade == ANY or graded[t.id] == grade]
    out = Exported(other_grade=len(traces) - len(chosen))
    messages = await store.trace_messages(chosen)
    for trace in chosen:
        if not complete(messages[trace.id]):
            out.incomplete += 1
            continue
        out.lines.append(example(trace, messages[trace.id], system(trace), tools(trace),
                                 graded[trace.id], redactor))
    return out
