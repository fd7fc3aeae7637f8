"""The untrusted sources a conversation's earlier turns left in its prompt are kept between
turns (agent.untrusted.EarlierSources): a turn reads only the messages added since the last one,
and reads all again when the history or the skills are new."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from openclaw.agent.untrusted import EarlierSources
from openclaw.store.records import Message
from skills.base import Skill, SkillContext
from skills.registry import SkillRegistry


class Reader(Skill):
    name = "reader"
    description = "Test only: reads a file."
    untrusted_output = True

    def __init__(self) -> None:
        self.asked = 0

    def untrusted_source(self, args: dict[str, Any]) -> str | None:
        self.asked += 1
        return super().untrusted_source(args)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        return "text"


def _call(number: int) -> list[Message]:
    at = datetime.now(UTC)
    call = {"id": f"c{number}", "type": "function",
            "function": {"name": "reader", "arguments": "{}"}}
    return [Message(2 * number, 1, "assistant", "", [call], None, 0, at),
            Message(2 * number + 1, 1, "tool", "text", None, f"c{number}", 0, at)]


def test_a_turn_reads_only_the_messages_added_since_the_last():
    reader, registry = Reader(), SkillRegistry()
    registry.add(reader, "test")
    history = [m for n in range(200) for m in _call(n)]
    earlier = EarlierSources()
    assert earlier.of(1, history, registry) == ["reader output"]
    assert reader.asked == 200
    history += _call(200)
    assert earlier.of(1, history, registry) == ["reader output"]
    assert reader.asked == 201


def test_a_history_read_again_or_new_skills_are_read_whole():
    reader, registry = Reader(), SkillRegistry()
    registry.add(reader, "test")
    history = [m for n in range(10) for m in _call(n)]
    earlier = EarlierSources()
    earlier.of(1, history, registry)
    assert earlier.of(1, list(history[4:]), registry) == ["reader output"]  # re-read, compacted
    assert reader.asked == 18
    reloaded = SkillRegistry()  # the skill is no longer enabled: its results count as output
    assert earlier.of(1, history[4:], reloaded) == ["reader output"]
    assert reader.asked == 18
    assert earlier.of(1, [], registry) == []  # a new conversation after /new holds nothing
