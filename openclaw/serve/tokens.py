"""POST /tokenize and /detokenize, in vLLM's shapes: a completion's prompt or a chat's messages
(with tools) counted exactly as the generating endpoints would encode them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from openclaw.serve.errors import bad_request
from openclaw.serve.protocol import DetokenizeRequest, TokenizeRequest, read
from openclaw.serve.state import STATE, ServeState

if TYPE_CHECKING:
    from engine.engine_core import LLMEngine


async def tokenize(request: web.Request) -> web.Response:
    body = await read(request, TokenizeRequest)
    state, engine = with_tokenizer(request, body.model)
    if body.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []] or None
        try:
            ids = engine.chat_formatter.encode([m.engine_dict() for m in body.messages], tools,
                                               add_generation_prompt=body.add_generation_prompt,
                                               tool_instructions=body.tool_instructions)
        except ValueError as exc:
            raise bad_request(f"messages: {exc}", "messages") from None
    elif body.add_special_tokens is False:
        ids = engine.tokenizer.encode(body.prompt or "", allow_special=True)
    else:  # what /v1/completions sends the model: with BOS where the model wants one
        ids = engine.tokenizer.encode_prompt(body.prompt or "")
    out = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = engine.tokenizer.convert_ids_to_tokens(ids)
    return web.json_response(out)


async def detokenize(request: web.Request) -> web.Response:
    body = await read(request, DetokenizeRequest)
    _, engine = with_tokenizer(request, body.model)
    vocab = engine.model_config.vocab_size
    for k, token in enumerate(body.tokens):
        if not 0 <= token < vocab:
            raise bad_request(f"tokens[{k}]: {token} is outside the vocabulary [0, {vocab})",
                              f"tokens[{k}]")
    # Special tokens kept: detokenize(tokenize(x)) gives x back, scaffolding included.
    return web.json_response({"prompt": engine.tokenizer.decode(body.tokens,
                                                                skip_special_tokens=False)})


def with_tokenizer(request: web.Request, model: str | None) -> tuple[ServeState, LLMEngine]:
    state = request.app[STATE]
    state.check_model(model)
    if state.llm.engine.tokenizer is None:
        raise bad_request("this model folder has no tokenizer.json: it takes token ids only")
    return state, state.llm.engine
