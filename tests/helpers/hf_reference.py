"""Reference runs with transformers on the same weights: tiny random checkpoints and greedy decoding.

Used by the engine's tests; the engine itself never imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

TINY = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            rms_norm_eps=1e-6, initializer_range=0.25, tie_word_embeddings=False)


def build_tiny_checkpoint(kind: str, folder: Path, seed: int = 0) -> Path:
    """Save a random tiny model of `kind` as a Hugging Face folder (config + safetensors)."""
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "llama":
        cfg = tf.LlamaConfig(**TINY)
    elif kind == "llama3-rope":  # Llama 3.1-style rope scaling and a tied head
        cfg = tf.LlamaConfig(**{**TINY, "tie_word_embeddings": True}, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 256})
    elif kind == "qwen2":
        cfg = tf.Qwen2Config(**TINY)
    elif kind == "qwen3":  # head_dim chosen so that heads * head_dim != hidden_size
        cfg = tf.Qwen3Config(**TINY, head_dim=24)
    else:
        raise ValueError(kind)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # norms start at 1 and biases at 0: randomise them too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.5)
            elif "q_proj" in name or "k_proj" in name:
                # Scores of order 1: a saturated softmax would attend one-hot, and then positions
                # (RoPE), masks and paging mistakes would barely show in the logits.
                p.mul_(0.3)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def load_reference(folder: Path):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@torch.no_grad()
def prefill_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0].float()


@dataclass
class GreedyRun:
    tokens: list[int]
    gaps: list[float]  # top-1 minus top-2 logit at each step, in the reference


@torch.no_grad()
def greedy(model, ids: list[int], steps: int) -> GreedyRun:
    """Greedy decoding with a plain KV cache, one request alone (no padding)."""
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                         eos_token_id=None)
    tokens = out.sequences[0, len(ids):].tolist()
    gaps = []
    for logits in out.logits:
        top2 = logits[0].float().topk(2).values
        gaps.append(float(top2[0] - top2[1]))
    return GreedyRun(tokens, gaps)


def compare_greedy(ours: list[int], ref: GreedyRun, near_tie: float = 1e-4) -> str | None:
    """None when identical. A divergence is accepted only at a true near-tie of the reference;
    then it is described (for the test log). Otherwise raises AssertionError."""
    for step, (a, b) in enumerate(zip(ours, ref.tokens, strict=False)):
        if a != b:
            assert ref.gaps[step] < near_tie, (
                f"greedy tokens diverge at step {step}: ours {a}, reference {b}, reference top-2 "
                f"gap {ref.gaps[step]:.3g} (not a near-tie)\nours {ours}\nref  {ref.tokens}")
            return f"diverged at step {step} at a near-tie (gap {ref.gaps[step]:.2g})"
    assert len(ours) == len(ref.tokens), f"lengths differ: {len(ours)} vs {len(ref.tokens)}"
    return None
