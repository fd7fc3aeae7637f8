"""Log-probabilities of the sampled tokens, for the requests that ask (SamplingParams.logprobs).

As vLLM computes them by default: a log-softmax of the model's raw logits over the whole
vocabulary, before temperature, penalties, top-k/p/min-p and constraints, so they describe the
model's distribution, not the sampler's reshaping of it. Only the rows that ask pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.sampler import to_device


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int  # the sampled token
    logprob: float  # its log-probability
    top: list[tuple[int, float]] = field(default_factory=list)  # the k most likely, most likely first


class StepLogprobs:
    """One step's logprobs: begun on the raw logits (before any mask is written into them),
    finished once the tokens are sampled. `ks[i]`: row i's k, or None when it did not ask."""

    def __init__(self, logits: torch.Tensor, ks: list[int | None]) -> None:
        self.ks = ks
        self.rows = [i for i, k in enumerate(ks) if k is not None]
        index = None
        if len(self.rows) < len(ks):  # up without waiting for the GPU
            index = to_device(torch.tensor(self.rows, dtype=torch.int64), logits.device)
        self.index = index
        picked = logits if index is None else logits.index_select(0, index)
        # A new tensor: the constraint masks written into `logits` afterwards do not reach it.
        self.logprobs = picked.float().log_softmax(dim=-1)
        k = max(ks[i] for i in self.rows)
        self.top = self.logprobs.topk(min(k, self.logprobs.shape[1]), dim=-1) if k else None

    def finish(self, tokens: torch.Tensor) -> list[TokenLogprob | None]:
        """Per row of the step: its TokenLogprob, or None for rows that did not ask. `tokens`: the
        sampled [rows] tensor, on the logits' device."""
        picked = tokens if self.index is None else tokens.index_select(0, self.index)
        chosen = self.logprobs.gather(1, picked.unsqueeze(1)).squeeze(1).tolist()
        top_values = self.top.values.tolist() if self.top is not None else None
        top_ids = self.top.indices.tolist() if self.top is not None else None
        ids = picked.tolist()
        out: list[TokenLogprob | None] = [None] * len(self.ks)
        for j, row in enumerate(self.rows):
            k = self.ks[row]
            top = list(zip(top_ids[j][:k], top_values[j][:k], strict=True)) if k else []
            out[row] = TokenLogprob(ids[j], chosen[j], top)
        return out
