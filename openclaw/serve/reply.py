"""A request's answer in OpenAI's shapes, whole or as a stream of server-sent events: `Reply`, of
which chat completions and completions each say how one output is written."""

from __future__ import annotations

import json
import time
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from aiohttp import web

from openclaw.serve.errors import APIError
from openclaw.serve.generation import Job, run_jobs, usage
from openclaw.serve.protocol import SamplingFields
from openclaw.serve.state import ServeState

if TYPE_CHECKING:
    from engine import RequestOutput

DONE = b"data: [DONE]\n\n"


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


class Reply:
    """One request's answer. Subclasses give the id's prefix and the chunks' object, and say how
    the answer reads whole (`whole`) and how one output goes into a stream (`write`)."""

    id_prefix = ""
    chunk_object = ""

    def __init__(self, state: ServeState, body: SamplingFields, prompt_tokens: int,
                 choices: int) -> None:
        self.state, self.body, self.prompt_tokens = state, body, prompt_tokens
        self.id = state.request_id(self.id_prefix)
        self.model = state.model_name
        self.created = int(time.time())
        self.finals: list[Any] = [None] * choices  # each choice's last output

    def whole(self) -> dict[str, Any]:
        raise NotImplementedError

    def opening(self) -> list[bytes]:
        """The chunks a stream starts with, before any output."""
        return []

    async def write(self, response: web.StreamResponse, index: int, out: RequestOutput) -> None:
        raise NotImplementedError

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return event({"id": self.id, "object": self.chunk_object, "created": self.created,
                      "model": self.model, "choices": choices, **extra})

    def usage(self) -> dict[str, Any]:
        return usage(self.prompt_tokens, self.finals)

    async def answer(self, request: web.Request, jobs: list[Job],
                     tools: list[dict] | None = None) -> web.StreamResponse:
        """Run `jobs` (choice i is job i) and answer with them; their sequences count against
        the queue's bound while they are in flight."""
        self.state.admit(len(jobs))
        try:
            async with aclosing(run_jobs(self.state, jobs, self.id, tools=tools,
                                         cache_salt=self.body.cache_key)) as outputs:
                if self.body.stream:
                    return await self.stream(request, outputs)
                async for i, out in outputs:
                    if out.finished:
                        self.finals[i] = out
                return web.json_response(self.whole())
        finally:
            self.state.release(len(jobs))

    async def stream(self, request: web.Request, outputs) -> web.StreamResponse:
        """The opening chunks, each output as `write` puts it, with include_usage a chunk with
        `choices: []` and the usage, then [DONE]. The first output is awaited before the headers
        go out, so that a request the engine refuses still gets its error status; an error after
        that is an error event."""
        first = await anext(outputs)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        for data in self.opening():
            await response.write(data)
        try:
            await self.write(response, *first)
            async for i, out in outputs:
                await self.write(response, i, out)
        except APIError as exc:
            await response.write(exc.sse())
        else:
            if self.body.include_usage:
                await response.write(self.chunk([], usage=self.usage()))
        await response.write(DONE)
        await response.write_eof()
        return response
