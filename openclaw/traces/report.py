"""`openclaw prompts report`'s numbers: the traced turns grouped by the version of one prompt
(the label's "system=v3" -> "v3"), and per variant how they went: graded good and bad, the
success rate good / (good + bad) with its Wilson 95% interval, the tool calls that succeeded,
steps, the share of turns the user retried or called wrong, reply length and latency."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from openclaw.prompts.labels import parse_label
from openclaw.store import Store
from openclaw.store.feedback_records import FeedbackSource
from openclaw.store.trace_records import Trace
from openclaw.traces.grade import BAD, GOOD, grades

UNLABELLED = "(none)"  # turns from before the prompt library, or without this prompt's version
Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval


def variant_of(label: str, name: str) -> str:
    """The version of prompt `name` in a trace's label ("system=v3;tools=v1", "system" -> "v3");
    UNLABELLED for a label from before the library, or one that is not a label."""
    try:
        return parse_label(label).get(name, UNLABELLED)
    except ValueError:
        return UNLABELLED


def wilson(successes: int, total: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a success rate; None without any trial."""
    if total == 0:
        return None
    p = successes / total
    centre = p + z * z / (2 * total)
    spread = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total))
    scale = 1 + z * z / total
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def percentile(values: list[int], share: float) -> int | None:
    """The nearest-rank percentile: the smallest value with at least `share` of them at or
    below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


@dataclass(frozen=True)
class VariantStats:
    variant: str
    turns: int
    good: int
    bad: int
    success: float | None  # good / (good + bad); None when none is rated
    interval: tuple[float, float] | None  # Wilson 95%
    tool_success: float | None  # 1 - tool errors / tool calls; None without calls
    mean_steps: float
    retried_share: float  # turns the user repeated or said were wrong
    mean_reply_chars: float
    p50_ms: int | None
    p90_ms: int | None


def summarize(traces: Iterable[Trace], graded: dict[int, str], retried: set[int],
              name: str) -> list[VariantStats]:
    """Per variant of prompt `name` (sorted by variant): `graded` is each trace's grade by id,
    `retried` the inbound event ids of turns the user repeated or called wrong."""
    groups: dict[str, list[Trace]] = {}
    for trace in traces:
        groups.setdefault(variant_of(trace.prompt_version, name), []).append(trace)
    out = []
    for variant, those in sorted(groups.items()):
        good = sum(graded[t.id] == GOOD for t in those)
        bad = sum(graded[t.id] == BAD for t in those)
        calls = sum(t.tool_calls for t in those)
        n = len(those)
        out.append(VariantStats(
            variant=variant, turns=n, good=good, bad=bad,
            success=good / (good + bad) if good + bad else None, interval=wilson(good, good + bad),
            tool_success=1 - sum(t.tool_errors for t in those) / calls if calls else None,
            mean_steps=sum(t.steps for t in those) / n,
            retried_share=sum(t.inbound_event_id in retried for t in those) / n,
            mean_reply_chars=sum(t.reply_chars for t in those) / n,
            p50_ms=percentile([t.duration_ms for t in those], 0.5),
            p90_ms=percentile([t.duration_ms for t in those], 0.9)))
    return out


async def report(store: Store, name: str, since: datetime | None = None,
                 until: datetime | None = None) -> list[VariantStats]:
    """The report of prompt `name` over the traces started in [since, until) (a private user's
    left out, as from the export)."""
    traces = await store.list_traces(since, until)
    graded = await grades(store, traces)
    events = {t.inbound_event_id for t in traces if t.inbound_event_id is not None}
    # A repeated message and "that's wrong" are the feedback the user typed as text.
    retried = {f.inbound_event_id for f in await store.list_feedback()
               if f.source == FeedbackSource.TEXT and f.inbound_event_id in events}
    return summarize(traces, graded, retried, name)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def table(stats: list[VariantStats], name: str) -> str:
    """The report as a plain-text table, one row per variant."""
    if not stats:
        return f"no traced turns for prompt {name!r} in this period"
    header = ("variant", "turns", "good", "bad", "success", "95% CI", "tools ok", "steps",
              "retried", "reply chars", "p50 ms", "p90 ms")
    rows = [header]
    for s in stats:
        ci = "-" if s.interval is None else f"{100 * s.interval[0]:.0f}-{100 * s.interval[1]:.0f}%"
        rows.append((s.variant, str(s.turns), str(s.good), str(s.bad), _share(s.success), ci,
                     _share(s.tool_success), f"{s.mean_steps:.2f}", _share(s.retried_share),
                     f"{s.mean_reply_chars:.0f}", "-" if s.p50_ms is None else str(s.p50_ms),
                     "-" if s.p90_ms is None else str(s.p90_ms)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    return f"prompt {name!r}, per variant:\n" + "\n".join(lines)
