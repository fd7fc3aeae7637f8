"""The engine's two configs: what the model is (ModelConfig) and how to run it (EngineConfig).

No torch at import: the daemon's config validates `[engine]` into EngineConfig, and commands that
only read the config (`openclaw users`) should not pay for loading torch."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
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

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer for one token, each element `dtype_bytes` wide."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


QUANTIZATION_OPTIONS = ("auto", "int8", "int4", "none", None)

# The bounds a field's metadata may state, checked by EngineConfig.__post_init__. pydantic reads the
# same metadata keys, so the daemon's `[engine]` is held to them too, reported with the key.
_BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


@dataclass
class EngineConfig:
    """How to run the engine. Names are vLLM's. The daemon's `[engine]` table validates straight
    into this class, so these defaults and bounds are the config file's too."""

    model: str | None = None
    """A Hugging Face model folder (config.json + *.safetensors) or a .gguf file; None is the
    embedded SmolLM2-135M-Instruct GGUF, which needs no download."""
    device: str = field(default="auto", metadata={"pattern": r"^(auto|cpu|cuda(:\d+)?)$"})
    """"auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """"auto" is bfloat16 on CUDA and float32 on CPU."""
    max_num_seqs: int = field(default=64, metadata={"ge": 1})
    """Sequences decoded together."""
    max_num_batched_tokens: int = field(default=2048, metadata={"ge": 1})
    """Token budget of one engine step; long prompts are prefilled in chunks of this size."""
    block_size: int = field(default=16, metadata={"ge": 1})
    """Tokens per paged KV-cache block."""
    kv_cache_gib: float | None = field(default=None, metadata={"gt": 0})
    """KV-cache pool in GiB; None: 1 GiB on CPU, on CUDA what gpu_memory_utilization leaves."""
    gpu_memory_utilization: float = field(default=0.85, metadata={"gt": 0, "le": 1})
    """Share of GPU memory the engine may use (weights + KV cache)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of a shared prefix (system prompt, earlier turns)."""
    max_model_len: int | None = field(default=None, metadata={"ge": 1})
    """Longest sequence; None is the model's own context length."""
    seed: int = 0
    """Seed of the shared random generator, used by requests without a seed of their own."""
    enforce_eager: bool = False
    """CUDA: run decode steps eagerly instead of replaying CUDA graphs."""
    quantization: Literal["auto", "int8", "int4", "none"] | None = "auto"
    """Weight-only quantized linear layers: "int8" (per output channel), "int4" (groups of 32),
    "auto" (a quantized GGUF: int4 on CUDA; on the CPU int4 for decode rows through
    engine/native/gemv.cpp with an fp16 copy for prompts, int8 for a 5+-bit file, fp16 alone
    without the native kernels; a float checkpoint, or dtype="float32" set: float weights),
    None or "none": float weights."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            for bound, limit in f.metadata.items():
                if bound in _BOUNDS and value is not None and not _BOUNDS[bound][0](value, limit):
                    raise ValueError(f"engine config {f.name}={value!r}: must be "
                                     f"{_BOUNDS[bound][1]} {limit}")

        if self.quantization not in QUANTIZATION_OPTIONS:
            raise ValueError(f"engine config quantization={self.quantization!r}: must be one of "
                             f"{', '.join(repr(q) for q in QUANTIZATION_OPTIONS)}")

    def resolve_quantization(self, device: torch.device, checkpoint_quantized: bool,
                             checkpoint_bits: int | None = None) -> str | None:
        """The quantize_linears mode, or None (float weights), for a model on `device` whose
        checkpoint stores quantized linear weights (of `checkpoint_bits`) or not; CPU "auto" is
        quant_linear.cpu_auto_quantization's choice."""
        if self.quantization != "auto":
            return None if self.quantization == "none" else self.quantization
        if not checkpoint_quantized or self.dtype == "float32":
            return None
        if device.type == "cuda":
            return "int4"
        from engine.layers.quant_linear import cpu_auto_quantization

        return cpu_auto_quantization(checkpoint_bits)

    def resolve_device(self) -> torch.device:
        import torch

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

    def dtype_name(self, device_type: str) -> str:
        """The dtype of weights and KV cache on a device of `device_type`, by name (no torch)."""
        if self.dtype == "auto":
            return "bfloat16" if device_type == "cuda" else "float32"
        return self.dtype

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        import torch

        dtype = getattr(torch, self.dtype_name(device.type), None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"engine config dtype={self.dtype!r}: not a torch floating dtype")
        return dtype


def engine_config(model: str | EngineConfig | None, overrides: dict[str, Any]) -> EngineConfig:
    """What `LLM(model, **kwargs)` and `AsyncLLM(...)` run with: `model` is a model reference, as
    in vLLM, or a whole EngineConfig (the daemon's `[engine]`); `overrides` change its fields."""
    if isinstance(model, EngineConfig):
        return replace(model, **overrides)
    return EngineConfig(model=model, **overrides)
