"""A Llama-3-style tokenizer trained for tests: byte-level BPE with Llama 3's pre-tokenizer, its
special tokens after the normal ones, and Llama 3.1's chat template for tool calls."""

from __future__ import annotations

import json

from engine.tokenizer import gguf_pre_tokenizer

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
# Llama 3.1's shape, in brief: turn headers, a call as a JSON object under "parameters" (or after
# <|python_tag|>, ending with <|eom_id|>), tool results in ipython turns.
TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- elif 'tool_calls' in message %}{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|python_tag|>{\"name\": \"' + call.name"
    " + '\", \"parameters\": ' + call.arguments | tojson + '}<|eom_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n'"
    " + message.content | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
# Text the tokenizer learns its merges from, so its tokens mix JSON structure, whitespace runs
# (some with multi-byte spaces) and words the way a real vocabulary does.
CORPUS = [
    '{"name": "get_weather", "parameters": {"unit": "celsius", "days": 3, "hourly": true}}',
    '{"name": "now", "parameters": {}}\n{"name":"set_volume","parameters":{"level":-2.5e3}}',
    ' {"a": [1, 2, null, false], "b": {"c": "x\\"y"}} {\n  "name": "now"\n}',
    "You are a helpful assistant. What is the weather like in Paris today? It is sunny.",
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024",
    '<|python_tag|>brave_search.call(query="x") <tool_call> </tool_call>',
    'Respond in the format {"name": function name, "parameters": dictionary of argument name}.',
    "   \n\n\t  \u3000 caf\u00e9 \u2019quoted\u2019 \u00a0nbsp",
] * 20

def train_tokenizer():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = gguf_pre_tokenizer("llama3")  # Llama 3's split, then byte-level
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.add_special_tokens(SPECIALS)  # after the normal tokens, as in Llama 3 (128000 on)
    return tok


END_TOKENS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


def tokenizer_folder(path):
    """A trained Llama 3 style tokenizer saved in `path` as a model folder holds it (with the
    chat template and the end-of-turn tokens); the tokenizer."""
    tok = train_tokenizer()
    tok.save(str(path / "tokenizer.json"))
    ends = [tok.token_to_id(t) for t in END_TOKENS]
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": TEMPLATE}))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return tok
