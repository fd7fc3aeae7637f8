"""POST /v1/completions: raw prompts (text or token ids, one or a batch), whole or streamed, with
logprobs in the legacy shape."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from openclaw.serve.errors import bad_request
from openclaw.serve.generation import Job, check_context, finish_reason, stop_reason
from openclaw.serve.logprobs import CompletionLogprobs
from openclaw.serve.protocol import CompletionRequest, Prompt, read
from openclaw.serve.reply import Reply
from openclaw.serve.state import STATE, ServeState


async def completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    body = await read(request, CompletionRequest)
    state.check_model(body.model)
    prompts = [encode(state, p, k) for k, p in enumerate(body.prompts())]
    for ids in prompts:
        check_context(state, len(ids), body.max_tokens, "prompt")
    # Choice p * n + i is the i-th answer to prompt p, as OpenAI numbers them.
    jobs = [Job(ids, body.sampling_params(body.max_tokens, i, logprobs=body.logprobs))
            for ids in prompts for i in range(body.n)]
    if body.logprobs is not None:
        await state.token_texts.load()
    reply = CompletionReply(state, body, sum(len(ids) for ids in prompts), len(jobs))
    return await reply.answer(request, jobs)


def encode(state: ServeState, prompt: Prompt, index: int) -> list[int]:
    """A prompt's token ids, as the engine would take them; a 400 naming the prompt if it
    cannot be."""
    param = "prompt" if index == 0 else f"prompt[{index}]"
    try:
        return state.llm.engine.encode_prompt(prompt)
    except ValueError as exc:  # empty, ids outside the vocabulary, no tokenizer for text
        raise bad_request(f"{param}: {exc}", param) from None


class CompletionReply(Reply):
    id_prefix = "cmpl"
    chunk_object = "text_completion"
    body: CompletionRequest

    def __init__(self, state: ServeState, body: CompletionRequest, prompt_tokens: int,
                 choices: int) -> None:
        super().__init__(state, body, prompt_tokens, choices)
        # Per choice: its logprobs so far, for the offsets of a stream's next tokens.
        self.logprobs = [CompletionLogprobs(state.token_texts, body.skip_special_tokens)
                         if body.logprobs is not None else None for _ in range(choices)]

    def whole(self) -> dict[str, Any]:
        stops = self.body.stop_token_ids
        choices = [{"index": i, "text": out.text, "logprobs": self.logprobs_of(i, out.logprobs),
                    "finish_reason": finish_reason(out), "stop_reason": stop_reason(out, stops)}
                   for i, out in enumerate(self.finals)]
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices, "usage": self.usage()}

    async def write(self, response: web.StreamResponse, i: int, out: Any) -> None:
        finish = None
        if out.finished:
            self.finals[i] = out
            finish = finish_reason(out)
        if out.delta_text or finish or out.delta_logprobs:
            await response.write(self.chunk([{
                "index": i, "text": out.delta_text,
                "logprobs": self.logprobs_of(i, out.delta_logprobs), "finish_reason": finish,
                "stop_reason": stop_reason(out, self.body.stop_token_ids) if finish else None}]))

    def logprobs_of(self, index: int, entries: list | None) -> dict[str, list] | None:
        builder = self.logprobs[index]
        return None if builder is None else builder.add(entries or [])
