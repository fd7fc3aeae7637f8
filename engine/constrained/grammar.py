"""The byte-level automaton of tool calls: given the bytes so far, which byte may come next.

Two dialects, chosen by the model's chat template (see `tool_dialect`):

    hermes: <tool_call> WS CALL("arguments") WS </tool_call>
    llama3: [<|python_tag|>] WS CALL("parameters")
    CALL(key) = {WS "name" WS : WS "<tool name>" WS , WS key WS : WS <object> WS}

with JSON values inside the arguments (strings with escapes, numbers, nested objects and arrays,
true/false/null). Each whitespace run is at most MAX_WS bytes, so a model cannot loop on spaces.
Two limits keep what passes readable by `json.loads` into text that can be stored: an integer part
has at most MAX_INT_DIGITS digits, and `\\u` escapes of surrogates come only in high-low pairs.
When a tool declares `parameters.properties` and does not set `additionalProperties: true`, the
top-level argument names are limited to those properties, and a property whose schema is a single
`type` of boolean, integer, number, string or null, or a string `enum`, gets a value of that type.
Anything else (other schemas, nested keys and values) is any JSON. Required properties are not
enforced, and a property may repeat (JSON keeps the last).

Llama 3.1 (the key its template asks for is "parameters"; the grammar takes only that key, which
`engine.tool_parser` reads, so what the grammar lets through always parses as a call):
- A call is the whole output, as `engine.tool_parser` reads it: in "auto" the output opens a call
  when its first non-whitespace bytes are `{`, or with `<|python_tag|>` (the special token, or
  those bytes as text) there. Any other start is free text, in which Hermes `<tool_call>` blocks
  are still constrained (the parser reads those in any output), with "parameters" as their key.
- `<|python_tag|>` is a special token, so it has no bytes: `CallGrammar.special` says where it may
  come. It may open the output's call (in "auto" at the start, in a forced turn as the first
  token); anywhere else it is refused, since the parser would not read a call after it.
- After a Llama call, only an end-of-turn token (Llama 3.1 ends a call with <|eom_id|> or
  <|eot_id|>), in "auto" as in forced turns: the parser reads a Llama call only when nothing
  follows it. Without end-of-turn tokens (`can_end=False`, e.g. ignore_eos) free text follows.

A state is an immutable tuple of frames, a pushdown stack with its top last, so states hash and
the masks built for them can be cached. `step(state, byte)` returns the next state or None.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

OPEN_TAG = b"<tool_call>"
CLOSE_TAG = b"</tool_call>"
PYTHON_TAG = b"<|python_tag|>"  # Llama 3.1: a special token, also read by the parser as text
HERMES, LLAMA3 = "hermes", "llama3"  # the tool-call dialects
MAX_WS = 8  # whitespace bytes allowed in a row between JSON tokens
MAX_FRAMES = 160  # deep nesting is refused past this stack height (about 25 levels)
# json.loads raises ValueError on an integer of more than sys.get_int_max_str_digits() digits
# (4300 by default; 640 is the least it can be set to), so a model looping on digits would make
# a call the parser cannot read. Integer parts stop at the least limit, whatever the setting.
MAX_INT_DIGITS = sys.int_info.str_digits_check_threshold

State = tuple[tuple, ...]

# Frame kinds. A frame is (kind, ...); see `CallGrammar.step` for what each accepts.
FREE = 0  # (FREE, k[, 1]): text outside a call, the last k bytes being a prefix of OPEN_TAG;
#           with the 1, after the one call a single-call grammar allows: no call opens
LIT = 1  # (LIT, bytes, pos): these exact bytes
WS = 2  # (WS, n): optional whitespace, n bytes of it so far
TRIE = 3  # (TRIE, trie index, node): one of a set of strings (tool names, property names)
VALUE = 4  # (VALUE,): any JSON value
ARGS = 5  # (ARGS, key trie index or -1): a JSON object, the arguments
KEY = 6  # (KEY, key trie index or -1, first): a member's key, or "}" when first
MORE = 7  # (MORE, key trie index or -1): "," and another member, or "}"
ITEM = 8  # (ITEM,): the first item of an array, or "]"
NEXT = 9  # (NEXT,): "," and another item, or "]"
STRING = 10  # (STRING,): inside a string
ESCAPE = 11  # (ESCAPE,): after a backslash in a string
HEX = 12  # (HEX, n, unit): n hex digits of a \u escape still to come; `unit` see _hex
NUMBER = 13  # (NUMBER, phase, digits): see _number_next; digits of the integer part in 2 and 10
END = 14  # (END,): after a forced call: nothing but an end-of-turn token
TYPED = 15  # (TYPED, type name or enum trie index): a value of one JSON type, or one enum string
START = 16  # (START, pending): "auto" Llama output of only whitespace so far; `pending` holds the
#             bytes of a multi-byte space or of a textual `<|python_tag|>` begun but not finished
TAG = 17  # (TAG,): the special token <|python_tag|> may come here; a byte passes to the frame below

_WS_BYTES = frozenset(b" \t\n\r")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPABLE = frozenset(b'"\\/bfnrt')
_DIGITS = frozenset(b"0123456789")
_HIGH_2ND = frozenset(b"89abAB")  # a \uD8xx-\uDBxx escape is a high surrogate, DCxx-DFxx low
_LOW_2ND = frozenset(b"cdefCDEF")
_W0 = (WS, 0)
_STRING = (STRING,)
# What str.strip() removes (so the parser still sees the output's start), as UTF-8: every
# character for which str.isspace() holds, and the proper prefixes of the multi-byte ones.
_SPACES = frozenset(c.encode() for c in (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
    + "".join(map(chr, range(0x2000, 0x200B)))))
_SPACE_PREFIXES = frozenset(c[:k] for c in _SPACES for k in range(1, len(c)))

# Number phases: 0 after "-", 1 after a leading 0, 2 in integer digits, 3 after ".", 4 in
# fraction digits, 5 after "e", 6 after the exponent's sign, 7 in exponent digits; integers
# only: 8 after "-", 9 after a leading 0, 10 in digits. A byte the phase cannot take ends the
# number (if it may end there) and goes to the frame below.
_NUMBER_CAN_END = frozenset({1, 2, 4, 7, 9, 10})


def _number_next(phase: int, b: int) -> int | None:
    digit = b in _DIGITS
    if phase in (0, 8):
        return ((1 if b == 0x30 else 2) + phase) if digit else None
    if phase == 10:
        return 10 if digit else None
    if phase == 9:
        return None
    if phase in (1, 2, 4) and b in b"eE":
        return 5
    if phase in (1, 2) and b == 0x2E:
        return 3
    if phase in (2, 3, 4) and digit:
        return 4 if phase != 2 else 2
    if phase == 5 and b in b"+-":
        return 6
    if phase in (5, 6, 7) and digit:
        return 7
    return None


def tool_dialect(template: str | None) -> str:
    """The tool-call form a chat template asks for: LLAMA3 or HERMES (the module docstring shows both).

    LLAMA3 when the template writes Llama 3's turn headers and its own call form, that is it
    mentions `<|python_tag|>` (Llama 3.1, 3.3) or a `"parameters"` key (3.1, 3.2, 3.3), and
    does not ask for `<tool_call>` blocks (as Hermes-style fine-tunes of Llama 3 do). Anything
    else, Llama 3.0 (no tool form of its own) and templates we do not know included, is HERMES:
    the form our own tool prompt then asks for.
    """
    t = template or ""
    llama = "<|start_header_id|>" in t and ("<|python_tag|>" in t or '"parameters"' in t)
    return LLAMA3 if llama and "<tool_call>" not in t else HERMES


_SCALAR_TYPES = ("boolean", "integer", "number", "string", "null")

# What a property's value may be: "any", a name from _SCALAR_TYPES, or a tuple of enum strings.
ValueType = str | tuple[str, ...]


@dataclass(frozen=True)
class ToolSpec:
    """What the grammar needs of one offered tool: its name and, if limited, its arguments."""

    name: str
    keys: tuple[tuple[str, ValueType], ...] | None  # None: any argument names and values


def tool_specs(tools: Sequence[Any]) -> list[ToolSpec]:
    """OpenAI-style tool definitions as ToolSpecs; raises ValueError naming a malformed tool."""
    specs = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}]: expected {{'type': 'function', 'function': "
                             f"{{'name': ..., 'parameters': {{...}}}}}}, got {tool!r:.200}")
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        limited = isinstance(props, dict) and params.get("additionalProperties") is not True
        keys = tuple((str(k), _value_type(v)) for k, v in props.items()) if limited else None
        specs.append(ToolSpec(fn["name"], keys))
    return specs


def _value_type(schema: Any) -> ValueType:
    if not isinstance(schema, dict):
        return "any"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
        return tuple(enum)
    kind = schema.get("type")
    return kind if enum is None and kind in _SCALAR_TYPES else "any"


class _Trie:
    """Byte trie of JSON string contents, each ending with its closing quote."""

    def __init__(self, words: Sequence[str], payloads: Sequence[tuple]) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.payload: dict[int, tuple] = {}  # node -> frames to push when the string ends there
        for word, payload in zip(words, payloads, strict=True):
            node = 0
            for b in json.dumps(word, ensure_ascii=False).encode()[1:]:
                nxt = self.children[node].get(b)
                if nxt is None:
                    nxt = len(self.children)
                    self.children.append({})
                    self.children[node][b] = nxt
                node = nxt
            self.payload[node] = payload


class CallGrammar:
    """Tool calls over one set of tools, in one tool_choice mode and one dialect.

    `mode`: "auto" (free text; a call the text opens must be valid), "required" (the output is
    one call, then the end of the turn) or "named" (the same, with one tool). A forced turn holds
    exactly one call: further calls come in later turns, or in "auto" turns, where a Hermes model
    may open several. `can_end`: whether the request has end-of-turn tokens; without them a
    forced call is followed by free text, still watched for Hermes calls. `dialect`: HERMES or
    LLAMA3 (see the module docstring). `single` (OpenAI's parallel_tool_calls false): at most one
    call in the output; the text after it may not open another (the tag is refused once whole).
    """

    def __init__(self, tools: Sequence[ToolSpec], mode: str, can_end: bool = True,
                 dialect: str = HERMES, single: bool = False) -> None:
        if mode not in ("auto", "required", "named"):
            raise ValueError(f"unknown tool-call grammar mode {mode!r}")
        if dialect not in (HERMES, LLAMA3):
            raise ValueError(f"unknown tool-call dialect {dialect!r} (expected {HERMES!r} or "
                             f"{LLAMA3!r})")
        self.tools = tuple(tools)
        self.mode = mode
        self.dialect = dialect
        # The free text after a call: closed to further calls when only one is allowed.
        self.after_call: tuple = (FREE, 0, 1) if single else (FREE, 0)
        self.tries: list[_Trie] = []
        key_tries = []
        for tool in self.tools:
            if tool.keys is None:
                key_tries.append(-1)
                continue
            # After a property's name: ":" and its value (top last).
            after_key = [((TYPED, self._typed(kind)), _W0, (LIT, b":", 0), _W0)
                         for _, kind in tool.keys]
            self.tries.append(_Trie([k for k, _ in tool.keys], after_key))
            key_tries.append(len(self.tries) - 1)
        # After the name: , "arguments" : {...} (top last, like every frame tuple here).
        args_key = b'"arguments"' if dialect == HERMES else b'"parameters"'
        args_parts = [((ARGS, k), _W0, (LIT, b":", 0), _W0, (LIT, args_key, 0), _W0,
                       (LIT, b",", 0), _W0) for k in key_tries]
        self.tries.append(_Trie([t.name for t in self.tools], args_parts))
        names = len(self.tries) - 1
        # A call object after its "{", up to and including its "}".
        call: State = ((LIT, b"}", 0), _W0, (TRIE, names, 0), (LIT, b'"', 0), _W0, (LIT, b":", 0),
                       _W0, (LIT, b'"name"', 0), _W0)
        brace: State = ((LIT, b"{", 0), _W0)
        # Everything after a Hermes opening tag, up to and including the closing tag.
        self.body: State = ((LIT, CLOSE_TAG, 0), _W0) + call + brace
        forced = mode != "auto"
        after: State = ((END,),) if can_end and (forced or dialect == LLAMA3) else (self.after_call,)
        if dialect == HERMES:
            # A forced call may follow a short whitespace run: a SentencePiece model's natural
            # first token is "▁<" (a space its decoder drops at the start of the output).
            self.initial: State = (
                ((FREE, 0),) if not forced else after + self.body + ((LIT, OPEN_TAG, 0), _W0))
        else:
            self._opened = after + call  # a Llama call, after its "{"
            self._tagged = self._opened + brace  # after <|python_tag|>
            self.initial = ((START, b""),) if not forced else self._tagged + ((TAG,),)

    def _typed(self, kind: ValueType) -> str | int:
        if isinstance(kind, tuple):
            self.tries.append(_Trie(kind, [()] * len(kind)))
            return len(self.tries) - 1
        return kind

    # ---- the automaton -------------------------------------------------------------------

    def step(self, state: State, b: int) -> State | None:
        """The state after byte `b`, or None if `b` cannot come next."""
        while True:
            top = state[-1]
            kind = top[0]
            rest = state[:-1]
            if kind == STRING:
                if b == 0x22:
                    return rest
                if b == 0x5C:
                    return rest + ((ESCAPE,),)
                return None if b < 0x20 else state
            if kind == WS:
                if b in _WS_BYTES:
                    return rest + ((WS, top[1] + 1),) if top[1] < MAX_WS else None
                state = rest  # the run is over: the byte belongs to the frame below
                continue
            if kind == LIT:
                lit, pos = top[1], top[2]
                if lit[pos] != b:
                    return None
                return rest if pos + 1 == len(lit) else rest + ((LIT, lit, pos + 1),)
            if kind == TRIE:
                trie = self.tries[top[1]]
                node = trie.children[top[2]].get(b)
                if node is None:
                    return None
                payload = trie.payload.get(node)
                return rest + ((TRIE, top[1], node),) if payload is None else rest + payload
            if kind == NUMBER:
                phase = _number_next(top[1], b)
                if phase is not None:
                    digits = top[2] + 1 if phase in (2, 10) else 0  # see MAX_INT_DIGITS
                    return rest + ((NUMBER, phase, digits),) if digits <= MAX_INT_DIGITS else None
                if top[1] not in _NUMBER_CAN_END:
                    return None
                state = rest
                continue
            if kind == VALUE:
                return self._value(rest, b)
            if kind == KEY:
                if b == 0x22:
                    if top[1] < 0:
                        return rest + ((MORE, -1), _W0, (VALUE,), _W0, (LIT, b":", 0), _W0,
                                       _STRING)
                    if not self.tries[top[1]].children[0]:
                        return None  # the tool takes no arguments
                    return rest + ((MORE, top[1]), _W0, (TRIE, top[1], 0))
                return rest if b == 0x7D and top[2] else None
            if kind == TYPED:
                return self._typed_value(rest, top[1], b)
            if kind == MORE:
                if b == 0x2C:
                    return rest + ((KEY, top[1], False), _W0)
                return rest if b == 0x7D else None
            if kind == ITEM:
                if b == 0x5D:
                    return rest
                state = rest + ((NEXT,), _W0, (VALUE,))
                continue
            if kind == NEXT:
                if b == 0x2C:
                    return rest + ((NEXT,), _W0, (VALUE,), _W0)
                return rest if b == 0x5D else None
            if kind == ESCAPE:
                if b in _ESCAPABLE:
                    return rest + (_STRING,)
                return rest + ((HEX, 4, ""),) if b == 0x75 else None
            if kind == HEX:
                return self._hex(rest, top[1], top[2], b)
            if kind == ARGS:
                return rest + ((KEY, top[1], True), _W0) if b == 0x7B else None
            if kind == TAG:
                state = rest
                continue
            if kind == START:
                return self._start(top[1] + bytes((b,)))
            if kind == FREE:
                k, closed = top[1], top[2:]
                if b == OPEN_TAG[k]:
                    if k + 1 == len(OPEN_TAG):
                        return None if closed else rest + (self.after_call,) + self.body
                    return rest + ((FREE, k + 1, *closed),)
                return rest + ((FREE, 1 if b == 0x3C else 0, *closed),)
            return None  # END takes no bytes

    def _start(self, data: bytes) -> State | None:
        """A Llama output that so far is whitespace, then `data`: still the start, a call, or text."""
        if data in _SPACES:
            return ((START, b""),)
        if data == b"{":
            return self._opened
        if data == PYTHON_TAG:
            return self._tagged
        if data in _SPACE_PREFIXES or PYTHON_TAG.startswith(data):
            return ((START, data),)
        return self.walk(((FREE, 0),), data)

    def _value(self, rest: State, b: int) -> State | None:
        if b == 0x22:
            return rest + (_STRING,)
        if b in _DIGITS:
            return rest + (((NUMBER, 1, 0) if b == 0x30 else (NUMBER, 2, 1)),)
        if b == 0x2D:
            return rest + ((NUMBER, 0, 0),)
        if b in (0x7B, 0x5B):
            if len(rest) > MAX_FRAMES:
                return None
            return rest + (((KEY, -1, True) if b == 0x7B else (ITEM,)), _W0)
        literal = {0x74: b"rue", 0x66: b"alse", 0x6E: b"ull"}.get(b)
        return None if literal is None else rest + ((LIT, literal, 0),)

    def _typed_value(self, rest: State, kind: str | int, b: int) -> State | None:
        if kind == "any":
            return self._value(rest, b)
        if kind == "string":
            return rest + (_STRING,) if b == 0x22 else None
        if isinstance(kind, int):  # an enum
            return rest + ((TRIE, kind, 0),) if b == 0x22 else None
        if kind == "integer":
            if b in _DIGITS:
                return rest + (((NUMBER, 9, 0) if b == 0x30 else (NUMBER, 10, 1)),)
            return rest + ((NUMBER, 8, 0),) if b == 0x2D else None
        if kind == "number":
            return self._value(rest, b) if b in _DIGITS or b == 0x2D else None
        if kind == "boolean":
            return self._value(rest, b) if b in (0x74, 0x66) else None
        return self._value(rest, b) if b == 0x6E else None  # null

    @staticmethod
    def _hex(rest: State, n: int, unit: str, b: int) -> State | None:
        """A hex digit of a \\u escape, `n` of them still to come. A surrogate escape (D800-DFFF)
        must be a high one followed at once by a low one: json.loads reads a lone one into a str
        that no UTF-8 encoder takes (SQLite, where the agent stores calls, refuses it). `unit`: "" any
        escape but a low surrogate; "lo" only a low one; "d" and "lod" the same after a first
        digit D; "hi" a high surrogate, whose low half must come next."""
        if b not in _HEX:
            return None
        if n == 4:
            if b in b"dD":
                unit = "lod" if unit == "lo" else "d"
            elif unit == "lo":
                return None
        elif n == 3 and unit in ("d", "lod"):
            if (b in _LOW_2ND) != (unit == "lod"):
                return None
            unit = "hi" if b in _HIGH_2ND else ""
        if n > 1:
            return rest + ((HEX, n - 1, unit),)
        if unit == "hi":  # the low half's escape ends in the string, as any escape does
            return rest + ((HEX, 4, "lo"), (LIT, b"\\u", 0))
        return rest + (_STRING,)

    def walk(self, state: State, data: bytes) -> State | None:
        for b in data:
            state = self.step(state, b)
            if state is None:
                return None
        return state

    def special(self, state: State, python_tag: bool) -> State | None:
        """The state after a special token (no bytes), or None if it cannot come next; end-of-turn
        tokens aside (see `may_end`). `python_tag`: the token is `<|python_tag|>`."""
        kind = state[-1][0]
        if python_tag:
            if kind == TAG:
                return state[:-1]
            if kind == START and not state[-1][1]:
                return self._tagged
            return state if kind == FREE and self.dialect == HERMES and len(state) == 1 else None
        return state if len(state) == 1 and kind in (FREE, START) else None

    @staticmethod
    def in_free_text(state: State) -> bool:
        """Outside any call, in "auto" text: every token may come next, except `<|python_tag|>`
        where `special` refuses it and tokens whose bytes open a call and then break it."""
        return len(state) == 1 and state[0][0] == FREE

    @staticmethod
    def at_start(state: State) -> bool:
        """At the start of an "auto" Llama output (only whitespace so far): most tokens may come
        next, as in free text, but one that opens a call must go on with a valid one."""
        return len(state) == 1 and state[0][0] == START

    @staticmethod
    def may_end(state: State) -> bool:
        """Whether an end-of-turn token may come next (in free text, or after a forced call)."""
        return len(state) == 1 and state[0][0] in (FREE, END, START)
