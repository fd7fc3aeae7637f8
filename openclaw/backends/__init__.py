"""The model the agent talks to (openclaw/agent/model.py:ChatModel): the engine in this process
(local.py), or any OpenAI-compatible server (openai.py). `open_backend` makes the one `[engine]`
names."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from engine.config import EngineConfig
from openclaw.agent.model import ChatModel
from openclaw.backends.http import shown_url
from openclaw.config import EngineSection


class Backend(ChatModel, Protocol):
    """A model the daemon made, and so closes."""

    async def close(self) -> None: ...


async def open_backend(config: EngineSection, stopping: asyncio.Event | None = None,
                       data_dir: Path | None = None) -> Backend:
    """The backend `[engine]` names, ready: the model loaded, or the server's model and context
    length known (from the server, else as it said them last time, kept in `data_dir`; else
    waited for until `stopping` is set, then ModelUnavailable). ValueError (and the engine's file
    errors) for what the config must fix."""
    if isinstance(config, EngineConfig):
        from openclaw.backends.local import LocalBackend

        return await LocalBackend.load(config)
    from openclaw.backends.openai import OpenAIBackend
    from openclaw.backends.remembered import ServerMemory

    memory = ServerMemory(data_dir) if data_dir is not None else None
    return await OpenAIBackend.open(config, stopping, memory)


__all__ = ["Backend", "open_backend", "shown_url"]
