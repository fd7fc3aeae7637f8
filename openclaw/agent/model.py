"""The model interface the agent needs, whatever runs the model: the engine in this process or an
OpenAI-compatible server (openclaw/backends); tests use a scripted stand-in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from engine import SamplingParams


@dataclass
class ModelOutput:
    """One step of a model call's stream. Tool calls are in the text, in the Hermes form
    (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) that engine.tool_parser reads:
    one way in for every backend (see openclaw/backends/openai.py)."""

    delta_text: str  # new since the previous step
    text: str  # all so far
    prompt_tokens: int  # the prompt's tokens
    completion_tokens: int  # tokens generated so far
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"


class ModelUnavailable(Exception):
    """The model cannot answer now: its server is unreachable, or refused past the retries, or
    went silent. Not the turn's fault: the turn waits and is taken up again when it is back."""


class ChatModel(Protocol):
    max_model_len: int  # the model's context, in tokens
    # Whether count_chat gives the same count for the same messages at every call (a tokenizer:
    # the engine's, a server's /tokenize, a local copy), so the agent may keep counts per message
    # (agent.counting); False, or absent, for an estimate that changes: prompts counted whole.
    fixed_counts: bool
    # Whether it runs requests by their `priority` itself (the engine); False, or absent: the
    # daemon queues background requests behind chat ones (scheduler/priority_gate.py).
    orders_by_priority: bool

    def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                 request_id: str | None = None, *, tools: list[dict] | None = None,
                 priority: int = 0, cache_salt: str | None = None,
                 tool_instructions: str | None = None) -> AsyncIterator[ModelOutput]:
        """Stream the answer to the chat `prompt`. Leaving the loop early (or cancelling) aborts
        the request. `cache_salt`: the user's; prefix caches are shared only within it.
        `tool_instructions`: the template of the tools' section of the system prompt, `{tools}`
        where their JSON lines go (engine.chat.BUILTIN_TOOL_INSTRUCTIONS is the built-in one);
        None: the built-in one. A server other than `openclaw serve` renders its own."""

    async def abort(self, request_id: str) -> None: ...

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None,
                         tool_instructions: str | None = None) -> int:
        """The tokens of the prompt these messages (and tools, under `tool_instructions`) make,
        as the model counts them."""

    # Optional: count_message(message, after) -> int | None, what count_chat([after, message])
    # minus count_chat([after]) gives, cheaper (the engine's encodes the message alone); None
    # where it has none now. The agent counts a new message with it (agent.counting).
    # Optional: bound_message(message, after) -> int | None, at least what count_message gives,
    # without encoding; the agent sums these while a prompt is well within its budget, and counts
    # the messages only when the bounds no longer fit (agent.context).

    def stats(self) -> dict[str, Any]:
        """For /status and /metrics: `model`, `device`, and the engine's counters."""
