"""Quantized models end to end: tiny random checkpoints against transformers running the SAME
quantized weights dequantized to fp32 (LM head included; the embedding stays exact)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine import LLM
from engine.layers.quant import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from tests.helpers.hf_reference import build_tiny_checkpoint, load_reference, prefill_logits

PROMPT = [(7 * i) % 383 + 1 for i in range(200)]


def dequantized_reference(folder, mode: str):
    """transformers on the checkpoint with every linear weight (the LM head, a tied one untied, in
    int8 always) replaced by its quantized-then-dequantized value; the embedding stays exact."""
    model = load_reference(folder)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, nn.Linear):
                w = mod.weight.detach()
                dq = (dequantize_int4(*quantize_int4(w, 32), 32) if mode == "int4" and name != "lm_head"
                      else dequantize_int8(*quantize_int8(w)))
                mod.weight = nn.Parameter(dq)
    return model


@pytest.mark.parametrize("kind", ["llama3-rope", "qwen2"])  # a tied head; q/k/v biases
def test_tiny_int4_model_matches_transformers_on_the_same_int4_weights(kind, tmp_path):
    folder = build_tiny_checkpoint(kind, tmp_path)
    ours = LLM(str(folder), quantization="int4", kv_cache_gib=0.01).engine.runner.prefill_logits(PROMPT)
    theirs = prefill_logits(dequantized_reference(folder, "int4"), PROMPT)
    # Same weights, same math: the fp32 exactness bound of test_correctness.py.
    assert (ours - theirs).abs().max().item() < 2e-3


def test_tiny_int8_model_matches_transformers_on_the_same_int8_weights(tmp_path):
    folder = build_tiny_checkpoint("llama", tmp_path)
    ours = LLM(str(folder), quantization="int8", kv_cache_gib=0.01).engine.runner.prefill_logits(PROMPT)
    theirs = prefill_logits(dequantized_reference(folder, "int8"), PROMPT)
    assert (ours - theirs).abs().max().item() < 2e-3  # weight-only: fp32 math on the same weights
