"""The model interface the agent needs. engine.AsyncLLM provides it; tests use a scripted stand-in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from engine import RequestOutput, SamplingParams


class ChatModel(Protocol):
    max_model_len: int

    def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                 request_id: str | None = None, *, tools: list[dict] | None = None,
                 priority: int = 0, cache_salt: str | None = None) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]: ...

    def stats(self) -> dict[str, Any]: ...
