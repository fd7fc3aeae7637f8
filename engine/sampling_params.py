"""What a request asks of the sampler and the stop conditions (vLLM's names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TOOL_CHOICES = ("none", "auto", "required")
MAX_LOGPROBS = 20  # OpenAI's top_logprobs limit


@dataclass
class StructuredOutputs:
    """Constrain the output to JSON (vLLM V1's names): `json`, a JSON Schema (a dict, or its
    text), or `json_object=True`, any JSON object. The schema is compiled, and its errors raised
    as ValueError, when the request is added."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if (self.json is not None) == bool(self.json_object):
            raise ValueError("StructuredOutputs: give exactly one of json (a JSON Schema) and "
                             "json_object=True")
        if self.json is not None and not isinstance(self.json, dict | str):
            raise ValueError(f"StructuredOutputs.json must be a JSON Schema as a dict or its "
                             f"JSON text, not {type(self.json).__name__}")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) = off
    min_p: float = 0.0
    max_tokens: int | None = 16  # None = until the context is full
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # OpenAI's shapes: "none", "auto" (the default; free text, any call it opens is constrained),
    # "required" (starts with a call) or {"type": "function", "function": {"name": ...}}. Applies
    # to the tools passed with the request; without tools "auto" constrains nothing.
    tool_choice: str | dict[str, Any] = "auto"
    # OpenAI's parallel_tool_calls: false allows at most one call in the output (constrained).
    parallel_tool_calls: bool = True
    # None: no logprobs; k: the sampled token's logprob and the k most likely tokens' (see
    # engine/logprobs.py: from the model's raw distribution, as vLLM does by default).
    logprobs: int | None = None
    # JSON output (engine/constrained/json_schema.py); not with tools that constrain calls.
    structured_outputs: StructuredOutputs | None = None
    # In an "auto" turn with tools (Hermes form): the first token chooses between a call and an
    # answer, a call when the model gives the opening of `<tool_call>` at least this probability
    # (engine/constrained/choice.py). None: the model alone decides, token by token.
    tool_call_threshold: float | None = None
    # The sampling inside a constrained tool call (temperature, top_p, penalties; its stop and
    # length fields are unused): arguments want no creativity, and a repetition penalty would
    # keep the model from copying the user's words into them. None: these params throughout.
    call_params: SamplingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in self.stop if s]
        if self.top_k == -1:
            self.top_k = 0
        checks = [
            (self.temperature >= 0.0, "temperature", "must be >= 0"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0, "top_k", "must be >= 0 (0 or -1 turns it off)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (self.repetition_penalty > 0.0, "repetition_penalty", "must be > 0"),
            (self.logprobs is None or (type(self.logprobs) is int and 0 <= self.logprobs <= MAX_LOGPROBS),
             "logprobs", f"must be None or an integer in [0, {MAX_LOGPROBS}]"),
            (self.tool_call_threshold is None or 0.0 < self.tool_call_threshold <= 1.0,
             "tool_call_threshold", "must be None or in (0, 1]"),
            (self.call_params is None or isinstance(self.call_params, SamplingParams),
             "call_params", "must be None or a SamplingParams"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r}: {why}")
        if not _valid_tool_choice(self.tool_choice):
            raise ValueError(
                f"SamplingParams.tool_choice={self.tool_choice!r}: must be 'none', 'auto', "
                "'required' or {'type': 'function', 'function': {'name': <a tool's name>}}")
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputs):
            raise ValueError(f"SamplingParams.structured_outputs={self.structured_outputs!r}: "
                             "must be an engine.StructuredOutputs")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )


def _valid_tool_choice(choice: Any) -> bool:
    if isinstance(choice, str):
        return choice in TOOL_CHOICES
    if not isinstance(choice, dict) or choice.get("type") != "function":
        return False
    fn = choice.get("function")
    return isinstance(fn, dict) and isinstance(fn.get("name"), str) and bool(fn["name"])
