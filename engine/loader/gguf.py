"""Single-file GGUF models: metadata -> ModelConfig and tokenizer, tensors dequantized to float32.

llama.cpp stores the q and k projections of `llama` models permuted for its interleaved RoPE; we
undo that per matrix so the weights equal the Hugging Face ones and our rotate-half RoPE applies.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.config import ModelConfig
from engine.loader.checkpoint import Checkpoint
from engine.loader.gguf_header import GGUFFormatError, GGUFHeader, read_gguf_header
from engine.loader.magic import gguf_magic_problem
from engine.tokenizer import Tokenizer

_FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def read_fields(path: str | Path) -> dict[str, Any]:
    """The GGUF's metadata (`tokenizer.ggml.tokens`, `llama.block_count`, ...) as Python values."""
    return _reader(Path(path)).fields


def open_gguf(path: Path) -> Checkpoint:
    reader = _reader(path)
    fields = reader.fields
    arch = fields.get("general.architecture")
    family = _FAMILIES.get(arch)
    if family is None:
        raise ValueError(f"{path.name}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(_FAMILIES)})")
    config = _config_from_fields(fields, arch, family, reader)
    tensors = {t.name: t for t in reader.tensors}
    freq_factors = tensors.pop("rope_freqs.weight", None)
    return Checkpoint(
        config=config,
        tokenizer=Tokenizer.from_gguf_fields(fields),
        weights=_iter_weights(tensors, config, unpermute=arch in ("llama", "mistral")),
        rope_freq_factors=None if freq_factors is None else torch.tensor(_dequant(freq_factors)),
        context_length=fields.get(f"{arch}.context_length"),
        quantized=stores_quantized_linears(tensors.values()),
        quantized_bits=quantized_bits(tensors.values()),
    )


# Tensor types that are plain floats: a GGUF of these holds an unquantized model.
_FLOAT_TYPES = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
                          GGMLQuantizationType.F64})


def stores_quantized_linears(tensors) -> bool:
    """Whether the file's layer matrices (not norms or the embedding) are block-quantized."""
    return any(t.name.startswith("blk.") and len(t.shape) == 2 and t.tensor_type not in _FLOAT_TYPES
               for t in tensors)


def quantized_bits(tensors) -> int | None:
    """What most of the file's block-quantized layer matrices keep: 8 for 5 bits or more (Q5_*,
    Q6_K, Q8_0: a 4-bit copy would lose what the file keeps), 4 for 4 or fewer (a Q4_K_M file's few
    Q6_K matrices do not make it an 8-bit one); None for a float file."""
    kinds = [t.tensor_type.name.startswith(("Q5", "Q6", "Q8")) for t in tensors
             if t.name.startswith("blk.") and len(t.shape) == 2 and t.tensor_type not in _FLOAT_TYPES]
    if not kinds:
        return None
    return 8 if 2 * sum(kinds) >= len(kinds) else 4


def _reader(path: Path) -> GGUFHeader:
    """The file's reader; ValueError saying what is wrong with a file that is no GGUF or is cut
    short (an interrupted download), where the reader itself fails deep in numpy."""
    if problem := gguf_magic_problem(path):
        raise ValueError(problem)
    size = path.stat().st_size
    cut_short = (f"{path.name}: the GGUF file is cut short or damaged ({size:,} bytes); an "
                 "interrupted download? fetch it again")
    try:
        return read_gguf_header(path)
    except GGUFFormatError as exc:
        raise ValueError(f"{cut_short}: {exc}") from exc


def _config_from_fields(fields: dict[str, Any], arch: str, family: str,
                        reader: GGUFHeader) -> ModelConfig:
    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"GGUF metadata {arch}.{key} is missing")
        return value

    hidden, heads = get("embedding_length"), get("attention.head_count")
    head_dim = fields.get(f"{arch}.attention.key_length") or hidden // heads
    vocab = fields.get(f"{arch}.vocab_size") or len(fields["tokenizer.ggml.tokens"])
    scaling = None
    if fields.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": fields[f"{arch}.rope.scaling.factor"]}
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    has_bias = any(t.name.endswith("attn_q.bias") for t in reader.tensors)
    return ModelConfig(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_layers=get("block_count"),
        num_heads=heads,
        num_kv_heads=fields.get(f"{arch}.attention.head_count_kv") or heads,
        head_dim=head_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        max_position_embeddings=get("context_length"),
        tie_word_embeddings=not has_output,
        rope_scaling=scaling,
        attention_bias=has_bias,
        qk_norm=family == "qwen3",
    )


def _dequant(t) -> np.ndarray:
    return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves)."""
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _iter_weights(tensors: dict, config: ModelConfig,
                  unpermute: bool) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t in tensors.items():
        kind = None
        if name in _GLOBAL_NAMES:
            hf_name = _GLOBAL_NAMES[name]
        elif name.startswith("blk.") and name.split(".")[2] in _LAYER_NAMES:
            _, layer, kind, suffix = name.split(".", 3)
            hf_name = f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"
        else:
            raise ValueError(f"GGUF tensor {name!r} is not understood")
        w = _dequant(t)
        if unpermute and kind in ("attn_q", "attn_k"):
            w = _unpermute(w, config.num_heads if kind == "attn_q" else config.num_kv_heads)
        yield hf_name, torch.from_numpy(np.array(w, dtype=np.float32))  # a copy: w may be a read-only map
