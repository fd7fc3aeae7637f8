"""Tool calls in model output (Hermes `<tool_call>` blocks, Llama 3.1 JSON), parsed without raising.

Whatever a small model emits, the result is content plus the calls that parsed plus, for each call
that did not, an error the agent can send back to the model as a tool error. The streaming parser
runs the same segmenter as `parse_tool_calls`, so its final result is the same by construction.

Slips we tolerate, because each has only one reasonable reading:
- a block wrapped in a ```json fence inside `<tool_call>...</tool_call>`;
- trailing commas before `}` or `]` (tried only after strict JSON failed);
- stray closing braces after a complete call object (`{...}}`);
- several call objects, or a JSON array of them, in one block;
- `"parameters"` for `"arguments"`, arguments as a JSON string holding an object, a missing or
  null `"arguments"` (a call without arguments), an OpenAI-shaped `{"function": {...}}` object.
Slips we do not tolerate, because guessing could run a call the model did not mean: single-quoted
or Python-literal dicts, unquoted keys, and text after the JSON inside a block.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"

_SNIPPET_CHARS = 200
_FORMAT_HINT = 'expected <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>'
_JSON_SPECIAL = re.compile(r'[\\"{}\[\]]')
_LLAMA_CALL_START = re.compile(r'^\{\s*"name"\s*:')
_FENCE = re.compile(r"^```[\w-]*\s*(.*?)\s*(?:```)?$", re.DOTALL)
_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    # Ids are random, so two parses of the same text compare equal on what the model said.
    id: str = field(compare=False)
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[ToolCall]
    errors: list[str]


def new_call_id() -> str:
    return f"call_{secrets.token_hex(6)}"


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split a finished model output into content, tool calls and parse errors."""
    seg = _Segmenter()
    seg.text = text if isinstance(text, str) else ("" if text is None else str(text))
    seg.advance(final=True)
    return seg.result()


class StreamingToolParser:
    """Feeds on output deltas; shows content as soon as it cannot belong to a tool call."""

    def __init__(self) -> None:
        self._seg = _Segmenter()
        self._start: int | None = None  # first non-space char of the content, once seen
        self._shown_end = 0

    @property
    def shown(self) -> str:
        """All content returned by `feed` so far; always a prefix of `finish().content`."""
        return "" if self._start is None else self._seg.content[self._start : self._shown_end]

    def feed(self, delta: str) -> str:
        """Add `delta`; return the content that is now safe to show (possibly "")."""
        if delta:
            self._seg.text += delta
            self._seg.advance(final=False)
        raw = self._seg.content
        if self._start is None:
            stripped = len(raw) - len(raw.lstrip())
            if stripped == len(raw):
                return ""
            self._start = self._shown_end = stripped
        # Trailing whitespace waits: it is dropped if the content ends there or a block follows.
        end = len(raw)
        while end > self._shown_end and raw[end - 1].isspace():
            end -= 1
        out = raw[self._shown_end : end]
        self._shown_end = end
        return out

    def finish(self) -> ParsedOutput:
        """The whole result, equal to `parse_tool_calls` of everything fed.

        Content not yet shown is `result.content[len(parser.shown):]`.
        """
        self._seg.advance(final=True)
        return self._seg.result()


class _Brackets:
    """Finds where a JSON value starting with `{` or `[` closes; resumable as text grows."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self.depth = 0
        self.in_string = False
        self.end: int | None = None

    def scan(self, text: str) -> int | None:
        if self.end is not None:
            return self.end
        i = self.pos
        while True:
            m = _JSON_SPECIAL.search(text, i)
            if m is None:
                self.pos = len(text)
                return None
            i, c = m.start(), m.group()
            if self.in_string:
                if c == "\\":
                    if i + 1 >= len(text):  # the escaped char has not arrived yet
                        self.pos = i
                        return None
                    i += 2
                    continue
                if c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos = i + 1
                    return self.end
            i += 1


def _json_end(text: str, start: int) -> int | None:
    return _Brackets(start).scan(text)


class _Segmenter:
    """Cuts output text into content and tool-call bodies, deciding only what more text can't change.

    `advance(final=False)` commits only decisions that hold for any continuation of the text, so a
    stream and a one-shot parse of the same text end in the same state.
    """

    def __init__(self) -> None:
        self.text = ""
        self.content = ""  # committed text outside tool blocks, unstripped
        self.blocks: list[str] = []  # Hermes block bodies, in order
        self.mode = "sniff"  # "sniff": could still be a Llama-style call; then "hermes" or "llama"
        self.pos = 0
        self.block_start: int | None = None
        self.brackets: _Brackets | None = None

    def advance(self, final: bool) -> None:
        if self.mode == "sniff":
            self.mode = self._sniff(final) or "sniff"
        if self.mode == "hermes":
            self._advance_hermes(final)

    def _sniff(self, final: bool) -> str | None:
        """Decide whether the whole output is a Llama 3.1 JSON call; None while undecided."""
        t = self.text
        j = len(t) - len(t.lstrip())
        s = t[j:]
        if s.startswith(PYTHON_TAG):
            return "llama" if final else None
        if not s or PYTHON_TAG.startswith(s):
            return "hermes" if final else None
        if s[0] != "{":
            return "hermes"
        if self.brackets is None:
            self.brackets = _Brackets(j)
        e = self.brackets.scan(t)
        if e is None:
            if not final:
                return None
            # Cut off mid-call (max_tokens): report it rather than show half a call as text.
            return "llama" if _LLAMA_CALL_START.match(s) else "hermes"
        if t[e:].strip() or not _looks_like_llama_call(t[j:e]):
            self.brackets = None
            return "hermes"
        return "llama" if final else None

    def _advance_hermes(self, final: bool) -> None:
        t = self.text
        while True:
            if self.block_start is None:
                i = t.find(OPEN_TAG, self.pos)
                if i < 0:
                    end = len(t) if final else len(t) - _partial_suffix(t, self.pos, OPEN_TAG)
                    self.content += t[self.pos : end]
                    self.pos = end
                    return
                self.content += t[self.pos : i]
                self.block_start = self.pos = i + len(OPEN_TAG)
                self.brackets = None
            found = self._block_end(final)
            if found is None:
                return
            body_end, self.pos = found
            self.blocks.append(t[self.block_start : body_end])
            self.block_start = None
            if self.pos >= len(t):
                return

    def _block_end(self, final: bool) -> tuple[int, int] | None:
        """(end of body, position after the block), or None until more text decides it."""
        t, start = self.text, self.block_start
        assert start is not None
        j = len(t) - len(t[start:].lstrip())
        if j == len(t):
            return (j, j) if final else None
        search_from = start
        if t[j] in "{[":
            # Match the JSON's own brackets first, so "</tool_call>" inside a string value
            # does not end the block.
            if self.brackets is None:
                self.brackets = _Brackets(j)
            e = self.brackets.scan(t)
            if e is not None:
                k = len(t) - len(t[e:].lstrip())
                if t.startswith(CLOSE_TAG, k):
                    return k, k + len(CLOSE_TAG)
                if not final and CLOSE_TAG.startswith(t[k:]):
                    return None
                search_from = e
            elif not final:
                return None
        c = t.find(CLOSE_TAG, search_from)
        if c >= 0:
            return c, c + len(CLOSE_TAG)
        # An unclosed final block runs to the end of the output.
        return (len(t), len(t)) if final else None

    def result(self) -> ParsedOutput:
        if self.mode == "llama":
            body = self.text.strip()
            if body.startswith(PYTHON_TAG):
                body = body[len(PYTHON_TAG) :]
            calls, errors = _parse_body(body, "tool call")
            return ParsedOutput("", calls, errors)
        calls: list[ToolCall] = []
        errors: list[str] = []
        for n, body in enumerate(self.blocks, 1):
            got, errs = _parse_body(body, f"<tool_call> block {n}")
            calls += got
            errors += errs
        return ParsedOutput(self.content.strip(), calls, errors)


def _partial_suffix(text: str, start: int, tag: str) -> int:
    """Length of the longest end of `text[start:]` that could be the start of `tag`."""
    for k in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _looks_like_llama_call(obj_text: str) -> bool:
    value, _ = _decode_all(obj_text)
    if len(value) == 1 and isinstance(value[0], dict):
        v = value[0]
        return isinstance(v.get("name"), str) and ("parameters" in v or "arguments" in v)
    # Broken JSON that starts like a call is a failed call, not an answer.
    return bool(_LLAMA_CALL_START.match(obj_text)) and not value


def _parse_body(body: str, label: str) -> tuple[list[ToolCall], list[str]]:
    s = body.strip()
    if not s:
        return [], [f"{label} is empty; {_FORMAT_HINT}"]
    fenced = _FENCE.match(s) if s.startswith("```") else None
    if fenced:
        s = fenced.group(1)
    values, err = _decode_all(s)
    calls: list[ToolCall] = []
    errors: list[str] = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            call, problem = _to_call(item)
            if call is not None:
                calls.append(call)
            else:
                errors.append(f"{label}: {problem}; {_FORMAT_HINT}")
    if err:
        errors.append(f"{label}: {err} in {_snippet(s)}; {_FORMAT_HINT}")
    return calls, errors


def _decode_all(s: str) -> tuple[list[Any], str | None]:
    """Every JSON value in `s` (whitespace-separated), and what went wrong if not all parsed."""
    values, err = _decode_sequence(s)
    if err:
        lenient, lenient_err = _decode_sequence(_drop_trailing_commas(s))
        if not lenient_err:
            return lenient, None
    return values, err


def _decode_sequence(s: str) -> tuple[list[Any], str | None]:
    values: list[Any] = []
    i = 0
    while True:
        i = len(s) - len(s[i:].lstrip())
        if i >= len(s):
            return values, None
        rest = s[i:]
        if values and not rest.strip("} \t\r\n"):
            return values, None  # stray closing braces after a complete object
        if rest[0] not in "{[":
            what = "unexpected text after the JSON" if values else "not a JSON object"
            return values, what
        try:
            value, i = _DECODER.raw_decode(s, i)
        except json.JSONDecodeError as exc:
            if _json_end(s, i) is None:
                return values, "incomplete JSON (unbalanced braces: was the output cut off?)"
            return values, f"invalid JSON ({exc.msg} at char {exc.pos})"
        except RecursionError:
            return values, "JSON nested too deeply"
        except ValueError:
            # int() refuses more than sys.get_int_max_str_digits() digits (4300 by default);
            # "parsed without raising" holds for such output too.
            return values, "invalid JSON (a number with more digits than can be read)"
        values.append(value)


def _drop_trailing_commas(s: str) -> str:
    out: list[str] = []
    in_string = escaped = False
    for c in s:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "}]":
            j = len(out) - 1
            while j >= 0 and out[j].isspace():
                j -= 1
            if j >= 0 and out[j] == ",":
                del out[j]
        out.append(c)
    return "".join(out)


def _to_call(item: Any) -> tuple[ToolCall | None, str]:
    if not isinstance(item, dict):
        return None, f"expected a JSON object, got {type(item).__name__} {_snippet(item)}"
    if "name" not in item and isinstance(item.get("function"), dict):
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f'missing "name" (a non-empty string) in {_snippet(item)}'
    args = item["arguments"] if "arguments" in item else item.get("parameters")
    if isinstance(args, str):
        if not args.strip():
            args = {}
        else:
            decoded, err = _decode_all(args.strip())
            if err or len(decoded) != 1:
                return None, f'"arguments" of {name} is a string but not JSON: {_snippet(args)}'
            args = decoded[0]
    if args is None:
        args = {}
    if not isinstance(args, dict):
        kind = type(args).__name__
        return None, f'"arguments" of {name} must be a JSON object, got {kind} {_snippet(args)}'
    return ToolCall(new_call_id(), name.strip(), args), ""


def _snippet(value: Any) -> str:
    if not isinstance(value, str):
        try:
            value = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError):
            value = repr(value)
    if len(value) > _SNIPPET_CHARS:
        value = value[:_SNIPPET_CHARS] + "..."
    return repr(value)
