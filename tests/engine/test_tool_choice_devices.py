"""Constrained tool calls on every device this machine has, with nothing but `tokenizers` and
`transformers` (so bench/gpu_session.sh runs it natively on the GPU image, which has no GGUF
reader): a byte-level BPE trained here, a random-weight Llama on it, and "required" / named
tool_choice at temperature 1.0. On CUDA this also covers the mask's trip to the device and the
decode CUDA graphs under constrained rows."""

from __future__ import annotations

import json

import pytest
import torch

from engine import LLM, SamplingParams
from engine.tool_parser import parse_tool_calls

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                         "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
                                                                    "properties": {}}}},
]
NAMES = {t["function"]["name"] for t in TOOLS}
# What the tokenizer learns its merges from: chat, JSON and tool-call text, so its tokens mix
# structure and words the way a real vocabulary does (`"}`, `{"`, `<tool`, ...).
CORPUS = [
    '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "celsius", "days": 3}}\n</tool_call>',
    '{"name": "now", "arguments": {}} {"a": [1, 2.5e3, true, null, "x\\"y"]}',
    "You are a helpful assistant. What is the weather like in Paris today? It is sunny.",
    "# Tools\nYou may call one or more functions to assist with the user query.",
] * 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("bpe-random-llama")
    tok.save(str(path / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, initializer_range=0.25,
                         tie_word_embeddings=False, eos_token_id=eos)
    tf.LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.mark.parametrize("device", DEVICES)
def test_required_and_named_calls_parse_on_each_device(folder, device):
    llm = LLM(folder, device=device, kv_cache_gib=0.05, max_model_len=1024, max_num_seqs=16)
    prompt = llm.engine.encode_chat([{"role": "user", "content": "What is the weather like?"}], TOOLS)
    named = {"type": "function", "function": {"name": "get_weather"}}
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200, tool_choice="required")
              for s in range(6)]
    params += [SamplingParams(temperature=1.0, seed=100 + s, max_tokens=200, tool_choice=named)
               for s in range(2)]
    outs = llm.generate([prompt] * len(params), params, tools=TOOLS)
    for out, p in zip(outs, params, strict=True):
        parsed = parse_tool_calls(out.text)
        assert out.finish_reason == "stop" and parsed.errors == [] and parsed.content == "", out.text
        assert len(parsed.tool_calls) == 1 and isinstance(parsed.tool_calls[0].arguments, dict)
        want = {p.tool_choice["function"]["name"]} if isinstance(p.tool_choice, dict) else NAMES
        assert parsed.tool_calls[0].name in want, out.text
    # The same request unconstrained does not make a call: the masks did the work.
    free = llm.generate([prompt] * 4, [SamplingParams(temperature=1.0, seed=s, max_tokens=60)
                                       for s in range(4)], tools=TOOLS)
    assert all(parse_tool_calls(o.text).tool_calls == [] for o in free)
