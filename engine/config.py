"""The engine's two configs: what the model is (ModelConfig) and how to run it (EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Hugging Face `architectures` names we run, mapped to our model family.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: dict[str, Any] | None = None
    attention_bias: bool = False  # Qwen2: bias on q, k, v
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before RoPE

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if family is None:
            family = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}.get(
                cfg.get("model_type", "")
            )
        if family is None:
            raise ValueError(
                f"config.json: architectures={archs!r} model_type={cfg.get('model_type')!r} is "
                f"not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        # transformers 5 nests rope settings in `rope_parameters`; 4.x used top-level keys.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type") not in (None, "default")
                                              else None)
        heads = cfg["num_attention_heads"]
        return cls(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype.itemsize


@dataclass
class EngineConfig:
    model: str | None = None  # None: the embedded SmolLM2-135M-Instruct GGUF
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto" (cpu -> float32, cuda -> bfloat16) | "float32" | "bfloat16" | ...
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_gib: float | None = None  # pool size; default: CPU 1 GiB, CUDA what memory is left
    gpu_memory_utilization: float = 0.85
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # default: the model's context length
    seed: int = 0  # seeds the shared RNG used by requests without their own seed
    enforce_eager: bool = False  # CUDA: run decode steps eagerly instead of replaying CUDA graphs

    def __post_init__(self) -> None:
        checks = [
            (self.max_num_seqs >= 1, "max_num_seqs", "must be >= 1"),
            (self.max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be >= 1"),
            (self.block_size >= 1, "block_size", "must be >= 1"),
            (self.kv_cache_gib is None or self.kv_cache_gib > 0, "kv_cache_gib", "must be > 0"),
            (0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization", "must be in (0, 1]"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise ValueError(f"engine config {name}={getattr(self, name)!r}: {why}")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            dev = torch.device(self.device)
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ValueError(f"engine config device={self.device!r}: no CUDA device is available")
            if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
                raise ValueError(f"engine config device={self.device!r}: this machine has "
                                 f"{torch.cuda.device_count()} CUDA device(s)")
        if dev.type == "cuda" and dev.index is None:
            # Pinned to the device current now: the step thread (AsyncLLM) has a current device of
            # its own, so a bare "cuda" could mean another GPU there than where the weights went.
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"engine config dtype={self.dtype!r}: not a torch floating dtype")
        return dtype
