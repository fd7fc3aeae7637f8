"""A local fake of an OpenAI-compatible model server (vLLM's paths and shapes), speaking the real
wire protocol, for driving the daemon's OpenAI backend in tests.

`GET /v1/models` lists the model with its `max_model_len` (left out when None, as Ollama does);
`POST /tokenize` counts chat messages as vLLM does (`{"count", "max_model_len", "tokens"}`), or
answers 404 with `tokenize = False`; `GET /metrics` serves the Prometheus text set in `metrics`;
`POST /v1/chat/completions` streams server-sent events: a first chunk with the role,
`chat.completion.chunk`s with content or tool-call deltas (the call's id, type and name in its
first piece, then its arguments in pieces), a last chunk with the finish reason, the usage chunk
(`choices: []`) when asked with `stream_options.include_usage`, then `data: [DONE]`. Errors are
OpenAI's `{"error": {"message", "type", "param", "code"}}`.

Scripted per test: `reply` maps each chat request's body to a `Reply` (or a string of content);
`replies(...)` makes one that answers in order. A Reply can call tools (structured, or as text in
`content` the way Ollama answers), wait before its first token or between chunks, answer an
error status (with a body of its own, `error_body`: FastAPI's 422...), break the connection or
go silent after some chunks. `stop()` and `start()` on the same port make the server go away and
come back. It records each request (`chats`, `counts`,
their headers), each it refused (`refused`) and each stream the client closed before its end
(`disconnects`).

`strict` makes it refuse a chat request with a field OpenAI's own API does not know (vLLM's
`cache_salt`, `top_k`...), in one of the shapes strict servers answer: "openai" (400, the fields
listed in the message, as OpenAI's API and Azure's say), "param" (400 naming the first in
`param`, OpenAI's newer shape) or "fastapi" (422 with pydantic's `detail`, as FastAPI servers
with extra="forbid" say). `unsupported` names fields refused as OpenAI's reasoning models refuse
`max_tokens`. `strict_tool_ids` makes it refuse (400) a request with a tool message that does
not answer, by its `tool_call_id`, a call of an assistant message before it, as vLLM does with
some chat templates and OpenAI's API always does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from tests.fakes.loopback import serve

MODEL = "fake-model"
# The fields of a chat request OpenAI's own API takes; a strict fake refuses any other.
OPENAI_FIELDS = frozenset({
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key",
    "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier", "stop",
    "store", "stream", "stream_options", "temperature", "tool_choice", "tools", "top_logprobs",
    "top_p", "user", "verbosity", "web_search_options"})


@dataclass
class Reply:
    """One answer of /v1/chat/completions."""

    content: str = ""
    # Structured calls: (name, arguments), the arguments an object or the raw string to send.
    tool_calls: list[tuple[str, dict | str]] = field(default_factory=list)
    chunk: int = 4  # characters of content (or of a call's arguments) per chunk
    first_delay: float = 0.0  # seconds before the first token
    delay: float = 0.0  # seconds between chunks
    status: int = 200  # else an error answer, with `error` as its message
    error: str = "the fake was told to fail"
    error_body: dict | None = None  # sent as the error answer's whole body, not OpenAI's shape
    retry_after: str | None = None
    cut_after: int | None = None  # the connection breaks after this many token chunks
    silent_after: int | None = None  # then nothing more is sent (the connection stays open)
    error_after: int | None = None  # then an error event (`error` its message), and the end
    usage: tuple[int, int] | None = None  # (prompt, completion) tokens; None: counted here
    cached_tokens: int | None = None  # the usage's prompt_tokens_details.cached_tokens
    finish_reason: str | None = None  # None: "tool_calls" with calls, else "stop"


def replies(*items: Reply | str, then: Callable[[dict], Reply | str] | None = None):
    """A `reply` that answers with `items` in order, then with `then` (or repeats the last)."""
    queue = list(items)

    def reply(body: dict) -> Reply | str:
        if queue:
            return queue.pop(0) if len(queue) > 1 or then is not None else queue[0]
        assert then is not None
        return then(body)
    return reply


def count_tokens(messages: list[dict], tools: list[dict] | None = None) -> int:
    """The fake's tokenizer: one token per word of each message, 4 per message, 20 per tool."""
    words = sum(len(str(m.get("content") or "").split()) + 4 for m in messages)
    return words + (20 * len(tools) if tools else 0)


class FakeOpenAI:
    def __init__(self, *, model: str = MODEL, max_model_len: int | None = 4096,
                 api_key: str | None = None) -> None:
        self.model, self.max_model_len, self.api_key = model, max_model_len, api_key
        self.tokenize = True
        self.strict: str | None = None  # "openai", "param" or "fastapi": see the module's doc
        self.ignores_stream = False  # answer one JSON completion whatever "stream" says
        self.unsupported: set[str] = set()
        self.strict_tool_ids = False
        self.refused: list[dict] = []  # chat requests refused for their fields or tool messages
        self.metrics: str | None = None  # the Prometheus text of /metrics; None: 404
        self.reply: Callable[[dict], Reply | str] = lambda body: "hello from the fake"
        self.chats: list[dict] = []  # every chat request's body, in order
        self.chat_headers: list[dict[str, str]] = []
        self.counts: list[dict] = []  # every /tokenize body
        self.tokens_sent: list[int] = []  # per chat request: the token chunks it got
        self.disconnects: list[int] = []  # chat requests (by index) the client closed early
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The API's base, as an OpenAI client (and `[engine] url`) takes it."""
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        """Listen on a free port, or on the same port again after stop()."""
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        self._runner, self.port = await serve(app, self.port)

    async def stop(self) -> None:
        """Go away: close the port and every open connection (a stream mid-answer too)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- the API --------------------------------------------------------------------------

    def _refused(self, request: web.Request) -> web.Response | None:
        given = request.headers.get("Authorization", "")
        if self.api_key and given != f"Bearer {self.api_key}":
            # The key given, whole: some servers echo it (OpenAI masks all but its end).
            return error(401, f"Incorrect API key provided: {given.removeprefix('Bearer ')}.",
                         "authentication_error")
        return None

    async def _models(self, request: web.Request) -> web.Response:
        if refused := self._refused(request):
            return refused
        entry = {"id": self.model, "object": "model", "created": int(time.time()),
                 "owned_by": "fake", "root": self.model, "parent": None}
        if self.max_model_len is not None:
            entry["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [entry]})

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.Response(text=self.metrics, content_type="text/plain")

    async def _tokenize(self, request: web.Request) -> web.Response:
        if not self.tokenize:
            return web.json_response({"detail": "Not Found"}, status=404)
        if refused := self._refused(request):
            return refused
        body = await request.json()
        self.counts.append(body)
        n = count_tokens(body.get("messages") or [], body.get("tools"))
        return web.json_response({"count": n, "max_model_len": self.max_model_len,
                                  "tokens": list(range(n)), "token_strs": None})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if refused := self._refused(request):
            return refused
        body = await request.json()
        if body.get("model") != self.model:
            return error(404, f"The model `{body.get('model')}` does not exist.",
                         "NotFoundError", param="model")
        if refused := self._refuse_fields(body) or self._refuse_tool_messages(body):
            self.refused.append(body)
            return refused
        index = len(self.chats)
        self.chats.append(body)
        self.chat_headers.append({k.title(): v for k, v in request.headers.items()})
        self.tokens_sent.append(0)
        reply = self.reply(body)
        reply = Reply(content=reply) if isinstance(reply, str) else reply
        if reply.status != 200:
            headers = {"Retry-After": reply.retry_after} if reply.retry_after else None
            if reply.error_body is not None:
                return web.json_response(reply.error_body, status=reply.status, headers=headers)
            return error(reply.status, reply.error, "ServiceUnavailableError"
                         if reply.status >= 500 else "BadRequestError", headers=headers)
        if self.ignores_stream:
            return web.json_response(whole(reply, body, self.model))
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                             "Cache-Control": "no-cache"})
        await answer.prepare(request)  # the status line goes at once, the tokens as they come
        stream = _Stream(request, answer, body, reply, self, index)
        try:
            await stream.run()
        except (ConnectionResetError, _ClientLeft):
            self.disconnects.append(index)
        except _Ended:
            pass
        return answer


    def _refuse_fields(self, body: dict) -> web.Response | None:
        unsupported = sorted(self.unsupported & body.keys())
        if unsupported:
            name = unsupported[0]
            return error(400, f"Unsupported parameter: '{name}' is not supported with this model.",
                         "invalid_request_error", param=name, code="unsupported_parameter")
        unknown = sorted(body.keys() - OPENAI_FIELDS) if self.strict else []
        if not unknown:
            return None
        if self.strict == "fastapi":
            return web.json_response({"detail": [
                {"type": "extra_forbidden", "loc": ["body", name], "msg": "Extra inputs are not "
                 "permitted", "input": body[name]} for name in unknown]}, status=422)
        if self.strict == "param":
            return error(400, f"Unknown parameter: '{unknown[0]}'.", "invalid_request_error",
                         param=unknown[0], code="unknown_parameter")
        plural = "s" if len(unknown) > 1 else ""
        return error(400, f"Unrecognized request argument{plural} supplied: {', '.join(unknown)}",
                     "invalid_request_error", code=None)

    def _refuse_tool_messages(self, body: dict) -> web.Response | None:
        if not self.strict_tool_ids:
            return None
        calls: set[str] = set()
        for n, message in enumerate(body.get("messages") or []):
            if message.get("role") == "assistant":
                calls.update(c.get("id") for c in message.get("tool_calls") or [])
            elif message.get("role") == "tool" and message.get("tool_call_id") not in calls - {None}:
                return error(400, f"messages[{n}]: a message with role 'tool' must answer a "
                             "preceding message's 'tool_calls' by its tool_call_id "
                             f"(got {message.get('tool_call_id')!r})", "BadRequestError",
                             param="messages")
        return None


class _ClientLeft(Exception):
    """The client closed the connection before the answer's end."""


class _Ended(Exception):
    """The answer ended early, as its Reply says."""


class _Stream:
    """One streamed answer, chunk by chunk as OpenAI sends them."""

    def __init__(self, request: web.Request, answer: web.StreamResponse, body: dict, reply: Reply,
                 fake: FakeOpenAI, index: int) -> None:
        self.request, self.answer, self.body, self.reply = request, answer, body, reply
        self.fake, self.index = fake, index
        self.id = f"chatcmpl-{index}"
        self.created = int(time.time())

    async def send(self, payload: dict | str) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await self.answer.write(f"data: {data}\n\n".encode())

    def chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.fake.model, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                       "finish_reason": finish_reason}]}

    async def wait(self, seconds: float) -> None:
        """Sleep, noticing a client that leaves meanwhile (a write would only find out later)."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            transport = self.request.transport
            if transport is None or transport.is_closing():
                raise _ClientLeft
            await asyncio.sleep(min(left, 0.01))

    async def token(self, delta: dict) -> None:
        sent = self.fake.tokens_sent[self.index]
        reply = self.reply
        await self.wait(reply.first_delay if sent == 0 else reply.delay)
        if reply.cut_after is not None and sent >= reply.cut_after:
            self.request.transport.close()  # the server died mid-answer
            raise _ClientLeft
        if reply.silent_after is not None and sent >= reply.silent_after:
            await self.wait(3600)
        if reply.error_after is not None and sent >= reply.error_after:
            await self.send({"error": {"message": reply.error, "type": "InternalServerError",
                                       "param": None, "code": 500}})
            raise _Ended
        await self.send(self.chunk(delta))
        self.fake.tokens_sent[self.index] += 1

    async def run(self) -> None:
        reply = self.reply
        await self.send(self.chunk({"role": "assistant", "content": ""}))
        for start in range(0, len(reply.content), reply.chunk):
            await self.token({"content": reply.content[start:start + reply.chunk]})
        for n, (name, arguments) in enumerate(reply.tool_calls):
            text = arguments if isinstance(arguments, str) else json.dumps(arguments)
            await self.token({"tool_calls": [{"index": n, "id": f"call-fake-{self.index}-{n}",
                                              "type": "function",
                                              "function": {"name": name, "arguments": ""}}]})
            for start in range(0, len(text), reply.chunk):
                await self.token({"tool_calls": [{"index": n, "function": {
                    "arguments": text[start:start + reply.chunk]}}]})
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        await self.send(self.chunk({}, finish))
        if (self.body.get("stream_options") or {}).get("include_usage"):
            prompt, completion = reply.usage or (
                count_tokens(self.body["messages"], self.body.get("tools")),
                self.fake.tokens_sent[self.index])
            usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion}
            if reply.cached_tokens is not None:
                usage["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
            await self.send({"id": self.id, "object": "chat.completion.chunk",
                             "created": self.created, "model": self.fake.model, "choices": [],
                             "usage": usage})
        await self.send("[DONE]")


def whole(reply: Reply, body: dict, model: str) -> dict:
    """`reply` as one `chat.completion`, as a server that does not stream sends it."""
    calls = [{"id": f"call-fake-{n}", "type": "function", "function": {
        "name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}
        for n, (name, arguments) in enumerate(reply.tool_calls)]
    prompt, completion = reply.usage or (count_tokens(body["messages"], body.get("tools")),
                                         len(reply.content) // 4 + len(calls))
    return {"id": "chatcmpl-fake", "object": "chat.completion", "model": model, "choices": [{
        "index": 0, "message": {"role": "assistant", "content": reply.content or None,
                                **({"tool_calls": calls} if calls else {})},
        "finish_reason": reply.finish_reason or ("tool_calls" if calls else "stop")}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion}}


_STATUS = object()  # the code is the status, as vLLM sends it


def error(status: int, message: str, kind: str, *, param: str | None = None,
          headers: dict[str, str] | None = None, code: object = _STATUS) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param,
                                         "code": status if code is _STATUS else code}},
                             status=status, headers=headers)
