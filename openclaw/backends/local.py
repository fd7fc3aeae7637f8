"""The engine in this process (engine.AsyncLLM) as the agent's model: counts with the engine's own
tokenizer, outputs in the agent's terms."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from engine import SamplingParams
from openclaw.agent.model import ModelOutput

if TYPE_CHECKING:
    from engine import AsyncLLM, EngineConfig


class LocalBackend:
    fixed_counts = True  # the engine's own tokenizer and template
    orders_by_priority = True  # the engine runs requests by their priority: no gate before it

    def __init__(self, llm: AsyncLLM) -> None:
        self.llm = llm

    @classmethod
    async def load(cls, config: EngineConfig) -> LocalBackend:
        """Load the model (in a thread: it takes seconds to minutes). The engine's errors for a
        model, device or dtype this machine cannot use pass through: FileNotFoundError,
        PermissionError, IsADirectoryError, NotADirectoryError, ValueError."""
        from engine import AsyncLLM  # here: it imports torch

        return cls(await asyncio.to_thread(AsyncLLM, config))

    @property
    def max_model_len(self) -> int:
        return self.llm.max_model_len

    async def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                       request_id: str | None = None, *, tools: list[dict] | None = None,
                       priority: int = 0, cache_salt: str | None = None,
                       tool_instructions: str | None = None) -> AsyncIterator[ModelOutput]:
        # Closed with this one, so that leaving the loop aborts the engine's request at once.
        async with aclosing(self.llm.generate(prompt, params, request_id, tools=tools,
                                              priority=priority, cache_salt=cache_salt,
                                              tool_instructions=tool_instructions)) as outs:
            async for out in outs:
                yield ModelOutput(out.delta_text, out.text, len(out.prompt_token_ids),
                                  len(out.token_ids), out.finished, out.finish_reason)

    async def abort(self, request_id: str) -> None:
        await self.llm.abort(request_id)

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None,
                         tool_instructions: str | None = None) -> int:
        # In the loop, as before: a prompt encodes in a few milliseconds.
        return len(self.llm.encode_chat(messages, tools, tool_instructions))

    def count_message(self, message: dict, after: dict) -> int:
        # The engine's: the message encoded alone where its template allows (engine.chat_count).
        return self.llm.count_message(message, after)

    def bound_message(self, message: dict, after: dict) -> int | None:
        return self.llm.bound_message(message, after)

    def stats(self) -> dict[str, Any]:
        return self.llm.stats()

    async def close(self) -> None:
        await asyncio.to_thread(self.llm.shutdown)
