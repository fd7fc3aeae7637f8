"""Hugging Face model folders: config.json, safetensors shards, tokenizer.json, chat template."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.config import ModelConfig
from engine.loader.checkpoint import Checkpoint
from engine.tokenizer import Tokenizer


def open_hf_folder(path: Path) -> Checkpoint:
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{path}: no config.json, so this is not a Hugging Face model folder")
    try:
        raw = json.loads(cfg_file.read_text())
        config = ModelConfig.from_hf(raw)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        # A config.json that is not JSON, or lacks a key the model needs, is a bad model folder.
        what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{cfg_file}: not a config.json this engine can read ({what})") from exc
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{path}: no *.safetensors weights (.bin checkpoints are not read)")
    tokenizer = Tokenizer.from_hf_folder(path) if (path / "tokenizer.json").exists() else None
    return Checkpoint(
        config=config,
        tokenizer=tokenizer,
        weights=_iter_safetensors(shards),
        context_length=raw.get("max_position_embeddings"),
    )


def _iter_safetensors(shards: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_tensor(name)
