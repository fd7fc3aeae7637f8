"""POST /v1/chat/completions: messages through the model's chat template and the engine's safe
encoding, tool calls constrained by the engine per tool_choice and parsed from the output, JSON
output per response_format, logprobs; whole or streamed as OpenAI's chunks."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from engine.tool_parser import StreamingToolParser, ToolCall, parse_tool_calls
from openclaw.serve.errors import bad_request
from openclaw.serve.generation import Job, check_context, finish_reason, stop_reason
from openclaw.serve.logprobs import chat_content
from openclaw.serve.protocol import ChatCompletionRequest, read
from openclaw.serve.reply import Reply
from openclaw.serve.state import STATE, ServeState


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await read(request, ChatCompletionRequest)
    state.check_model(body.model)
    tools = body.engine_tools()
    try:
        prompt = state.llm.encode_chat([m.engine_dict() for m in body.messages], tools,
                                       body.tool_instructions)
    except ValueError as exc:  # a template that refuses the conversation, a bad tool call in it
        raise bad_request(f"messages: {exc}", "messages") from None
    check_context(state, len(prompt), body.max_new_tokens, "messages", body.max_tokens_field)
    extra = {"tool_choice": body.engine_tool_choice(),
             "parallel_tool_calls": body.parallel_tool_calls, "logprobs": body.engine_logprobs,
             "structured_outputs": body.structured_outputs()}
    jobs = [Job(prompt, body.sampling_params(body.max_new_tokens, i, **extra))
            for i in range(body.n)]
    if body.logprobs:
        await state.token_texts.load()
    reply = ChatReply(state, body, len(prompt), parse_calls=tools is not None)
    return await reply.answer(request, jobs, tools)


class ChatReply(Reply):
    id_prefix = "chatcmpl"
    chunk_object = "chat.completion.chunk"
    body: ChatCompletionRequest

    def __init__(self, state: ServeState, body: ChatCompletionRequest, prompt_tokens: int, *,
                 parse_calls: bool) -> None:
        super().__init__(state, body, prompt_tokens, body.n)
        self.parse_calls = parse_calls
        self.parsers = [StreamingToolParser() if parse_calls else None for _ in range(body.n)]
        # A stream's logprobs not sent yet: they go with the next content, or the finish chunk.
        self.pending: list[list[dict[str, Any]]] = [[] for _ in range(body.n)]

    def calls(self, text: str) -> tuple[str, list[ToolCall]]:
        """The content and the tool calls of an output. A call cut short (max_tokens) cannot be
        read and is left out: finish_reason "length" says the answer was cut."""
        if not self.parse_calls:
            return text, []
        parsed = parse_tool_calls(text)
        return parsed.content, self.allowed(parsed.tool_calls)

    def allowed(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls if self.body.parallel_tool_calls else calls[:1]

    def whole(self) -> dict[str, Any]:
        choices = []
        for i, out in enumerate(self.finals):
            content, calls = self.calls(out.text)
            message: dict[str, Any] = {"role": "assistant",
                                       "content": content or (None if calls else "")}
            if calls:
                message["tool_calls"] = [tool_call(c) for c in calls]
            choices.append({"index": i, "message": message, "logprobs": self.logprobs(out.logprobs),
                            "finish_reason": finish_reason(out, bool(calls)),
                            "stop_reason": stop_reason(out, self.body.stop_token_ids)})
        return {"id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.model, "choices": choices, "usage": self.usage()}

    def logprobs(self, entries: list | None) -> dict[str, Any] | None:
        if not self.body.logprobs:
            return None
        return {"content": chat_content(self.state.token_texts, entries or [])}

    def delta(self, index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        """A chunk of choice `index`; the logprobs pending go with it when it has content or ends
        the choice."""
        logprobs = None
        if self.body.logprobs and (delta.get("content") or finish):
            logprobs, self.pending[index] = {"content": self.pending[index]}, []
        return self.chunk([{"index": index, "delta": delta, "logprobs": logprobs,
                            "finish_reason": finish}])

    def opening(self) -> list[bytes]:
        return [self.delta(i, {"role": "assistant", "content": ""}) for i in range(self.body.n)]

    async def write(self, response: web.StreamResponse, i: int, out: Any) -> None:
        """Content as it comes, held back only while it could still open a tool call; each call
        whole once the output ends; then a chunk with the choice's finish_reason."""
        parser = self.parsers[i]
        if self.body.logprobs:
            self.pending[i] += chat_content(self.state.token_texts, out.delta_logprobs)
        text = parser.feed(out.delta_text) if parser else out.delta_text
        if text:
            await response.write(self.delta(i, {"content": text}))
        if not out.finished:
            return
        self.finals[i] = out
        calls: list[ToolCall] = []
        if parser is not None:
            parsed = parser.finish()
            rest = parsed.content[len(parser.shown):]
            if rest:
                await response.write(self.delta(i, {"content": rest}))
            calls = self.allowed(parsed.tool_calls)
            if calls:
                await response.write(self.delta(i, {"tool_calls": [
                    {"index": k, **tool_call(c)} for k, c in enumerate(calls)]}))
        await response.write(self.delta(i, {}, finish_reason(out, bool(calls))))


def tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name,
                         "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
