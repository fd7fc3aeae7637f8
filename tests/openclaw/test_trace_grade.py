"""The grade of a traced turn: bad on bad feedback, a retry, a failed turn or a failed last tool
call; good on good feedback only; unrated otherwise."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from openclaw.store import Store, UserStatus
from openclaw.traces.grade import grade, grades


@pytest.mark.parametrize(("status", "last_tool_failed", "kinds", "expected"), [
    ("answered", False, [], "unrated"),
    ("answered", False, ["good"], "good"),
    ("answered", False, ["good", "good"], "good"),
    ("answered", False, ["bad"], "bad"),
    ("answered", False, ["good", "bad"], "bad"),  # one bad is enough
    ("answered", False, ["retry"], "bad"),
    ("answered", False, ["good", "retry"], "bad"),
    ("failed", False, ["good"], "bad"),
    ("answered", True, ["good"], "bad"),  # the answer rests on a failed call
    ("answered", True, [], "bad"),
    ("stopped", False, [], "unrated"),
    ("stopped", False, ["good"], "good"),
])
def test_grade_of_a_turn(status, last_tool_failed, kinds, expected):
    assert grade(status, last_tool_failed, kinds) == expected


async def test_grades_read_each_turns_feedback(tmp_path: Path):
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db'}") as store:
        await store.ensure_user("telegram", "1", status=UserStatus.ALLOWED)
        conv = await store.active_conversation("telegram:1", "1", "telegram")
        ids = []
        for n, kind in enumerate(["good", "bad", None]):
            event, _ = await store.record_inbound("telegram", n, "telegram:1", "1", "hi")
            if kind is not None:
                await store.grade("telegram:1", event.id, kind, "command")
            ids.append(await store.add_trace(
                user="telegram:1", conversation_id=conv.id, status="answered",
                started_at=datetime.now(UTC), inbound_event_id=event.id))
        job_turn = await store.add_trace(user="telegram:1", conversation_id=conv.id,
                                         status="answered", started_at=datetime.now(UTC))
        graded = await grades(store, await store.list_traces())
        assert [graded[i] for i in [*ids, job_turn]] == ["good", "bad", "unrated", "unrated"]
