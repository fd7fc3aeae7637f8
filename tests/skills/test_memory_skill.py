"""The `memory` skill through the executor, over the daemon's Memory and a real SQLite store: it
keeps, finds, lists and forgets the caller's own entries in this chat's scope, and refuses when
it cannot tell whether the chat is a group."""

from __future__ import annotations

import pytest

from openclaw.config.memory import MemoryConfig
from openclaw.memory import Memory
from openclaw.store import Store
from sandbox.policy import Policy
from skills.builtin.memory import MemorySkill
from skills.executor import Executor
from skills.registry import SkillRegistry


@pytest.fixture
async def memory(tmp_path):
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    yield Memory(store, MemoryConfig(max_chars=40))
    await store.close()


def executor(memory, tmp_path) -> tuple[Executor, Policy]:
    registry = SkillRegistry()
    registry.add(MemorySkill(), "built-in", {})
    return Executor(registry, sandbox=None, memory=memory), Policy({}, tmp_path, lambda u: "user")


async def test_remember_recall_list_forget_in_the_callers_own_memory(memory, tmp_path):
    run, policy = executor(memory, tmp_path)
    ada, bob = policy.principal("telegram:1"), policy.principal("telegram:2")

    async def call(principal, in_group=False, chat="1", **args):
        return (await run.call("memory", args, principal, chat_id=chat, in_group=in_group)).text

    assert await call(ada, action="remember", text="Ada's otter is Pip") == \
        "Remembered as #1: Ada's otter is Pip"
    assert await call(ada, action="remember", text="ada's OTTER is pip") == \
        "Already remembered as #1: Ada's otter is Pip"
    assert "at most 40" in await call(ada, action="remember", text="x" * 41)
    assert await call(ada, action="recall", text="the otter?") == "#1 (fact) Ada's otter is Pip"
    assert await call(bob, chat="2", action="recall", text="otter") == \
        "Nothing in memory holds those words."
    assert await call(ada, in_group=True, chat="-5", action="list") == \
        "Nothing is kept in this chat's memory."
    assert "no entry #1" in await call(bob, chat="2", action="forget", number=1)
    assert await call(ada, action="forget", number=1) == "Forgot #1: Ada's otter is Pip"


async def test_without_knowing_the_chat_kind_it_refuses(memory, tmp_path):
    run, policy = executor(memory, tmp_path)
    outcome = await run.call("memory", {"action": "list"}, policy.principal("telegram:1"),
                             chat_id="1")  # in_group not said
    assert outcome.text == "error: memory needs to know which chat this is, and this call has none"


def test_remember_and_forget_act_recall_and_list_do_not():
    skill = MemorySkill()
    # After untrusted content, an acting call needs the user's approval (approve_after_untrusted):
    # a web page cannot make the model write itself a standing instruction unseen.
    assert skill.acts({"action": "remember"}) and skill.acts({"action": "forget"})
    assert not skill.acts({"action": "recall"}) and not skill.acts({"action": "list"})
