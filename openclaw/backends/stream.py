"""A streamed chat completion, as OpenAI-compatible servers send it: server-sent events, each a
`chat.completion.chunk` (content and tool-call deltas, a finish reason, maybe the usage), then
`data: [DONE]`; and the chunks put together as the agent reads a model's output.

Tool calls come back as the Hermes text the agent's parser reads (`<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`), not as structured calls beside the text: the agent then has one
way in for calls, whichever backend and however the server sent them. A server that puts the call
in `content` (Ollama and others do) needs nothing more; one that sends `tool_calls` deltas has them
rendered so; and the parser's tolerance and its errors (sent back to the model) apply to both."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from openclaw.backends.http import one_line, without_echo

DONE = "[DONE]"


class StreamError(RuntimeError):
    """An error the server sent inside the stream (`data: {"error": {...}}`)."""


class Deadline:
    """When the next token must have come: first the first-token limit, then, from each token
    on, the idle limit."""

    def __init__(self, first_token: float, idle: float) -> None:
        loop = asyncio.get_running_loop()
        self.idle, self.loop = idle, loop
        self.at = loop.time() + first_token
        self.started = False  # a token has come

    def token(self) -> None:
        self.started = True
        self.at = self.loop.time() + self.idle


async def events(answer: aiohttp.ClientResponse, deadline: Deadline) -> AsyncIterator[dict]:
    """The JSON payload of each event of an SSE answer, until `[DONE]` or the end of the body.
    TimeoutError when `deadline.at` passes with nothing read. Lines are split here, not by
    readline, which refuses a line over 64 KiB (a whole tool call can be longer). A server that
    ignores `"stream": true` and sends one JSON completion gives it as one chunk."""
    if answer.content_type == "application/json":
        async with asyncio.timeout_at(deadline.at):
            body = await answer.read()
        yield as_chunk(_decode(body.decode("utf-8", "replace")))
        return
    buffer, data = b"", []
    while True:
        async with asyncio.timeout_at(deadline.at):
            chunk = await answer.content.readany()
        if not chunk:  # the end of the body: a last event without its blank line still counts
            if data and (payload := "\n".join(data)) != DONE:
                yield _decode(payload)
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if line:
                if line.startswith("data:"):
                    data.append(line[6:] if line.startswith("data: ") else line[5:])
                continue  # a comment (":"), event:, id: or retry: line
            if not data:
                continue
            payload, data = "\n".join(data), []
            if payload.strip() == DONE:
                return
            yield _decode(payload)


def _decode(payload: str) -> dict:
    try:
        event = json.loads(payload)
    except ValueError as exc:
        raise StreamError(f"a stream event is not JSON ({exc}): {payload[:200]!r}") from None
    if not isinstance(event, dict):
        raise StreamError(f"a stream event is not a JSON object: {payload[:200]!r}")
    if event.get("error"):
        error = without_echo(event["error"])
        message = error.get("message", error) if isinstance(error, dict) else error
        raise StreamError(one_line(message if isinstance(message, str) else json.dumps(message)))
    return event


def as_chunk(completion: dict) -> dict:
    """A whole `chat.completion` in the shape of one `chat.completion.chunk`: each choice's
    message is its delta."""
    choices = [{"index": c.get("index", 0), "delta": c.get("message") or {},
                "finish_reason": c.get("finish_reason")}
               for c in completion.get("choices") or [] if isinstance(c, dict)]
    return {**completion, "choices": choices}


@dataclass
class Completion:
    """A chat completion put together from its chunks (the first choice's; we ask for one)."""

    text: str = ""
    calls: dict[int, list[str]] = field(default_factory=dict)  # index -> [name, arguments]
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    tokens: int = 0  # chunks that carried a token: the count until the usage comes

    def add(self, chunk: dict) -> tuple[str, bool]:
        """Take one chunk: (the content it adds, whether it carried a token at all: content,
        reasoning or a tool call's piece)."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        content, token = "", False
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                content += delta["content"]
                token = True
            if delta.get("reasoning_content") or delta.get("reasoning"):
                token = True  # thinking is not shown, but it is the model at work
            for position, call in enumerate(delta.get("tool_calls") or []):
                self._add_call(position, call)
                token = True
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        self.text += content
        self.tokens += token
        return content, token

    def _add_call(self, position: int, call: Any) -> None:
        if not isinstance(call, dict):
            return
        index = call.get("index", position)
        entry = self.calls.setdefault(index if isinstance(index, int) else position, ["", ""])
        function = call.get("function") or {}
        if isinstance(function.get("name"), str) and not entry[0]:
            entry[0] = function["name"]  # sent once, with the call's first piece
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            entry[1] += arguments
        elif isinstance(arguments, dict):  # a server that sends the object itself
            entry[1] += json.dumps(arguments, ensure_ascii=False)

    def calls_text(self) -> str:
        """The structured calls as Hermes blocks, in their order. Arguments that are not a JSON
        object stay a string, which the parser reports back to the model as malformed."""
        blocks = []
        for index in sorted(self.calls):
            name, arguments = self.calls[index]
            value: Any = arguments
            if not arguments.strip():
                value = {}
            else:
                try:
                    value = json.loads(arguments)
                except ValueError:
                    pass
                if not isinstance(value, dict):
                    value = arguments
            blocks.append("<tool_call>" + json.dumps({"name": name, "arguments": value},
                                                     ensure_ascii=False) + "</tool_call>")
        return "".join(blocks)

    @property
    def ended(self) -> bool:
        """Whether the server said the answer was complete (a finish reason)."""
        return self.finish_reason is not None

    @property
    def reason(self) -> str:
        """The finish reason in the engine's words: a call ends an answer as a stop does."""
        return "length" if self.finish_reason == "length" else "stop"
