"""Untrusted content in a conversation's prompt, and the approval it costs the calls that follow.

A file, a mail or a command's output may be written to steer the model ("now call shell with
..."), and the constrained decoder makes whatever call it asks for parse. So once such content is
in the prompt, a call that may act (Skill.acts) waits for the user's /approve even where the role
would let it run, and the request says why. A role opts out with approve_after_untrusted = false.
Which results are untrusted, and which calls act, each skill declares (skills.base.Skill)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sandbox.policy import Principal
from skills.executor import Approver
from skills.registry import SkillRegistry

SHOWN_SOURCES = 3  # named in a request; the rest are counted


@dataclass
class Untrusted:
    """Where the untrusted content in a turn's prompt came from, as approval requests name it."""

    earlier: list[str] = field(default_factory=list)  # results stored before this turn began
    now: list[str] = field(default_factory=list)  # results of this turn's calls

    def note(self, source: str) -> None:
        if source not in self.now:
            self.now.append(source)

    def reason(self) -> str | None:
        """Why a call that acts is asked about, as its request says it; None: nothing untrusted."""
        if self.now:
            return f"Asked because this turn read untrusted content from {_named(self.now)}."
        if self.earlier:
            return (f"Asked because this conversation holds untrusted content from "
                    f"{_named(self.earlier)} (/new starts a clean one).")
        return None


class EarlierSources:
    """The untrusted sources among a conversation's stored tool results (Message rows, its cached
    history: agent.context): a call's result is taken as its skill declares. A refusal (the call
    never ran) is not told apart from a result here, so it counts too: a file could begin with the
    same words. A skill no longer enabled counts.
    Kept between turns: only the messages added since the last look are read, so a turn's look
    does not grow with the conversation. Read afresh when the history was (re-read from the store,
    compacted) or the skills were (a reload)."""

    MAX_KEPT = 256

    def __init__(self) -> None:
        # conversation: (the history list looked at, the registry, messages read, calls, sources)
        self._kept: dict[int, tuple[list, SkillRegistry, int, dict, list[str]]] = {}

    def of(self, conversation_id: int, history: list, registry: SkillRegistry) -> list[str]:
        kept = self._kept.pop(conversation_id, None)
        if kept is None or kept[0] is not history or kept[1] is not registry:
            kept = (history, registry, 0, {}, [])
        _, _, read, calls, sources = kept
        _scan(history[read:], registry, calls, sources)
        self._kept[conversation_id] = (history, registry, len(history), calls, sources)
        if len(self._kept) > self.MAX_KEPT:
            del self._kept[next(iter(self._kept))]
        return list(sources)


def _scan(messages: Iterable[Any], registry: SkillRegistry, calls: dict[str, tuple[str, dict]],
          sources: list[str]) -> None:
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            for call in message.tool_calls:
                function = call.get("function") or {}
                calls[call.get("id") or ""] = (function.get("name", "?"),
                                               _arguments(function.get("arguments")))
        elif message.role == "tool" and message.tool_call_id in calls:
            name, args = calls[message.tool_call_id]
            skill = registry.get(name)
            source = skill.untrusted_source(args) if skill is not None else f"{name} output"
            if source is not None and source not in sources:
                sources.append(source)


def requiring_approval(principal: Principal, skill: str) -> Principal:
    """`principal` for one call that must be approved: the executor's own path (its policy, the
    request in the chat, its timeout, the audit row) then asks, as for a role's `approval`."""
    return replace(principal, role=replace(principal.role,
                                           approval=principal.role.approval | {skill}))


def explained(approver: Approver, why: str) -> Approver:
    """`approver`, with `why` as the last line of what the request shows."""
    async def approve(principal: Principal, skill: str, summary: str) -> bool:
        return await approver(principal, skill, f"{summary}\n{why}")
    return approve


def _named(sources: list[str]) -> str:
    shown = ", ".join(sources[:SHOWN_SOURCES])
    more = len(sources) - SHOWN_SOURCES
    return shown + (f" and {more} more" if more > 0 else "")


def _arguments(raw: Any) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}
