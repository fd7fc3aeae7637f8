"""POST /v1/completions: raw prompts (text or token ids, one or a batch), whole or streamed."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from openclaw.serve.errors import bad_request
from openclaw.serve.generation import Job, check_context, finish_reason, stop_reason
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
    jobs = [Job(ids, body.sampling_params(body.max_tokens, i)) for ids in prompts
            for i in range(body.n)]
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

    def whole(self) -> dict[str, Any]:
        stops = self.body.stop_token_ids
        choices = [{"index": i, "text": out.text, "logprobs": None,
                    "finish_reason": finish_reason(out), "stop_reason": stop_reason(out, stops)}
                   for i, out in enumerate(self.finals)]
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices, "usage": self.usage()}

    async def write(self, response: web.StreamResponse, i: int, out: Any) -> None:
        finish = None
        if out.finished:
            self.finals[i] = out
            finish = finish_reason(out)
        if out.delta_text or finish:
            await response.write(self.chunk([{
                "index": i, "text": out.delta_text, "logprobs": None, "finish_reason": finish,
                "stop_reason": stop_reason(out, self.body.stop_token_ids) if finish else None}]))
