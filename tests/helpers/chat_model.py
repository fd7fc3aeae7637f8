"""A random-weight Llama on the embedded SmolLM2's tokenizer (ChatML, Hermes tool calls), as a
Hugging Face folder: the whole chat path at a tiny model's speed. Its text is noise; what it can be
trusted for is the shape of things (a constrained call, token counts, the prefix cache)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

EOS = 2  # SmolLM2's <|im_end|>


def random_chat_model(folder: Path, seed: int = 0, positions: int = 1024) -> Path:
    import transformers as tf

    from engine.loader import embedded_model_path
    from engine.loader.gguf import read_fields
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf_fields(read_fields(embedded_model_path()))
    torch.manual_seed(seed)
    cfg = tf.LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=positions, initializer_range=0.25,
                         tie_word_embeddings=True)
    tf.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}))
    return folder
