"""Qwen2: the Llama decoder with a bias on the q, k and v projections (ModelConfig.attention_bias)."""

from engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass
