"""OpenClaw-py's inference engine: paged KV cache, continuous batching, prefix caching.

Usable alone; imports nothing else of the project. Names follow vLLM's.
"""

from engine.async_llm import AsyncLLM, EngineDeadError
from engine.config import EngineConfig, ModelConfig
from engine.llm import LLM
from engine.outputs import ChatResponse, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncLLM",
    "ChatResponse",
    "EngineConfig",
    "EngineDeadError",
    "ModelConfig",
    "RequestOutput",
    "SamplingParams",
]
