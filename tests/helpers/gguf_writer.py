"""A Hugging Face checkpoint written as a GGUF file the way llama.cpp's converter writes one
(its tensor names, its permuted q/k rows for Llama), with a tokenizer the caller chooses: by
default a byte-level vocabulary with no merges."""

from __future__ import annotations

import json

import gguf
import numpy as np
from safetensors.torch import load_file

GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def byte_vocab(size: int) -> list[str]:
    """A byte-level BPE vocabulary with no merges: the 256 byte symbols, then fillers."""
    from tokenizers.pre_tokenizers import ByteLevel

    return list(ByteLevel.alphabet()) + [f"<extra_{i}>" for i in range(size - 256)]


def permute_like_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_byte_vocab(writer: gguf.GGUFWriter, vocab_size: int) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(byte_vocab(vocab_size))
    writer.add_token_types([1] * vocab_size)
    writer.add_eos_token_id(0)


def write_gguf(hf_folder, path, arch: str, write_tokenizer=write_byte_vocab) -> None:
    """`hf_folder`'s weights as a GGUF; `write_tokenizer(writer, vocab_size)` adds the vocabulary."""
    cfg = json.loads((hf_folder / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    writer.add_rope_freq_base(cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    write_tokenizer(writer, cfg["vocab_size"])
    for name, t in load_file(hf_folder / "model.safetensors").items():
        w = t.numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, suffix = rest.rsplit(".", 1)
            kind = GGUF_NAMES[module]
            gname = f"blk.{layer}.{kind}.{suffix}"
            if arch == "llama" and kind in ("attn_q", "attn_k"):
                w = permute_like_llama_cpp(w, heads if kind == "attn_q" else kv_heads)
        writer.add_tensor(gname, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
