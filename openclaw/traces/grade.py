"""The grade of a traced turn, by its outcome: what `openclaw traces export --grade` filters on
and `openclaw prompts report` counts.

"bad" if the user graded it bad or retried it, the turn failed, or its last tool call failed (the
answer rests on an error); else "good" if the user graded it good; else "unrated".
"""

from __future__ import annotations

from collections.abc import Iterable

from openclaw.feedback import feedback_of
from openclaw.store import Store
from openclaw.store.trace_records import Trace, TraceStatus

GOOD, BAD, UNRATED = "good", "bad", "unrated"
GRADES = (GOOD, BAD, UNRATED)
BAD_KINDS = frozenset({"bad", "retry"})  # feedback kinds that make a turn bad


def grade(status: TraceStatus | str, last_tool_failed: bool, kinds: Iterable[str]) -> str:
    """The grade of a turn that ended with `status`, given the kinds of feedback it got."""
    kinds = set(kinds)
    if kinds & BAD_KINDS or status == TraceStatus.FAILED or last_tool_failed:
        return BAD
    return GOOD if GOOD in kinds else UNRATED


async def grades(store: Store, traces: Iterable[Trace]) -> dict[int, str]:
    """Each trace's grade, by trace id: one look-up of the feedback for all of them."""
    traces = list(traces)
    feedback = await feedback_of(
        store, [t.inbound_event_id for t in traces if t.inbound_event_id is not None])
    return {t.id: grade(t.status, t.last_tool_failed, feedback.get(t.inbound_event_id, ()))
            for t in traces}
