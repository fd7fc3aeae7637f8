"""Taking up a turn that an earlier run of the daemon began and never answered (it crashed, or its
stop could not wait), from what that run stored of it.

Running such a turn again from the start would call its tools again (a mail sent twice), and its
running call, left bare, reads "not run" in the prompt (agent.context), false after a crash, where
it may have done its work (a stop stores STOPPED_CALL for it). So the turn goes on from its stored
steps, and the call that may have been running gets a result that says what is known.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from openclaw.agent.context import ContextBuilder
from openclaw.agent.loop import STOPPED_CALL, UNREADABLE_CALL
from sandbox.policy import Principal
from skills import Executor

log = logging.getLogger(__name__)

# The result a call gets when the daemon stopped before it ended, by whether the user must approve
# the skill: then calling it again is safe (they are asked again).
INTERRUPTED = {
    False: "error: interrupted: I restarted while this call was running, so it may have done its "
           "work, wholly or partly; its output is lost. Check whether it did before doing it again.",
    True: "error: interrupted: I restarted before this call ended: it was waiting for the user's "
          "approval, or had been approved and may have run, wholly or partly. If it is still "
          "needed, call it again: the user is asked to approve it again.",
}
INTERRUPTED_AUDIT = {
    False: "the daemon stopped before this call ended (a crash, or a stop that could not wait); "
           "it may have run, wholly or partly. Recorded at the next start.",
    True: "the daemon stopped before this call ended (a crash, or a stop that could not wait), "
          "while it waited for approval or ran after it. Recorded at the next start.",
}


@dataclass(frozen=True)
class TakenUp:
    """A turn an earlier run began: its message as stored, and its answer when that run had it
    and only the reply was not stored."""

    text: str
    answer: str | None = None
    # The stored message's id where its token count is not stored yet (a run that ended before
    # its reply: Agent.count_later stores it once this turn's reply is out).
    uncounted_id: int | None = None


async def take_up(context: ContextBuilder, executor: Executor, principal: Principal,
                  conversation_id: int, is_message: Callable[[str], bool],
                  received_at: datetime) -> TakenUp | None:
    """The turn of the message received at `received_at`, as an earlier run stored it; None when
    it stored nothing (the turn starts afresh). `is_message`: whether a stored user text is that
    message as a turn stores it (with the note on its files, which are then not fetched again).

    With the model's final answer stored (a crash between it and the reply), that answer. Else the
    one call that may have been running gets INTERRUPTED, and the audit row its end would have
    written (a call's row is stored with its result, so an ended call whose result is missing
    has no row yet)."""
    _, history = await context.history(conversation_id)
    starts = [i for i, m in enumerate(history) if m.role == "user"]
    # This message's turn stored it after it came: an equal one stored before (a repeated "yes")
    # is another's, already answered. (Two equal ones both waiting behind a third turn remain
    # alike: the second may be sent the first's answer again.)
    if not starts or history[starts[-1]].created_at < received_at \
            or not is_message(text := history[starts[-1]].content):
        return None
    uncounted = history[starts[-1]].id if history[starts[-1]].token_count is None else None
    steps = history[starts[-1] + 1:]
    # This turn's steps: model steps with calls (or with only malformed ones: their errors follow
    # as tool messages) and the calls' results, maybe the final answer last.
    for i, m in enumerate(steps[:-1]):
        if m.role != "tool" and not (m.role == "assistant"
                                     and (m.tool_calls or steps[i + 1].role == "tool")):
            return None
    last = steps[-1] if steps else None
    if last is not None and last.role == "assistant" and not last.tool_calls:
        # The final answer. (Not when empty: a reply the model spoilt with a malformed call is
        # stored so too, its error right after; running the turn again is the lesser harm.)
        return TakenUp(text, last.content if last.content.strip() else None,
                       uncounted_id=uncounted)
    at = max((i for i, m in enumerate(steps) if m.role == "assistant"), default=None)
    if at is None or not steps[at].tool_calls:
        return TakenUp(text, uncounted_id=uncounted)
    calling = steps[at]  # the latest model step: only its calls can lack a result
    results = {m.tool_call_id: m.content for m in steps[at + 1:] if m.role == "tool"}
    # Its calls ran one at a time, in order, each result stored as it ended (one a stop cut short
    # too: STOPPED_CALL). So only the first call without a result can have begun, and not after a
    # stopped one; the later ones stay bare, which the prompt shows as "not run" (agent.context).
    if STOPPED_CALL in results.values():
        return TakenUp(text, uncounted_id=uncounted)
    call = next((c for c in calling.tool_calls if c.get("id") and c["id"] not in results
                 and c["function"]["name"] != UNREADABLE_CALL), None)  # which never runs
    if call is None:
        return TakenUp(text, uncounted_id=uncounted)
    name = call["function"]["name"]
    asked = principal.needs_approval(name)
    log.warning("%s: the %s call %s of conversation %d did not end before the daemon stopped; "
                "the model is told it may have run", principal.user, name, call["id"],
                conversation_id)
    # The executor writes a call's row as the call ends, which a crash never reaches.
    await executor.record_interrupted(principal, name, _arguments(call), INTERRUPTED_AUDIT[asked])
    await context.add(conversation_id, "tool", INTERRUPTED[asked], tool_call_id=call["id"])
    return TakenUp(text, uncounted_id=uncounted)


def _arguments(call: dict) -> Any:
    """A stored call's arguments: the JSON object the model wrote, or its text if it was not one."""
    arguments = call["function"].get("arguments") or "{}"
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments
