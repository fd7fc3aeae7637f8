"""Consolidation of a user's memory: the oldest unpinned entries merged by the model at background
priority, within its token budget; pinned entries never touched; a bad reply, an error or a
kill -9 during a run leaves every entry as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openclaw.config.memory import MemoryConfig
from openclaw.memory import Memory
from openclaw.memory_consolidation import BACKGROUND_PRIORITY, Consolidation
from openclaw.store import Store
from openclaw.store.memory_records import PRIVATE, MemoryKind
from tests.helpers.scripted_model import ScriptedModel

ADA = "telegram:1001"
REPO = Path(__file__).resolve().parents[2]


class PriorityModel(ScriptedModel):
    """Also records the priority each call asked for."""

    def __init__(self, reply, **kw) -> None:
        super().__init__(reply, **kw)
        self.priorities: list[int] = []

    def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                 cache_salt=None):
        self.priorities.append(priority)
        return super().generate(prompt, params, request_id, tools=tools, priority=priority,
                                cache_salt=cache_salt)


def merging(prompt: list[dict]) -> str:
    notes = prompt[-1]["content"].splitlines()
    return f"- merged {len(notes)} notes from {notes[0][2:]} to {notes[-1][2:]}"


@pytest.fixture
async def store(tmp_path):
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}") as opened:
        yield opened


async def fill(store: Store, unpinned: int, pinned: int = 2) -> None:
    for n in range(pinned):
        await store.add_memory(ADA, PRIVATE, f"pinned rule {n}", pinned=True)
    for n in range(unpinned):
        await store.add_memory(ADA, PRIVATE, f"note {n} about something")


async def test_a_run_merges_the_oldest_unpinned_at_background_priority_and_keeps_pinned(store):
    await fill(store, 30)
    model = PriorityModel(merging)
    config = MemoryConfig(consolidate_at=20)
    done = await Consolidation(store, model, config).run(ADA, PRIVATE)
    kept = await store.list_memories(ADA)
    assert [e.text for e in kept if e.pinned] == ["pinned rule 0", "pinned rule 1"]
    # 32 entries, of which 30 unpinned: the oldest 20 (past half the threshold) merged into one.
    assert done.replaced == 20 and done.made == 1
    merged = [e for e in kept if e.kind is MemoryKind.SUMMARY]
    assert [e.text for e in merged] == ["merged 20 notes from note 0 about something to note 19 "
                                        "about something"]
    assert merged[0].source.startswith("consolidated:")
    assert [e.text for e in kept if not e.pinned][:2] == ["note 20 about something",
                                                          "note 21 about something"]
    assert model.priorities and set(model.priorities) == {BACKGROUND_PRIORITY}
    assert model.cache_salts == [ADA] * len(model.priorities)


async def test_a_run_never_spends_more_than_its_budget(store):
    await fill(store, 200, pinned=0)
    model = PriorityModel(lambda prompt: "- " + "very long merged note " * 400)
    config = MemoryConfig(consolidate_at=20, consolidation_tokens=400, max_chars=20_000)
    done = await Consolidation(store, model, config).run(ADA, PRIVATE)
    assert 0 < done.spent <= 400
    assert len(model.prompts) >= 1 and done.replaced < 190  # stopped when the budget ran out


@pytest.mark.parametrize("bad", ["", "no notes at all\n" * 30, "- " + "x" * 600])
async def test_a_bad_reply_replaces_nothing(store, bad):
    await fill(store, 30)
    before = await store.list_memories(ADA)
    done = await Consolidation(store, PriorityModel(lambda prompt: bad),
                               MemoryConfig(consolidate_at=20)).run(ADA, PRIVATE)
    assert done.replaced == 0 and await store.list_memories(ADA) == before


async def test_the_daemons_memory_consolidates_in_the_background_past_the_threshold(store):
    model = PriorityModel(merging)
    config = MemoryConfig(consolidate_at=10)
    memory = Memory(store, config, Consolidation(store, model, config).run)
    for n in range(11):
        await memory.keep(ADA, PRIVATE, f"fact {n}", kind=MemoryKind.FACT)
    await memory.consolidated()
    assert await store.count_memories(ADA) == 11 - 6 + 1  # the oldest 6 merged into one


CHILD = textwrap.dedent("""
    import asyncio, sys
    from openclaw.config.memory import MemoryConfig
    from openclaw.memory_consolidation import Consolidation
    from openclaw.store import Store
    from tests.helpers.scripted_model import ScriptedModel

    class Stuck(ScriptedModel):
        async def generate(self, *args, **kwargs):
            print("generating", flush=True)  # the parent kills now
            await asyncio.Event().wait()
            yield

    async def main():
        store = await Store.open(sys.argv[1])
        await Consolidation(store, Stuck(lambda p: ""), MemoryConfig(consolidate_at=20)).run(
            "telegram:1001", "private")

    asyncio.run(main())
""")


async def test_a_kill_9_during_a_run_loses_nothing(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}"
    async with await Store.open(url) as store:
        await fill(store, 30)
        before = await store.list_memories(ADA)
    child = subprocess.Popen([sys.executable, "-c", CHILD, url], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, text=True)
    try:
        assert child.stdout.readline() == "generating\n"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    async with await Store.open(url) as store:
        assert await store.list_memories(ADA) == before
        assert len(await store.search_memories(ADA, [PRIVATE], "something", limit=50)) == 30
