"""Feedback on our replies, the grades issue 29's traces are sorted by: what a user's 👍 / 👎,
/good / /bad, repeated message or "that's wrong" means, and the grades each turn got.

A grade is for one turn (its inbound event), the one whose reply it reacts to; the store keeps
one per grader, turn and source (openclaw/store/feedback.py). The gateway's side (reactions,
the commands, the check of each new message) is openclaw/gateway/feedback.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from openclaw.store import Store


async def feedback_of(store: Store, inbound_event_ids: Iterable[int]) -> dict[int, list[str]]:
    """The kinds of grade ("good", "bad", "retry") each turn got, oldest first; a turn with
    none is left out."""
    return await store.feedback_kinds(inbound_event_ids)
