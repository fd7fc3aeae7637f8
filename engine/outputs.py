"""What the engine hands back: per-request outputs (streamed or final) and chat responses."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.tool_parser import ToolCall


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


@dataclass
class ChatResponse:
    content: str  # the reply without tool-call blocks
    tool_calls: list[ToolCall]
    errors: list[str]  # malformed tool calls, to send back to the model as tool errors
    output: RequestOutput

    @property
    def finish_reason(self) -> str | None:
        return self.output.finish_reason
