"""Qwen3: the Llama decoder with RMSNorm on each q and k head before RoPE (ModelConfig.qk_norm)."""

from engine.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass
