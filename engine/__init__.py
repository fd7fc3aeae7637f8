"""OpenClaw-py's inference engine: paged KV cache, continuous batching, prefix caching.

Usable alone; imports nothing else of the project. Names follow vLLM's. The names below load on
first use (PEP 562), so `engine.config` can be read without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.async_llm import AsyncLLM, EngineDeadError
    from engine.config import EngineConfig, ModelConfig
    from engine.llm import LLM
    from engine.logprobs import TokenLogprob
    from engine.outputs import ChatResponse, RequestMetrics, RequestOutput
    from engine.sampling_params import SamplingParams, StructuredOutputs

_HOMES = {
    "LLM": "engine.llm",
    "AsyncLLM": "engine.async_llm",
    "ChatResponse": "engine.outputs",
    "EngineConfig": "engine.config",
    "EngineDeadError": "engine.async_llm",
    "ModelConfig": "engine.config",
    "RequestMetrics": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
    "StructuredOutputs": "engine.sampling_params",
    "TokenLogprob": "engine.logprobs",
}
__all__ = ["LLM", "AsyncLLM", "ChatResponse", "EngineConfig", "EngineDeadError", "ModelConfig",
           "RequestMetrics", "RequestOutput", "SamplingParams", "StructuredOutputs", "TokenLogprob"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # once: later lookups find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
