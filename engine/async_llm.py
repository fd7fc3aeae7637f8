"""`AsyncLLM`: the engine for asyncio programs. One worker thread runs the step loop; requests
and aborts reach it through a queue, outputs come back to each caller's event loop as a stream."""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from engine.config import EngineConfig, engine_config
from engine.engine_core import LLMEngine, Prompt
from engine.llm import offered_tools, to_chat_response
from engine.outputs import ChatResponse, RequestOutput
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The step loop failed; in-flight requests were ended with this error."""


class AsyncLLM:
    def __init__(self, model: str | EngineConfig | None = None, **kwargs: Any) -> None:
        self.engine = LLMEngine(engine_config(model, kwargs))
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        # Worker thread only: the stream each engine request was added for. A request id may be
        # reused once its stream is gone, while the old request's abort is still queued: outputs
        # and aborts go by this owner, so the old request never reaches the new stream.
        self._owners: dict[str, asyncio.Queue] = {}
        self._ids = itertools.count()
        self._stats: dict[str, Any] = self.engine.stats()
        self._thread = threading.Thread(target=self._loop, name="engine-step-loop", daemon=True)
        self._closed = False
        self._thread.start()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def running(self) -> bool:
        """Whether the step loop serves requests: not shut down, and its thread alive."""
        return not self._closed and self._thread.is_alive()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    tool_instructions: str | None = None) -> list[int]:
        """The exact prompt ids a chat would use: for token budgets counted by our tokenizer."""
        return self.engine.encode_chat(messages, tools, tool_instructions)

    def count_message(self, message: dict, after: dict) -> int:
        """len(encode_chat([after, message])) - len(encode_chat([after])), fast (LLMEngine)."""
        return self.engine.count_message(message, after)

    def bound_message(self, message: dict, after: dict) -> int | None:
        """At least count_message, without encoding (LLMEngine); None where none is had."""
        return self.engine.bound_message(message, after)

    async def generate(
        self,
        prompt: Prompt | list[dict],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        tools: list[dict] | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        tool_instructions: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs (each with the new delta_text) until one has finished=True.
        `prompt` is text, token ids, or chat messages. Leaving the loop early aborts the request.
        `tools`: shown to the model in a chat prompt, and its calls constrained per
        `params.tool_choice` ("auto" by default; "none" shows no tools and constrains nothing).
        `cache_salt`: the prefix cache serves this request only blocks cached under the same salt.
        `tool_instructions`: the template of a chat prompt's tools section (engine.chat); None:
        the built-in one."""
        if self._closed:
            raise EngineDeadError("the engine is shut down")
        arrival = time.monotonic()  # TTFT counts the wait for the worker thread too
        params = params or SamplingParams()
        tools = offered_tools(tools, params)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = self.engine.encode_chat(prompt, tools, tool_instructions)
        elif tool_instructions is not None:
            raise ValueError("tool_instructions applies to chat messages only, not to a prompt "
                             "given as text or token ids")
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"request id {rid!r} is already in use")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), stream)
        self._commands.put(("add", rid, stream, prompt, params, priority, tools, cache_salt,
                            arrival))
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(rid, None)
            if not finished:
                self._commands.put(("abort", rid, stream))

    async def chat(self, messages: list[dict], params: SamplingParams | None = None,
                   tools: list[dict] | None = None, request_id: str | None = None,
                   priority: int = 0, cache_salt: str | None = None,
                   tool_instructions: str | None = None) -> ChatResponse:
        final = None
        async for out in self.generate(messages, params, request_id, tools=tools,
                                       priority=priority, cache_salt=cache_salt,
                                       tool_instructions=tool_instructions):
            final = out
        assert final is not None
        return to_chat_response(final)

    async def abort(self, request_id: str) -> None:
        """End a request; its stream receives a final output with finish_reason "abort"."""
        self._commands.put(("abort", request_id, None))

    def stats(self) -> dict[str, Any]:
        """The engine's counters as of the last step (safe to call from any thread); the keys of
        LLMEngine.stats()."""
        return copy.deepcopy(self._stats)

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._commands.put(("stop",))
            self._thread.join(timeout=30)

    # ---- the worker thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            try:
                cmd = self._commands.get(block=not busy)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd[0] == "stop":
                    self._fail_all(EngineDeadError("the engine was shut down"))
                    return
                self._handle(cmd)
                try:
                    cmd = self._commands.get_nowait()
                except queue.Empty:
                    cmd = None
            if not self.engine.has_unfinished_requests():
                self._stats = self.engine.stats()  # an abort ran no step: the counts changed
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # keep serving: end the in-flight requests with the error
                log.exception("engine step failed")
                self._fail_all(EngineDeadError(f"engine step failed: {exc}"))
                continue
            self._stats = self.engine.stats()
            for out in outputs:
                owner = (self._owners.pop if out.finished else self._owners.get)(out.request_id, None)
                self._deliver(out.request_id, out, owner)

    def _handle(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, stream, prompt, params, priority, tools, cache_salt, arrival = cmd
            target = self._streams.get(rid)
            if target is None or target[1] is not stream:  # its caller already left: no work
                return
            try:
                self.engine.add_request(rid, prompt, params, priority, tools=tools,
                                        cache_salt=cache_salt, arrival_time=arrival)
            except Exception as exc:
                self._deliver(rid, exc, stream)
                return
            self._owners[rid] = stream
        elif cmd[0] == "abort":
            _, rid, stream = cmd
            # A stream's own abort ends only the request added for it: by now the id may be
            # finished, or in use by a newer stream (None: AsyncLLM.abort, whoever holds the id).
            if stream is not None and self._owners.get(rid) is not stream:
                return
            owner = self._owners.pop(rid, None)
            out = self.engine.abort_request(rid)
            if out is not None:
                self._deliver(rid, out, owner)

    def _fail_all(self, exc: BaseException) -> None:
        for rid in list(self.engine._requests):
            self.engine.abort_request(rid)
        self._owners.clear()
        for rid, (_, stream) in list(self._streams.items()):
            self._deliver(rid, exc, stream)

    def _deliver(self, rid: str, item: RequestOutput | BaseException,
                 stream: asyncio.Queue | None) -> None:
        """Put `item` on `stream`, if that is still the stream listening under `rid`."""
        target = self._streams.get(rid)
        if target is None or stream is None or target[1] is not stream:
            return
        try:
            target[0].call_soon_threadsafe(stream.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed
            self._streams.pop(rid, None)
