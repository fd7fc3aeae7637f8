"""Seeded fuzz of constrained tool calls: random tool schemas of the kinds skills declare, driven by
random token choices from each step's allowed set, on real vocabularies (the embedded SmolLM2's with
Hermes calls; a Llama-3-style byte-level BPE with Llama 3.1 calls and with Hermes calls).

Each run asserts, at every step: the allowed set is never empty (no dead end), a row is left
unmasked only in free text, the chosen token fits the grammar, and the call in progress can still
be completed within a bound (an explicit completion is built from the state and must be accepted).
At the end: the output, parsed by the product's own parser, holds exactly the calls the grammar
let through, naming only offered tools (the named one for a named tool_choice), with arguments
that satisfy what `engine.constrained` promises of the schema (its module docstring: declared
top-level names, typed scalars, string enums; `promised` below) and that can be written as UTF-8.
Runs follow a random valid call for a while (so every valid call must be accepted), then take
random tokens, then finish along the completion. Masks are compared with a brute-force walk of
every token on the small vocabulary at every step, and on SmolLM2's at a few states.

OPENCLAW_FUZZ_SEED picks another seed (the default is fixed, so a failure reproduces).
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pytest

from engine.constrained.grammar import (
    ARGS,
    END,
    ESCAPE,
    FREE,
    HERMES,
    HEX,
    ITEM,
    KEY,
    LIT,
    LLAMA3,
    MAX_WS,
    MORE,
    NEXT,
    NUMBER,
    START,
    STRING,
    TAG,
    TRIE,
    TYPED,
    VALUE,
    WS,
    CallGrammar,
    tool_specs,
)
from engine.constrained.masks import CallMasks, ToolCallMatcher, ToolConstraints
from engine.constrained.vocab import TokenVocab
from engine.tokenizer import Tokenizer
from engine.tool_parser import StreamingToolParser, parse_tool_calls
from tests.helpers.json_schema_check import schema_errors

SEED = int(os.environ.get("OPENCLAW_FUZZ_SEED", "20250101"))
SCALARS = ("boolean", "integer", "number", "string", "null")

# ---- random tool schemas ---------------------------------------------------------------------

# Keys and names with shared prefixes stress the tries; odd texts need JSON escapes or are
# multi-byte, or look like the call syntax itself.
IDENTS = ["a", "ab", "abc", "b", "city", "c1ty", "days", "day", "x_y", "x-y", "q", "name",
          "arguments", "n"]
ODD = ['"', "\\", "/", "\n", "\t", "\r", "\x00", "\x01", "\x1f", "\x7f", "\u00e9", "\u00df",
       "\u4e2d", "\u2028", "\u3000", "\U0001f980", "<", ">", "{", "}", "[", "]", ",", ":", "'", " ",
       "<tool_call>", "</tool_call>", "<|python_tag|>", "\\u0041", "null", "\ufffd"]
ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789_- "
TOOL_NAMES = ["get", "get_weather", "get-weather", "get_weather2", "now", "now_later", "search",
              "s", "shell", "files", "email", "reminders", "x", "caf\u00e9", 'say"hi', "back\\slash",
              "emoji_\U0001f980", "two words"]


def rand_text(rng: random.Random, most: int = 6) -> str:
    return "".join(rng.choice(ODD) if rng.random() < 0.3 else rng.choice(ALNUM)
                   for _ in range(rng.randrange(most + 1)))


def rand_words(rng: random.Random, k: int) -> list[str]:
    """k distinct strings, some empty, some sharing prefixes, some needing escapes."""
    out: list[str] = []
    while len(out) < k:
        r = rng.random()
        word = (rng.choice(IDENTS) if r < 0.5 else "" if r < 0.55
                else (out[-1] + rng.choice("ab\"\u00e9") if out and r < 0.7 else rand_text(rng)))
        if word not in out:
            out.append(word)
    return out


def rand_value_schema(rng: random.Random, depth: int) -> object:
    kinds = ["string", "enum", "typed_enum", "integer", "number", "boolean", "null", "array",
             "object", "multi", "int_enum", "empty", "described"]
    kind = rng.choice(kinds if depth < 2 else kinds[:7])
    if kind in ("enum", "typed_enum"):
        schema: dict = {"enum": rand_words(rng, rng.randint(1, 5))}
        return {"type": "string", **schema} if kind == "typed_enum" else schema
    if kind == "array":
        return {"type": "array", "items": rand_value_schema(rng, depth + 1)}
    if kind == "object":
        return rand_parameters(rng, depth + 1)
    if kind == "multi":
        return {"type": rng.sample(["string", "integer", "null", "array"], 2),
                "items": {"type": "string"}}
    if kind == "int_enum":
        return {"enum": [1, 2, "three"]} if rng.random() < 0.5 else {"type": "integer", "enum": [1, 2]}
    if kind == "empty":
        return rng.choice([{}, True])
    if kind == "described":
        return {"type": rng.choice(SCALARS), "description": rand_text(rng)}
    return {"type": kind}


def rand_parameters(rng: random.Random, depth: int = 0) -> object:
    r = rng.random()
    if depth == 0 and r < 0.04:
        return None  # no parameters at all
    if r < 0.08:
        return {"type": "object"}  # no properties: any arguments
    keys = rand_words(rng, rng.choice([0, 1, 2, 3, 3, 4, 5]))
    params: dict = {"type": "object",
                    "properties": {k: rand_value_schema(rng, depth) for k in keys}}
    if keys and rng.random() < 0.5:
        params["required"] = rng.sample(keys, rng.randint(1, len(keys)))
    extra = rng.choice(["absent", False, True, {"type": "string"}])
    if extra != "absent":
        params["additionalProperties"] = extra
    return params


def rand_tools(rng: random.Random) -> list[dict]:
    tools = []
    for name in rng.sample(TOOL_NAMES, rng.randint(1, 4)):
        fn: dict = {"name": name, "description": rand_text(rng)}
        params = rand_parameters(rng)
        if params is not None:
            fn["parameters"] = params
        tools.append({"type": "function", "function": fn} if rng.random() < 0.9 else fn)
    return tools


def fn_of(tool: dict) -> dict:
    return tool.get("function", tool)


# ---- what the grammar promises (checked with tests/helpers/json_schema_check.py) ------------


def promised(params: object) -> dict:
    """The part of a tool's schema the grammar enforces (engine/constrained/grammar.py's
    docstring): with `properties` and no `additionalProperties: true`, only those names, and a
    single scalar `type` or a string `enum` per name; nothing deeper, `required` not enforced."""
    props = params.get("properties") if isinstance(params, dict) else None
    if not isinstance(props, dict) or params.get("additionalProperties") is True:
        return {"type": "object"}
    out = {}
    for key, schema in props.items():
        out[key] = {}
        if isinstance(schema, dict):
            enum = schema.get("enum")
            if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
                out[key] = {"enum": enum}
            elif enum is None and schema.get("type") in SCALARS:
                out[key] = {"type": schema["type"]}
    return {"type": "object", "properties": out, "additionalProperties": False}


# ---- random valid JSON text (a run's guide) ----------------------------------------------------


def ws(rng: random.Random) -> str:
    return "" if rng.random() < 0.6 else "".join(rng.choice(" \t\n\r")
                                                  for _ in range(rng.randint(1, MAX_WS)))


def string_json(rng: random.Random, text: str) -> str:
    """`text` as a JSON string, each character written raw or escaped, at random."""
    out = []
    for c in text:
        short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b",
                 "\f": "\\f"}.get(c)
        if rng.random() < 0.25 or short is not None or c < " ":
            if short is not None and rng.random() < 0.7:
                out.append(short)
            elif c == "/" and rng.random() < 0.5:
                out.append("\\/")
            else:
                units = c.encode("utf-16-be")
                out += ["\\u" + (units[k:k + 2].hex().upper() if rng.random() < 0.5
                                 else units[k:k + 2].hex()) for k in range(0, len(units), 2)]
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def number_json(rng: random.Random, integer: bool) -> str:
    digits = rng.choice(["0", str(rng.randint(1, 9)), str(rng.randint(10, 10**6)),
                         str(rng.randint(1, 9)) * rng.randint(15, 40)])
    text = ("-" if rng.random() < 0.3 else "") + digits
    if not integer:
        if rng.random() < 0.4:
            text += "." + str(rng.randint(0, 10**4)).zfill(rng.randint(1, 5))
        if rng.random() < 0.4:
            text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 300))
    return text


def any_json(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 2 or r < 0.5:
        return rng.choice([lambda: string_json(rng, rand_text(rng)), lambda: number_json(rng, False),
                           lambda: rng.choice(["true", "false", "null"])])()
    if r < 0.75:
        items = [ws(rng) + any_json(rng, depth + 1) + ws(rng) for _ in range(rng.randrange(3))]
        return "[" + (",".join(items) if items else ws(rng)) + "]"
    members = [ws(rng) + string_json(rng, rand_text(rng)) + ws(rng) + ":" + ws(rng)
               + any_json(rng, depth + 1) + ws(rng) for _ in range(rng.randrange(3))]
    return "{" + (",".join(members) if members else ws(rng)) + "}"


def value_json(rng: random.Random, schema: object, depth: int = 0) -> str:
    """Random JSON text valid for `schema` (the kinds rand_value_schema makes)."""
    if not isinstance(schema, dict):
        return any_json(rng, depth)
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        choice = rng.choice(enum)
        return json.dumps(choice, ensure_ascii=False)  # tries take the canonical spelling only
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = rng.choice(kind)
    if kind == "string":
        return string_json(rng, rand_text(rng))
    if kind in ("integer", "number"):
        return number_json(rng, kind == "integer")
    if kind == "boolean":
        return rng.choice(["true", "false"])
    if kind == "null":
        return "null"
    if kind == "array":
        items = [ws(rng) + value_json(rng, schema.get("items"), depth + 1) + ws(rng)
                 for _ in range(rng.randrange(3))]
        return "[" + (",".join(items) if items else ws(rng)) + "]"
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return object_json(rng, schema, depth + 1, canonical=False)
    return any_json(rng, depth)


def object_json(rng: random.Random, params: object, depth: int, canonical: bool) -> str:
    """A random object valid for `params` and inside what the grammar takes: declared names only
    unless the schema has no properties or allows any (canonical names at the top: a trie)."""
    props = params.get("properties") if isinstance(params, dict) else None
    limited = isinstance(props, dict) and params.get("additionalProperties") is not True
    members = []
    if isinstance(props, dict):
        required = params.get("required", [])
        for key, schema in props.items():
            if key in required or rng.random() < 0.5:
                name = json.dumps(key, ensure_ascii=False) if canonical and limited \
                    else string_json(rng, key)
                members.append((name, value_json(rng, schema, depth)))
    if not limited or not canonical:
        extra = props if isinstance(props, dict) else {}
        members += [(string_json(rng, k), any_json(rng, depth + 1))
                    for k in rand_words(rng, rng.randrange(3)) if k not in extra]
    rng.shuffle(members)
    if members and rng.random() < 0.1:
        members.append(members[0])  # a repeated name: JSON keeps the last, the grammar allows it
    body = ",".join(ws(rng) + k + ws(rng) + ":" + ws(rng) + v + ws(rng) for k, v in members)
    return "{" + (body if members else ws(rng)) + "}"


def call_json(rng: random.Random, dialect: str, tool: dict) -> str:
    fn = fn_of(tool)
    key = '"arguments"' if dialect == HERMES else '"parameters"'
    return ("{" + ws(rng) + '"name"' + ws(rng) + ":" + ws(rng)
            + json.dumps(fn["name"], ensure_ascii=False) + ws(rng) + "," + ws(rng) + key + ws(rng)
            + ":" + ws(rng) + object_json(rng, fn.get("parameters"), 0, canonical=True)
            + ws(rng) + "}")


FREE_TEXT = ["Sure.", "Let me check", " <tool", "<tool_call", " </tool_call> ", "a < b", "\n\n",
             "{not a call}", "caf\u00e9 \U0001f980", " <", "x", "<|python", "ok "]


def free_text(rng: random.Random, first: bool) -> str:
    """Text outside calls: never a whole `<tool_call>`, and at the output's start never what the
    parser reads as a bare Llama call (`{` or `<|python_tag|>` first; see the xfail test)."""
    while True:
        text = "".join(rng.choice(FREE_TEXT) for _ in range(rng.randrange(4)))
        lead = text.lstrip()
        if "<tool_call>" not in text and not (first and (lead.startswith("{")
                                                         or lead.startswith("<|python_tag|>"))):
            return text


def guide(rng: random.Random, dialect: str, mode: str, tools: list[dict], tag: int | None,
          end: int | None) -> list:
    """A valid output for this grammar: a list of text pieces and special token ids."""
    def block() -> str:
        return ("<tool_call>" + ws(rng) + call_json(rng, dialect, rng.choice(tools)) + ws(rng)
                + "</tool_call>")

    pieces: list = []
    if mode != "auto" and dialect == HERMES:
        pieces.append(ws(rng) + block())
    elif mode != "auto":
        if tag is not None and rng.random() < 0.5:
            pieces.append(tag)
        pieces.append(ws(rng) + call_json(rng, dialect, rng.choice(tools)))
    elif dialect == LLAMA3 and rng.random() < 0.5:  # a bare call opens the output
        pieces.append(rng.choice(["", " ", "\n\t", "\u3000\u00a0", " \u2009\n"]))
        r = rng.random()
        if r < 0.3 and tag is not None:
            pieces += [tag, ws(rng)]
        elif r < 0.6:
            pieces.append("<|python_tag|>" + ws(rng))
        pieces.append(call_json(rng, dialect, rng.choice(tools)))
    else:
        text = free_text(rng, first=True)
        for _ in range(rng.randrange(3)):
            text += block() + free_text(rng, first=False)
        pieces.append(text)
    if end is not None:
        pieces.append(end)
    return [p.encode() if isinstance(p, str) else p for p in pieces if p != ""]


# ---- completing a call: an explicit continuation from any state --------------------------------


def _trie_next(trie, node: int) -> int:
    """The first byte of the shortest way from `node` to the end of a word of `trie`."""
    queue, seen = deque([(node, None)]), {node}
    while queue:
        n, first = queue.popleft()
        if n in trie.payload:
            return first
        for b, child in sorted(trie.children[n].items()):
            if child not in seen:
                seen.add(child)
                queue.append((child, b if first is None else first))
    raise AssertionError(f"trie node {node} leads to no word")


def _closing_byte(g: CallGrammar, state) -> int:
    for frame in reversed(state):  # frames that may end without a byte pass it down
        kind = frame[0]
        if kind in (WS, TAG) or (kind == NUMBER and frame[1] in (1, 2, 4, 7, 9, 10)):
            continue
        if kind == LIT:
            return frame[1][frame[2]]
        if kind == TRIE:
            return _trie_next(g.tries[frame[1]], frame[2])
        if kind == HEX:
            return {"lo": ord("d"), "lod": ord("c")}.get(frame[2], ord("0"))
        simple = {STRING: '"', ESCAPE: "n", NUMBER: "0", VALUE: "0", ARGS: "{", MORE: "}",
                  ITEM: "]", NEXT: "]"}
        if kind in simple:
            return ord(simple[kind])
        if kind == KEY:
            return ord("}" if frame[2] else '"')
        if kind == TYPED:
            kind = frame[1]
            return ord({"string": '"', "boolean": "t", "null": "n"}.get(kind, "0")
                       if isinstance(kind, str) else '"')
        raise AssertionError(f"no way on from frame {frame!r} in {state!r}")
    raise AssertionError(f"empty state {state!r}")


def closing(g: CallGrammar, state) -> bytes:
    """Bytes that take `state` to one where the turn may end, each accepted by the grammar."""
    out = bytearray()
    while not g.may_end(state):
        b = _closing_byte(g, state)
        nxt = g.step(state, b)
        assert nxt is not None, f"the completion's byte {chr(b)!r} is refused in {state!r}"
        out.append(b)
        state = nxt
        assert len(out) < 10_000, f"no completion from {state!r}"
    return bytes(out)


def closing_bound(g: CallGrammar, state) -> int:
    """At most this many bytes complete a state: a few per frame, and at most two words of tries
    (a property's name, then its enum value). No word is longer than its trie has nodes."""
    longest = max((len(t.children) for t in g.tries), default=0)
    return len(state) * (len(b"</tool_call>") + 8) + 2 * longest


# ---- driving a matcher with random tokens --------------------------------------------------------


@dataclass
class Vocab:
    """What a run needs of a vocabulary besides its TokenVocab."""

    tv: TokenVocab
    ends: list[int]
    raw: list[str]  # each special's text, as skip_special_tokens=False shows it
    short: np.ndarray = field(init=False)
    special: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.short = np.array([b is not None and len(b) <= 2 for b in self.tv.bytes])
        self.special = np.array([b is None for b in self.tv.bytes])

    def prefixes_of(self, data: bytes) -> list[int]:
        """Tokens whose bytes are a (non-empty) prefix of `data`."""
        trie, node, out = self.tv.trie, 0, []
        for b in data[:48]:
            node = trie.children[node].get(b)
            if node is None:
                break
            out += trie.ends[node]
        return out


@dataclass
class Run:
    tokens: list[int]
    calls: int  # calls the grammar saw completed
    ended: bool  # on an end-of-turn token (else the step budget ran out in free text)
    followed: bool  # the guide was followed to its end


def in_call(state) -> bool:
    return not (len(state) == 1 and state[0][0] in (FREE, START, END))


def brute_force_allowed(g: CallGrammar, tv: TokenVocab, state, ends) -> np.ndarray:
    allowed = np.zeros(tv.size, dtype=bool)
    for i, b in enumerate(tv.bytes):
        if b is not None:
            allowed[i] = g.walk(state, b) is not None
        else:
            allowed[i] = (g.may_end(state) and i in ends) or \
                g.special(state, python_tag=i == tv.python_tag) is not None
    return allowed


def drive(rng: random.Random, masks: CallMasks, vocab: Vocab, plan: list, brute: bool,
          deviate: bool) -> Run:
    """Follow `plan` (until a random step, if `deviate`), then take random allowed tokens for a
    while, then finish along `closing` and end the turn. Checks every step (module docstring)."""
    g, tv = masks.grammar, masks.vocab
    matcher = ToolCallMatcher(masks)
    tokens: list[int] = []
    calls, piece, pos = 0, 0, 0
    deviate_at = rng.randrange(1, 60) if deviate else None
    explore = rng.randrange(0, 40)
    limit = 400 + sum(len(p) if isinstance(p, bytes) else 1 for p in plan)
    for step in range(limit):
        state = matcher.state
        mask = matcher.disallowed()
        if mask is None:
            assert g.in_free_text(state) or g.at_start(state), f"unmasked row in {state!r}"
        allowed = np.ones(tv.size, dtype=bool) if mask is None else ~mask
        assert allowed.any(), f"dead end: no token may follow {state!r}"
        if brute:
            want = brute_force_allowed(g, tv, state, masks.end_ids)
            assert (allowed == want).all(), (state, np.flatnonzero(allowed != want)[:10])
        close = closing(g, state)
        assert len(close) <= closing_bound(g, state), (state, close)
        if step == deviate_at:
            piece = len(plan)  # the plan is dropped here
        token, guided = None, piece < len(plan)
        if guided:
            target = plan[piece]
            if isinstance(target, int):  # a special token
                token, piece = target, piece + 1
            else:
                fits = [t for t in vocab.prefixes_of(target[pos:]) if allowed[t]]
                assert fits, (f"a valid output is refused at {target[pos:pos + 30]!r} "
                              f"(piece {piece} of {plan!r:.600}) in {state!r}")
                token = max(fits, key=lambda t: len(tv.bytes[t])) if rng.random() < 0.5 \
                    else rng.choice(fits)
                pos += len(tv.bytes[token])
                if pos == len(target):
                    piece, pos = piece + 1, 0
        elif explore > 0:
            explore -= 1
            r, pool = rng.random(), allowed
            if r < 0.5 and (pool & vocab.short).any():
                pool = pool & vocab.short
            elif r < 0.6 and (pool & vocab.special).any():
                pool = pool & vocab.special
            token = int(rng.choice(np.flatnonzero(pool)))
        elif not close:  # finish: along the completion, then an end of turn
            if not masks.end_ids:
                return Run(tokens, calls, False, False)
            token = rng.choice(masks.end_ids)
        else:
            fits = [t for t in vocab.prefixes_of(close) if allowed[t]]
            assert fits, f"no token goes on with the completion {close!r} of {state!r}"
            token = rng.choice(fits)
        assert allowed[token], (token, state)
        tokens.append(token)
        if token in masks.end_ids and g.may_end(state):
            return Run(tokens, calls, True, guided and piece == len(plan))
        matcher.advance(token)
        assert matcher.state is not None, (token, tv.bytes[token], state)
        calls += in_call(state) and not in_call(matcher.state)
    raise AssertionError(f"no end after {limit} tokens, in {matcher.state!r}")


def output_text(tv: TokenVocab, tokens: list[int], raw: list[str] | None = None) -> str:
    """What the engine's detokenizer gives: token bytes as UTF-8 (lossy), specials dropped, or
    written out (`raw`, skip_special_tokens=False); the final end-of-turn token never shows."""
    data = bytearray()
    for t in tokens:
        b = tv.bytes[t]
        if b is not None:
            data += b
        elif raw is not None:
            data += raw[t].encode()
    return data.decode("utf-8", errors="replace")


def check_output(text: str, run: Run, tools: list[dict], choice, dialect: str, can_end: bool,
                 rng: random.Random) -> None:
    parsed = parse_tool_calls(text)
    where = f"{text!r:.1500}"
    assert parsed.errors == [], (parsed.errors, where)
    assert len(parsed.tool_calls) == run.calls, where
    schemas = {fn_of(t)["name"]: promised(fn_of(t).get("parameters")) for t in tools}
    names = [choice["function"]["name"]] if isinstance(choice, dict) else list(schemas)
    for call in parsed.tool_calls:
        assert call.name in names, where
        assert schema_errors(call.arguments, schemas[call.name]) == [], where
        json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")  # no lone surrogates
    if choice != "auto":
        lead = len(text) - len(text.lstrip(" \t\r\n"))
        assert run.calls >= 1 and lead <= MAX_WS, where
        assert text[lead:].startswith("<tool_call>" if dialect == HERMES else "{"), where
        if can_end:
            assert run.calls == 1 and parsed.content == "", where
    # The streaming parser, fed in random pieces, ends with the same result.
    stream, k = StreamingToolParser(), 0
    while k < len(text):
        n = rng.randint(1, 12)
        stream.feed(text[k:k + n])
        k += n
    assert stream.finish() == parsed, where


# ---- vocabularies -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm(smollm_tokenizer) -> tuple[ToolConstraints, Vocab]:
    tok = smollm_tokenizer
    constraints = ToolConstraints(tok, tok.vocab_size)
    raw = tok.convert_ids_to_tokens(list(range(tok.vocab_size)))
    return constraints, Vocab(constraints.vocab, list(tok.eos_token_ids), raw)


@pytest.fixture(scope="module")
def llama_tok(tmp_path_factory) -> Tokenizer:
    from tests.helpers.llama3_tokenizer import tokenizer_folder

    path = tmp_path_factory.mktemp("fuzz-llama3-tokenizer")
    tokenizer_folder(path)
    return Tokenizer.from_hf_folder(path)


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory) -> Tokenizer:
    """The same BPE with Qwen's shape: ChatML, and <tool_call>, </tool_call> as added tokens that
    are not special (they show in the text), so one token opens or closes a whole block."""
    from tokenizers import AddedToken

    from engine.chat import CHATML_TEMPLATE
    from tests.helpers.llama3_tokenizer import train_tokenizer

    hf = train_tokenizer()
    hf.add_tokens([AddedToken("<tool_call>", special=False),
                   AddedToken("</tool_call>", special=False)])
    hf.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    path = tmp_path_factory.mktemp("fuzz-qwen-tokenizer")
    hf.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "chat_template": CHATML_TEMPLATE}))
    return Tokenizer.from_hf_folder(path)


def llama_vocab(tok: Tokenizer, dialect: str | None) -> tuple[ToolConstraints, Vocab]:
    constraints = ToolConstraints(tok, tok.vocab_size, dialect=dialect)
    raw = tok.convert_ids_to_tokens(list(range(tok.vocab_size)))
    return constraints, Vocab(constraints.vocab, list(tok.eos_token_ids), raw)


def rand_choice(rng: random.Random, tools: list[dict]):
    r = rng.random()
    if r < 0.4:
        return "auto"
    if r < 0.7:
        return "required"
    return {"type": "function", "function": {"name": fn_of(rng.choice(tools))["name"]}}


def fuzz(rng: random.Random, constraints: ToolConstraints, vocab: Vocab, runs: int,
         brute_every: int) -> dict[str, int]:
    dialect = constraints.dialect
    stats = {"runs": 0, "calls": 0, "followed": 0, "free_text_end": 0}
    for i in range(runs):
        tools = rand_tools(rng)
        choice = rand_choice(rng, tools)
        # Without end-of-turn tokens (ignore_eos) a forced call is followed by free text; the
        # parser reads a Llama call only when nothing follows it, so that is Hermes-only here.
        can_end = dialect == LLAMA3 or rng.random() < 0.85
        matcher = constraints.matcher(tools, choice, vocab.ends if can_end else [])
        assert matcher is not None
        offered = tools
        if isinstance(choice, dict):
            offered = [t for t in tools if fn_of(t)["name"] == choice["function"]["name"]][:1]
        plan = guide(rng, dialect, "auto" if choice == "auto" else "forced", offered,
                     matcher.masks.vocab.python_tag, rng.choice(vocab.ends) if can_end else None)
        run = drive(rng, matcher.masks, vocab, plan, brute=brute_every > 0 and i % brute_every == 0,
                    deviate=rng.random() < 0.4)
        text = output_text(vocab.tv, run.tokens)
        check_output(text, run, tools, choice, dialect, can_end, rng)
        only_tag = all(vocab.tv.bytes[t] is not None or t in (vocab.tv.python_tag, *vocab.ends)
                       for t in run.tokens)
        if dialect == LLAMA3 and choice != "auto" and only_tag:
            # skip_special_tokens=False: the output shows <|python_tag|> before the call.
            raw = output_text(vocab.tv, [t for t in run.tokens if t not in vocab.ends], vocab.raw)
            parsed = parse_tool_calls(raw)
            assert parsed.errors == [] and len(parsed.tool_calls) == 1, raw
        stats["runs"] += 1
        stats["calls"] += run.calls
        stats["followed"] += run.followed
        stats["free_text_end"] += not run.ended
    return stats


# ---- the fuzz ------------------------------------------------------------------------------------


def test_fuzz_smollm_hermes_calls(smollm):
    constraints, vocab = smollm
    assert constraints.dialect == HERMES
    stats = fuzz(random.Random(SEED), constraints, vocab, runs=70, brute_every=0)
    assert stats["calls"] >= stats["runs"] // 2 and stats["followed"] >= stats["runs"] // 3, stats


def test_fuzz_llama3_vocab_llama_calls_with_brute_force_masks(llama_tok):
    constraints, vocab = llama_vocab(llama_tok, None)
    assert constraints.dialect == LLAMA3 and vocab.tv.python_tag is not None
    stats = fuzz(random.Random(SEED + 1), constraints, vocab, runs=60, brute_every=3)
    assert stats["calls"] >= stats["runs"] // 2, stats


def test_fuzz_llama3_vocab_hermes_calls_with_brute_force_masks(llama_tok):
    # A Hermes fine-tune of Llama 3: <|python_tag|> is a special token, free text may hold it.
    constraints, vocab = llama_vocab(llama_tok, HERMES)
    stats = fuzz(random.Random(SEED + 2), constraints, vocab, runs=40, brute_every=3)
    assert stats["calls"] >= stats["runs"] // 2, stats


def test_fuzz_qwen_style_vocab_whole_tag_tokens_with_brute_force_masks(qwen_tok):
    constraints, vocab = llama_vocab(qwen_tok, None)
    assert constraints.dialect == HERMES and len(vocab.tv.holding_open_tag) == 1
    stats = fuzz(random.Random(SEED + 6), constraints, vocab, runs=40, brute_every=3)
    assert stats["calls"] >= stats["runs"] // 2, stats


def test_smollm_masks_equal_a_brute_force_walk_at_random_states(smollm):
    """SmolLM2's 49k tokens are too many to brute-force every step; a few random states."""
    constraints, vocab = smollm
    rng = random.Random(SEED + 3)
    checked = 0
    while checked < 4:
        tools = rand_tools(rng)
        choice = rand_choice(rng, tools)
        matcher = constraints.matcher(tools, choice, vocab.ends)
        g = matcher.masks.grammar
        plan = guide(rng, HERMES, "auto" if choice == "auto" else "forced",
                     tools if not isinstance(choice, dict) else
                     [t for t in tools if fn_of(t)["name"] == choice["function"]["name"]], None,
                     None)
        text = b"".join(p for p in plan if isinstance(p, bytes))
        state = g.walk(g.initial, text[:rng.randrange(len(text) + 1)])
        assert state is not None
        if g.in_free_text(state) and rng.random() < 0.7:
            continue  # free text's masks are checked by test_tool_grammar; favour calls
        want = brute_force_allowed(g, vocab.tv, state, matcher.masks.end_ids)
        mask = matcher.masks.disallowed(state)
        got = np.ones(vocab.tv.size, dtype=bool) if mask is None else ~mask
        assert (got == want).all(), (state, np.flatnonzero(got != want)[:10])
        checked += 1


# ---- tool_choice and malformed tools --------------------------------------------------------------


def test_tool_choice_variants_over_fuzzed_tools(smollm):
    constraints, vocab = smollm
    rng = random.Random(SEED + 4)
    for _ in range(30):
        tools = rand_tools(rng)
        names = sorted(fn_of(t)["name"] for t in tools)
        assert constraints.matcher(tools, "none", vocab.ends) is None
        assert constraints.matcher(None, "auto", vocab.ends) is None
        assert constraints.matcher([], "auto", vocab.ends) is None
        with pytest.raises(ValueError, match="tool_choice='required' needs tools"):
            constraints.matcher(None, "required", vocab.ends)
        with pytest.raises(ValueError, match="not one of the tools offered"):
            constraints.matcher(tools, {"type": "function", "function": {"name": "nope"}},
                                vocab.ends)
        auto = constraints.matcher(tools, "auto", vocab.ends)
        g = auto.masks.grammar
        assert g.mode == "auto" and sorted(t.name for t in g.tools) == names
        required = constraints.matcher(tools, "required", vocab.ends).masks.grammar
        assert required.mode == "required" and sorted(t.name for t in required.tools) == names
        name = rng.choice(names)
        named = constraints.matcher(tools, {"type": "function", "function": {"name": name}},
                                    vocab.ends).masks.grammar
        assert named.mode == "named" and [t.name for t in named.tools] == [name]
        # No other name can be written: every name byte-path in the named grammar's trie is it.
        prefix = b"<tool_call>{\"name\": \""
        state = named.walk(named.initial, prefix)
        for other in names:
            data = json.dumps(other, ensure_ascii=False).encode()[1:]
            assert (named.walk(state, data) is not None) == (other == name)
        # "required": no free text first, and only a short whitespace run.
        assert required.walk(required.initial, b"x") is None
        assert g.walk(g.initial, b"x") is not None


@pytest.mark.parametrize("tools,index", [
    ([{"type": "function", "function": {"name": "ok"}}, "not a dict"], 1),
    ([{"type": "function", "function": {"name": ""}}], 0),
    ([{"type": "function", "function": {"name": 7}}], 0),
    ([{"type": "function", "function": {"parameters": {}}}], 0),
    ([{"type": "function", "function": None}], 0),
])
def test_malformed_tools_are_refused_naming_the_tool(smollm, tools, index):
    constraints, vocab = smollm
    with pytest.raises(ValueError, match=rf"tools\[{index}\]"):
        constraints.matcher(tools, "auto", vocab.ends)


def test_odd_but_accepted_schemas_build_grammars(smollm):
    """Schemas outside the typed subset are taken, as any JSON, never a crash."""
    constraints, vocab = smollm
    odd = [{"type": "string"}, "not a schema", {"properties": ["a"]},
           {"type": "object", "properties": {"a": None, "b": [], "c": {"enum": []},
                                             "d": {"type": ["string"]}, "e": {"enum": None,
                                                                               "type": "null"}}},
           {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}]
    for params in odd:
        tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
        for choice in ("auto", "required"):
            assert constraints.matcher(tools, choice, vocab.ends) is not None
    assert tool_specs([{"name": "f", "parameters": odd[3]}])[0].keys == (
        ("a", "any"), ("b", "any"), ("c", "any"), ("d", "any"), ("e", "null"))


# ---- defects found on the way (each test failed before its fix) ------------------------------------

NUMBERS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer"}, "x": {"type": "number"}, "a": {}, "t": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("key", ["n", "x", "a"])
def test_an_integer_longer_than_python_reads_cannot_be_written(key):
    """json.loads raises ValueError on an integer of more than sys.get_int_max_str_digits()
    digits (4300 by default, 640 at the least), so the grammar ends integer parts at 640 digits:
    before, a model looping on digits got a call the parser could not read (it raised)."""
    g = CallGrammar(tool_specs(NUMBERS), "required")
    prefix = f'<tool_call>{{"name": "f", "arguments": {{"{key}": -'.encode()
    limit = sys.int_info.str_digits_check_threshold
    state = g.walk(g.initial, prefix + b"9" * limit)
    assert state is not None and g.step(state, ord("9")) is None
    text = prefix + b"9" * limit + b"}}</tool_call>"
    assert g.may_end(g.walk(g.initial, text))
    parsed = parse_tool_calls(text.decode())
    assert parsed.errors == [] and len(parsed.tool_calls) == 1
    if key != "n":  # with a fraction or an exponent it is a float, which has no such limit
        tail = b".5e" + b"1" * 1000 + b"}}</tool_call>"
        assert g.may_end(g.walk(state, tail))
        assert parse_tool_calls((prefix + b"9" * limit + tail).decode()).tool_calls


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "f", "arguments": {"n": %s}}</tool_call>',
    '{"name": "f", "parameters": {"n": %s}}',
    '<|python_tag|>{"name": "f", "parameters": {"n": [%s',
    'Hi <tool_call>{"name": "f", "arguments": {"n": %s, }}</tool_call>',
])
def test_the_parser_reports_an_integer_too_long_for_python_instead_of_raising(text):
    text = text % ("1" * 5000)
    parsed = parse_tool_calls(text)
    assert not parsed.tool_calls and parsed.errors and "digits" in parsed.errors[-1]
    stream = StreamingToolParser()
    for k in range(0, len(text), 700):
        stream.feed(text[k:k + 700])
    assert stream.finish() == parsed


@pytest.mark.parametrize("escape,ok", [
    ("\\ud83d\\ude00", True), ("\\uD83D\\uDE00", True), ("\\uDBFF\\uDFFF", True),
    ("\\ud7ff", True), ("\\ue000", True), ("\\u00e9\\u0000", True),
    ("\\ud800", False), ("\\ud800x", False), ("\\udc00", False), ("\\uDfFF", False),
    ("\\ud800\\u0041", False), ("\\ud800\\ud800", False), ("\\ud800\\n", False),
])
@pytest.mark.parametrize("where", ["typed", "any", "key"])
def test_a_string_escape_cannot_leave_a_lone_surrogate(escape, ok, where):
    """json.loads reads "\\ud800" as a lone surrogate, which no UTF-8 writer takes (SQLite,
    where the agent stores calls, refuses it). A high surrogate escape must be
    followed by a low one, and a low one cannot stand alone."""
    g = CallGrammar(tool_specs(NUMBERS), "required")
    args = {"typed": '{"t": "a%sb"}', "any": '{"a": ["%s"]}', "key": '{"%s": 1}'}[where]
    name = "g" if where == "key" else "f"
    text = f'<tool_call>{{"name": "{name}", "arguments": {args % escape}}}</tool_call>'
    state = g.walk(g.initial, text.encode())
    assert (state is not None and g.may_end(state)) == ok
    if ok:
        call = parse_tool_calls(text).tool_calls[0]
        json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")


@pytest.mark.xfail(strict=True, reason="design gap, reported: in Hermes 'auto' the grammar "
                   "leaves the output's start free, but the parser reads an output that is one "
                   "bare JSON call (or starts with the text <|python_tag|>) as a Llama call")
@pytest.mark.parametrize("text", [
    '{"name": "not_offered", "arguments": {"any": "thing"}}',
    '<|python_tag|> <tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>',
    '{"name": <tool_call>{"name": "f", "arguments": {"n": 1}}</tool_call>',
])
def test_hermes_auto_output_never_reads_as_an_unconstrained_call(text):
    g = CallGrammar(tool_specs(NUMBERS), "auto")
    state = g.walk(g.initial, text.encode())
    parsed = parse_tool_calls(text)
    assert state is None or (parsed.errors == [] and {c.name for c in parsed.tool_calls} <= {"f"}
                             and len(parsed.tool_calls) == text.count("<tool_call>"))


# ---- the embedded model, end to end -------------------------------------------------------------


def test_embedded_smollm_samples_at_temperature_one_hold_end_to_end(smollm):
    """A handful of SmolLM2 requests at temperature 1.0 through engine.LLM, on fuzzed tools and
    a fixed awkward one: every sampled token was allowed by a fresh matcher; a finished output
    parses as in the fuzz, one cut by max_tokens does once completed."""
    from engine import LLM, SamplingParams

    llm = LLM(kv_cache_gib=0.05, max_model_len=1024)
    engine, (_, vocab) = llm.engine, smollm
    rng = random.Random(SEED + 5)
    awkward = [{"type": "function", "function": {"name": "set_alarm", "parameters": {
        "type": "object", "properties": {
            "hour": {"type": "integer"}, "label\n\"x\"": {"type": "string"},
            "repeat": {"enum": ["none", "daily", "caf\u00e9 \"\u4e2d\"\\"]}, "on": {"type": "boolean"},
            "level": {"type": "number"}}, "required": ["hour"], "additionalProperties": False}}}]
    cases = [(awkward, "required"), (awkward, {"type": "function", "function": {"name": "set_alarm"}})]
    while len(cases) < 5:
        tools = rand_tools(rng)
        cases.append((tools, rand_choice(rng, tools) if len(cases) < 4 else "auto"))
    ends = sorted(set(engine.chat_formatter.stop_token_ids))
    for i, (tools, choice) in enumerate(cases):
        prompt = engine.encode_chat([{"role": "user", "content": "Wake me at 7, daily."}], tools)
        engine.add_request(f"e2e{i}", prompt, SamplingParams(
            temperature=1.0, seed=SEED + i, max_tokens=40, tool_choice=choice), tools=tools)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    for i, (tools, choice) in enumerate(cases):
        out = outs[f"e2e{i}"]
        matcher = engine.tool_constraints.matcher(tools, choice, ends)
        g, calls = matcher.masks.grammar, 0
        for token in out.token_ids:
            mask = matcher.disallowed()
            assert mask is None or not mask[token], (i, out.text)
            if token in ends and g.may_end(matcher.state):
                break
            state = matcher.state
            matcher.advance(token)
            calls += in_call(state) and not in_call(matcher.state)
        if out.finish_reason == "stop":
            text = out.text
            assert text == output_text(vocab.tv, out.token_ids)
        else:  # cut by max_tokens: complete it
            close = closing(g, matcher.state)
            calls += in_call(matcher.state) and bool(close)
            text = output_text(vocab.tv, out.token_ids) + close.decode("utf-8", errors="replace")
        check_output(text, Run(list(out.token_ids), calls, True, False), tools, choice, HERMES,
                     True, rng)
