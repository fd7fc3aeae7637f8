"""What the engine hands back: per-request outputs (streamed or final) and chat responses."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob
from engine.tool_parser import ToolCall


@dataclass
class RequestMetrics:
    """A request's timeline, in time.monotonic() seconds."""

    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None  # None until the first output token
    finished_time: float | None = None  # None until it finishes (stop, length or abort)
    num_generation_tokens: int = 0


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every output token so far
    text: str  # the output text so far (cut at a stop string)
    delta_token_ids: list[int] = field(default_factory=list)  # new since the previous output
    delta_text: str = ""
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    # SamplingParams.logprobs: one per output token so far (None when not asked), and those of
    # delta_token_ids (empty when not asked).
    logprobs: list[TokenLogprob] | None = None
    delta_logprobs: list[TokenLogprob] = field(default_factory=list)
    metrics: RequestMetrics = field(default_factory=RequestMetrics)


@dataclass
class ChatResponse:
    content: str  # the reply without tool-call blocks
    tool_calls: list[ToolCall]
    errors: list[str]  # malformed tool calls, to send back to the model as tool errors
    output: RequestOutput

    @property
    def finish_reason(self) -> str | None:
        return self.output.finish_reason
