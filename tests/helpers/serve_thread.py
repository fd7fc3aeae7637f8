"""`openclaw serve`'s API in a thread of its own, on a free loopback port: the tests call it with
the official `openai` client from the test's thread, as any client would."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import openai

from openclaw.config.sections import ServeConfig
from openclaw.serve import APIServer


class ServerThread:
    def __init__(self, llm, *, max_waiting: int | None = None, **config: Any) -> None:
        self.llm = llm
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="api-server", daemon=True)
        self.thread.start()
        extra = {} if max_waiting is None else {"max_waiting": max_waiting}
        self.server = APIServer(llm, ServeConfig.model_validate({"port": 0, **config}), **extra)
        self.call(self.server.start())
        self.key = self.server.state.api_key

    @property
    def url(self) -> str:
        return self.server.url

    def call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def client(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", self.key or "-"),
                             max_retries=0, timeout=120, **kw)

    def async_client(self, **kw: Any) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=self.key or "-",
                                  max_retries=0, timeout=120, **kw)

    def wait_idle(self, timeout: float = 30) -> None:
        """Until the engine runs nothing and every KV block is free again (cached or not)."""
        bm = self.llm.engine.block_manager
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (not self.llm.engine.has_unfinished_requests() and bm.num_free_blocks == bm.num_blocks
                    and self.server.state.in_flight == 0):
                return
            time.sleep(0.01)
        raise AssertionError(f"the engine is still busy: {self.llm.stats()}, "
                             f"{bm.num_free_blocks}/{bm.num_blocks} blocks free, "
                             f"{self.server.state.in_flight} in flight")

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
