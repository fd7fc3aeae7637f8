"""`LLM`: the blocking, batch-at-once API (vLLM's shape): generate() and chat()."""

from __future__ import annotations

import itertools
from typing import Any

from engine.config import EngineConfig, engine_config
from engine.engine_core import LLMEngine, Prompt
from engine.outputs import ChatResponse, RequestOutput
from engine.sampling_params import SamplingParams
from engine.tool_parser import parse_tool_calls


class LLM:
    def __init__(self, model: str | EngineConfig | None = None, **kwargs: Any) -> None:
        self.engine = LLMEngine(engine_config(model, kwargs))
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        priority: int = 0,
        tools: list[dict] | None = None,
        cache_salt: str | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion, batched; outputs in the order of `prompts`.
        `tools`: offered to every prompt; their calls are constrained per `tool_choice`.
        `cache_salt`: these prompts share cached prefixes only with requests of the same salt."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        try:
            for rid, prompt, p in zip(ids, prompts, params_list, strict=True):
                self.engine.add_request(rid, prompt, p, priority, tools=tools,
                                        cache_salt=cache_salt)
            return self._run(ids)
        except BaseException:
            for rid in ids:  # leave the engine clean for the next call
                self.engine.abort_request(rid)
            raise

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | None = None,
        tools: list[dict] | None = None,
        tool_instructions: str | None = None,
    ) -> ChatResponse | list[ChatResponse]:
        """Apply the chat template (and our tool prompt), generate, and parse tool calls.
        One conversation gives one ChatResponse; a list of conversations gives a list.
        `sampling_params.tool_choice` decides how tool calls are constrained ("none": the tools
        are not offered at all). `tool_instructions`: the template of the tools' section of the
        system prompt, `{tools}` where their JSON lines go (engine.chat); None: the built-in one."""
        single = bool(messages) and isinstance(messages[0], dict)
        convs = [messages] if single else messages
        tools = offered_tools(tools, sampling_params)
        prompts = [self.engine.encode_chat(conv, tools, tool_instructions) for conv in convs]
        outs = self.generate(prompts, sampling_params, tools=tools)
        responses = [to_chat_response(o) for o in outs]
        return responses[0] if single else responses

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (blocks in use are untouched): for benchmarks and tests."""
        self.engine.block_manager.reset_prefix_cache()

    def _run(self, ids: list[str]) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[rid] for rid in ids]


def offered_tools(tools: list[dict] | None, params: SamplingParams | None) -> list[dict] | None:
    """The tools a chat request shows the model: none at all when tool_choice is "none"."""
    return None if params is not None and params.tool_choice == "none" else tools


def to_chat_response(out: RequestOutput) -> ChatResponse:
    parsed = parse_tool_calls(out.text)
    return ChatResponse(parsed.content, parsed.tool_calls, parsed.errors, out)
