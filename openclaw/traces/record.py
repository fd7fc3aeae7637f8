"""Recording a turn's trace: one store call after the reply is handed to the outbox (the user
never waits for it), and never a reason for the turn to fail."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from openclaw.agent import Agent, TurnResult
from openclaw.store import Store
from openclaw.store.trace_records import TraceStatus

log = logging.getLogger(__name__)


def sampling_of(agent: Agent) -> dict[str, Any]:
    """The sampling the turn's replies were made with ([agent.sampling] and its limits)."""
    settings = agent.settings
    return {"chat": settings.sampling.chat.model_dump(),
            "tool_arguments": settings.sampling.tool_arguments.model_dump(),
            "max_tokens": settings.reply_max_tokens,
            "tool_call_threshold": settings.tool_call_threshold or None}


def model_name(agent: Agent) -> str:
    try:
        return str(agent.model.stats().get("model") or "")
    except Exception:  # a model that cannot say (a test's stand-in): the trace has no name
        return ""


def status_of(result: TurnResult) -> TraceStatus:
    return TraceStatus.FAILED if result.failed else TraceStatus.ANSWERED


async def record_turn(store: Store, agent: Agent, *, user: str, conversation_id: int,
                      result: TurnResult, status: TraceStatus, started_at: datetime,
                      duration_s: float, inbound_event_id: int | None = None,
                      with_usage: bool = False) -> bool:
    """Store the trace of a turn that ran (nothing for a user who is private: see add_trace);
    `with_usage`: the tokens it spent in the same transaction. Whether that was stored (False:
    the model never ran, or the store failed; the caller writes the usage alone). A store error
    is logged, not raised: the reply is out, and the turn must end as it did."""
    if result.steps == 0 and result.last_message_id is None:  # the model never ran
        return False
    usage = (result.prompt_tokens, result.completion_tokens) if with_usage else None
    try:
        await store.add_trace(
            user=user, conversation_id=conversation_id, status=status, started_at=started_at,
            inbound_event_id=inbound_event_id, first_message_id=result.first_message_id,
            last_message_id=result.last_message_id,
            prompt_version=result.prompt_version,
            model=model_name(agent), sampling=sampling_of(agent),
            duration_ms=round(duration_s * 1000), first_token_ms=result.first_token_ms,
            steps=result.steps, tool_calls=result.tool_calls, tool_errors=result.tool_errors,
            last_tool_failed=result.last_tool_failed, reply_chars=len(result.text), usage=usage)
    except Exception:
        log.warning("the trace of a turn of %s was not stored", user, exc_info=True)
        return False
    return True
