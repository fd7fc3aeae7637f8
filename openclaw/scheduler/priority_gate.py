"""Background priority for a model this daemon does not schedule (an OpenAI-compatible server):
its requests are queued here instead. A background request (priority above 0: a scheduled agent
job, a heartbeat) starts only when no chat request is running or waiting, and one at a time; a
chat's requests pass at once. The in-process engine needs none of this: it orders requests by
priority itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from engine import SamplingParams
from openclaw.agent.model import ChatModel, ModelOutput


class PriorityGate:
    """A ChatModel in front of `model` that queues background requests behind chat ones."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.chatting = 0  # chat requests in flight
        self._quiet = asyncio.Condition()  # notified when `chatting` drops to 0
        self._background = asyncio.Lock()  # one background request at a time

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    @property
    def fixed_counts(self) -> bool:
        return getattr(self.model, "fixed_counts", False)

    async def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                       request_id: str | None = None, *, tools: list[dict] | None = None,
                       priority: int = 0, cache_salt: str | None = None,
                       tool_instructions: str | None = None) -> AsyncIterator[ModelOutput]:
        # Passed on only when set: a model need not take what it is never given.
        extra = {} if tool_instructions is None else {"tool_instructions": tool_instructions}
        stream = self.model.generate(prompt, params, request_id, tools=tools, priority=priority,
                                     cache_salt=cache_salt, **extra)
        if priority > 0:
            async with self._background:
                async with self._quiet:
                    await self._quiet.wait_for(lambda: self.chatting == 0)
                async with aclosing(stream) as outs:
                    async for out in outs:
                        yield out
            return
        self.chatting += 1
        try:
            async with aclosing(stream) as outs:
                async for out in outs:
                    yield out
        finally:
            self.chatting -= 1
            if self.chatting == 0:
                async with self._quiet:
                    self._quiet.notify_all()

    async def abort(self, request_id: str) -> None:
        await self.model.abort(request_id)

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None,
                         tool_instructions: str | None = None) -> int:
        if tool_instructions is None:
            return await self.model.count_chat(messages, tools)
        return await self.model.count_chat(messages, tools, tool_instructions)

    def count_message(self, message: dict, after: dict) -> int | None:
        count = getattr(self.model, "count_message", None)
        return count(message, after) if count is not None else None

    def bound_message(self, message: dict, after: dict) -> int | None:
        bound = getattr(self.model, "bound_message", None)
        return bound(message, after) if bound is not None else None

    def stats(self) -> dict[str, Any]:
        return self.model.stats()
