"""What every loader returns: a model's config, tokenizer and weights, whatever file they came from."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config import ModelConfig
from engine.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch loads with the weights, not with a look at a model's config
    import torch


@dataclass
class Checkpoint:
    config: ModelConfig
    tokenizer: Tokenizer | None
    weights: Iterator[tuple[str, torch.Tensor]]  # Hugging Face names, float32 or stored dtype
    rope_freq_factors: torch.Tensor | None = None  # GGUF `rope_freqs`
    context_length: int | None = None
    quantized: bool = False  # the file stores its linear weights quantized (a Q4_1 GGUF, ...)
    quantized_bits: int | None = None  # 4 (Q4_*, or fewer bits) or 8 (Q5_*, Q6_K, Q8_0) where it does
