"""One request's token state as the scheduler and block manager see it (no text, no model)."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams

_arrivals = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt, then every generated token
    params: SamplingParams = field(default_factory=SamplingParams)
    priority: int = 0  # lower runs first (vLLM's convention); arrival breaks ties
    max_total_tokens: int = 1 << 30  # context limit: stop with "length" when reached
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the pool
    num_cached_tokens: int = 0  # of those, how many came from the prefix cache (at admission)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chained key of each full block
    num_preemptions: int = 0
    generator: Any = None  # this request's torch.Generator when it has a seed
    # Constrained decoding (engine.constrained.ToolCallMatcher): masks this row's logits before
    # sampling and follows the tokens appended. Its state depends only on the output tokens, so a
    # preempted sequence keeps it.
    constraint: Any = None
    cache_root: bytes | None = None  # block_manager.salt_key of the request's cache_salt
    arrival: int = field(default_factory=lambda: next(_arrivals))

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.arrival)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens
