"""How the first token of an "auto" turn chooses, under constraint, between answering and calling.

A small model rarely opens `<tool_call>` by itself, even when asked in so many words, yet the
probability it gives the tag's first token separates the prompts that want a tool from those
that do not far better than its greedy choice does (bench/agent_eval.py). So at the first token
the chance of opening the tag is summed over every token that starts it: at or above the
request's `tool_call_threshold` the turn becomes one forced call (the "required" grammar: a
valid call of one of the tools offered, then the end of the turn); below it, the tag may not
open there and the model answers in text (a call may still open later, as in any "auto" turn).
The matcher that does it is engine.constrained.masks.ChoosingMatcher.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.constrained.grammar import OPEN_TAG


def opener_ids(token_bytes: list[bytes | None]) -> np.ndarray:
    """The tokens that open the Hermes tag at the start of an output: those spelling a prefix of
    `<tool_call>`, or the whole tag and more."""
    return np.array([i for i, b in enumerate(token_bytes)
                     if b and (OPEN_TAG.startswith(b) or b.startswith(OPEN_TAG))], dtype=np.int64)


def opening_probability(row: torch.Tensor, openers: np.ndarray) -> float:
    """The model's probability (softmax of the raw logits `row`) of a token in `openers`."""
    logits = row.float()
    ids = torch.from_numpy(openers).to(row.device)
    return float(torch.exp(torch.logsumexp(logits[ids], 0) - torch.logsumexp(logits, 0)))
