"""The model the agent talks to (openclaw/agent/model.py:ChatModel): the engine in this process
(local.py), or any OpenAI-compatible server (openai.py). `open_backend` makes the one `[engine]`
names."""

from __future__ import annotations

import asyncio
from typing import Protocol

from engine.config import EngineConfig
from openclaw.agent.model import ChatModel
from openclaw.backends.http import shown_url
from openclaw.config import EngineSection


class Backend(ChatModel, Protocol):
    """A model the daemon made, and so closes."""

    async def close(self) -> None: ...


async def open_backend(config: EngineSection, stopping: asyncio.Event | None = None) -> Backend:
    """The backend `[engine]` names, ready: the model loaded, or the server's model and context
    length known (waited for until `stopping` is set; then ModelUnavailable). ValueError (and the
    engine's file errors) for what the config must fix."""
    if isinstance(config, EngineConfig):
        from openclaw.backends.local import LocalBackend

        return await LocalBackend.load(config)
    from openclaw.backends.openai import OpenAIBackend

    return await OpenAIBackend.open(config, stopping)


__all__ = ["Backend", "open_backend", "shown_url"]
