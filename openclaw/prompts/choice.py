"""Which version of each prompt a user's turn is answered with: the user's pin, else their A/B
variant (a stable hash of the user and the name, following the weights), else the active
version, else the config's system prompt and the engine's built-in tool template."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

from openclaw.prompts.labels import BUILTIN, CONFIG, make_label
from openclaw.store.prompts import PromptSnapshot, version_key

SYSTEM, TOOLS = "system", "tools"
PROMPT_NAMES = (SYSTEM, TOOLS)


@dataclass(frozen=True)
class PromptChoice:
    system: str  # the system prompt's text
    tools: str | None  # the tool-instruction template; None: the engine's built-in one
    versions: dict[str, str]  # {"system": "v3", "tools": "builtin"}
    label: str  # what messages.prompt_version keeps: "system=v3;tools=builtin"


class PromptSource(Protocol):
    """What `choose` reads (openclaw.store.Store has it, cached: see prompt_snapshot)."""

    async def prompt_snapshot(self) -> PromptSnapshot: ...


async def choose(store: PromptSource, user_key: str, fallback_system: str) -> PromptChoice:
    """The prompts of `user_key`'s turn; `fallback_system` (the config's [agent] system_prompt)
    where the library has no version of "system" for them."""
    return decide(await store.prompt_snapshot(), user_key, fallback_system)


def decide(snapshot: PromptSnapshot, user_key: str, fallback_system: str) -> PromptChoice:
    """`choose` on a snapshot already read."""
    texts: dict[str, str | None] = {}
    versions: dict[str, str] = {}
    for name in PROMPT_NAMES:
        version = version_for(snapshot, user_key, name)
        text = snapshot.texts.get((name, version)) if version is not None else None
        if text is None:
            version = CONFIG if name == SYSTEM else BUILTIN
        texts[name], versions[name] = text, version
    return PromptChoice(system=texts[SYSTEM] if texts[SYSTEM] is not None else fallback_system,
                        tools=texts[TOOLS], versions=versions, label=make_label(versions))


def version_for(snapshot: PromptSnapshot, user_key: str, name: str) -> str | None:
    """The library's version of `name` for this user (pin > A/B variant > active); None: none."""
    pinned = snapshot.pins.get((user_key, name))
    if pinned is not None:
        return pinned
    setting = snapshot.settings.get(name)
    if setting is None:
        return None
    if setting.variants:
        return variant(user_key, name, setting.variants)
    return setting.active


def variant(user_key: str, name: str, weights: dict[str, int]) -> str:
    """The user's variant: a point on [0, total weight) from a hash of the user and the prompt's
    name (a name's split is independent of another's), in the variants' natural order. The same
    in every process (no salted hash()); a user moves only when the weights change."""
    digest = hashlib.sha256(f"{name}\n{user_key}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") % sum(weights.values())  # 2^64: no visible bias
    for version in sorted(weights, key=version_key):
        point -= weights[version]
        if point < 0:
            return version
    raise AssertionError("unreachable: the weights are positive")
