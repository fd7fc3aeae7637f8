"""One message's token count without rendering the chat template for it.

ChatFormatter.encode renders the whole template twice (the second rendering proves each untrusted
text was inserted unchanged): exact, but a few hundred microseconds for a one-line message. Most
templates write a message as fixed scaffolding, the content, fixed scaffolding, with a special
token opening each message and the generation prompt, so no token crosses from one message into
the next. For such a template a message's tokens are those of its scaffolding and content alone,
encoded as encode() encodes them: one tokenizer call. The scaffolding is learnt once per role from
one rendering with a marker in place of the content, and checked against the exact count on odd
texts (spaces and newlines at the ends, emoji, a special token's name, whitespace only); a role
whose template fails any of them (content rewritten, messages that merge) is counted exactly.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.chat import ChatFormatter, Part, Turn, normalize_messages

# The texts each role's fast count must count as encode() does before it is used.
PROBES = ("hello", " a leading space", "a trailing space ", "\nnewlines around\n", "  both \n ",
          "two\n\nparagraphs", "emoji 🦀 👍🏽 and é 中文", "<|im_start|>system\nnot a role",
          "<|eot_id|><tool_call>{}</tool_call><|im_end|>", "<<oc-untrusted-0-0>>", "   ", "x",
          "\t", "ends in a newline\n")
# A string literal of the template that looks like markup: a template may branch on a content
# holding it (Qwen3 splits an assistant's content at '</think>'), which no probe can foresee.
_LITERAL = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
_MARKUP = re.compile(r"[<>\[\]|]")
_PROBE_CALL = [{"id": "call_1", "type": "function",
                "function": {"name": "clock", "arguments": "{\"zone\": \" UTC\\n\"}"}}]


@dataclass(frozen=True)
class _Shape:
    """A message is written as scaffolding (opening with a special token), its content, and
    scaffolding: the tokens of the scaffolding up to its last special token before the content and
    from its first after it are `fixed`; the text between them and the content (`lead`, `tail`)
    is encoded with the content in one run."""

    fixed: int
    lead: str
    tail: str
    trim: bool  # the template writes the content trimmed (Llama 3's `| trim`)


class MessageCounter:
    """count(message, after): len(encode([after, message])) - len(encode([after])), the tokens
    `message` adds to a prompt that holds `after`, fast where the template allows it."""

    MAX_AFTER = 8  # distinct `after` messages kept (a caller uses one)

    def __init__(self, formatter: ChatFormatter) -> None:
        self.formatter = formatter
        # Untrusted text holding one of these is counted exactly (see _LITERAL). Not a lone
        # character: a '[' or '|' the template writes would send every JSON or table there.
        literals = {(m.group(1) or m.group(2) or "").strip()
                    for m in _LITERAL.finditer(formatter.template_source)}
        self.markup = tuple(sorted(t for t in literals if len(t) > 1 and _MARKUP.search(t)))
        self._shapes: dict[tuple, _Shape | None] = {}  # (after's role and text, role): its shape
        self._alone: dict[tuple, int] = {}  # len(encode([after])) per after
        self.bounded = _bounded(formatter.tokenizer.backend)

    def count(self, message: dict, after: dict) -> int:
        fast = self.fast(message, after)
        return fast if fast is not None else self.exact(message, after)

    def fast(self, message: dict, after: dict) -> int | None:
        """The count without the template, or None where it cannot be had so (the template
        failed the probes for this role, the message is empty or renders as several turns)."""
        found = self._shaped(message, after)
        return None if found is None else self._encoded(*found)

    def bound(self, message: dict, after: dict) -> int | None:
        """At least count(message, after), without encoding it: the scaffolding's tokens and a
        token for each byte of the text encoded with it (no tokenizer here splits a text into
        more pieces than its UTF-8 bytes), and one more for each run of it, for a prefix the
        tokenizer may add. None where the fast count has no shape for the message, or the
        tokenizer's normalizer could lengthen a text (see `_bounded`)."""
        if not self.bounded:
            return None
        found = self._shaped(message, after)
        if found is None:
            return None
        shape, turn = found
        parts = turn.parts
        if shape.trim and not (len(parts) == 1 and not parts[0].trusted):  # as _encoded: exact
            return None
        texts = [shape.lead, *(part.text for part in parts), shape.tail]
        return shape.fixed + sum(len(text.encode("utf-8")) for text in texts) + len(texts)

    def _shaped(self, message: dict, after: dict) -> tuple[_Shape, Turn] | None:
        turns = self._turns(message)
        if turns is None:
            return None
        role = message.get("role")
        key = (after.get("role"), after.get("content"), role)
        if key not in self._shapes:
            if len(self._shapes) >= 4 * self.MAX_AFTER:
                self._shapes.clear()
            self._shapes[key] = self._learn(after, role, turns[0].role)
        shape = self._shapes[key]
        return None if shape is None else (shape, turns[0])

    def exact(self, message: dict, after: dict) -> int:
        encode = self.formatter.encode
        key = (after.get("role"), after.get("content"))
        alone = self._alone.get(key)
        if alone is None:
            if len(self._alone) >= self.MAX_AFTER:
                self._alone.clear()
            alone = self._alone[key] = len(encode([after]))
        return len(encode([after, message])) - alone

    def _turns(self, message: dict) -> list[Turn] | None:
        f = self.formatter
        turns = normalize_messages([message], tool_role=f.tool_role, dialect=f.tool_dialect)
        # An empty content changes what `{% if content %}` sees: learnt with a marker, not here.
        if len(turns) != 1 or not turns[0].content:
            return None
        if self.markup and any(mark in part.text for part in turns[0].parts if not part.trusted
                               for mark in self.markup):
            return None
        return turns

    def _learn(self, after: dict, role: str, turn_role: str) -> _Shape | None:
        f = self.formatter
        head = normalize_messages([after], tool_role=f.tool_role, dialect=f.tool_dialect)
        marker = f"<<oc-count-{secrets.token_hex(8)}>>"
        now = datetime.now()

        def render(turns: list[Turn], generation: bool) -> str:
            return f.render_turns(turns, generation, lambda text: text, now)

        try:
            base, prompted = render(head, False), render(head, True)
            full = render([*head, Turn(turn_role, [Part(marker)])], True)
        except ValueError:
            return None
        generation = prompted[len(base):]
        if not prompted.startswith(base) or full.count(marker) != 1:
            return None
        opened, closed = full.split(marker)
        if not opened.startswith(base) or not closed.endswith(generation):
            return None
        before, after_text = opened[len(base):], closed[:len(closed) - len(generation)]
        special = f.scaffold_pattern
        # A special token on each side: the message's text cannot merge with its neighbours'.
        if special is None or not special.match(before) or (generation and not special.match(generation)):
            return None
        probes = [{"role": role, "content": text} for text in PROBES]
        if role == "assistant":
            probes += [{"role": role, "content": "", "tool_calls": _PROBE_CALL},
                       {"role": role, "content": " checking\n", "tool_calls": _PROBE_CALL}]
        elif role == "tool":
            probes = [{**probe, "tool_call_id": "call_1"} for probe in probes]
        starts = [m.start() for m in special.finditer(after_text)]
        cut = starts[0] if starts else len(after_text)
        last = [m.end() for m in special.finditer(before)][-1]
        fixed = len(f.encode_pieces([before[:last]], [])) + len(f.encode_pieces([after_text[cut:]], []))
        for trim in (False, True):
            shape = _Shape(fixed, before[last:], after_text[:cut], trim)
            if all(self._probe(shape, probe, after) for probe in probes):
                return shape
        return None

    def _probe(self, shape: _Shape, message: dict, after: dict) -> bool:
        turns = self._turns(message)
        if turns is None:
            return True  # counted exactly when asked
        try:
            fast = self._encoded(shape, turns[0])
            return fast is None or fast == self.exact(message, after)  # None: counted exactly
        except ValueError:  # the template refuses it: so would the exact count
            return False

    def _encoded(self, shape: _Shape, turn: Turn) -> int | None:
        """The turn's tokens as encode() encodes its part of a prompt."""
        parts = turn.parts
        if len(parts) == 1 and not parts[0].trusted:  # one run: one tokenizer call
            text = parts[0].text.strip() if shape.trim else parts[0].text
            run = self.formatter.tokenizer.encode(shape.lead + text + shape.tail,
                                                  allow_special=False)
            return shape.fixed + len(run)
        if shape.trim:  # trimmed as a whole: not followed piece by piece
            return None
        pieces, values = [shape.lead], []
        for part in parts:  # our own text around the untrusted (a call's tags): scaffolding
            if part.trusted:
                pieces[-1] += part.text
            else:
                values.append(part.text)
                pieces += [str(len(values) - 1), ""]
        pieces[-1] += shape.tail
        return shape.fixed + len(self.formatter.encode_pieces(pieces, values))


# Normalizers that never lengthen a text in bytes beyond a prefix: SentencePiece's ("▁" before
# the text, each space written "▁": one piece a character, at most one more than its bytes).
_SPM_SPACE = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}


def _bounded(backend: Any) -> bool:
    """Whether a text's pieces are at most its UTF-8 bytes, plus one for a prefix: a tokenizer
    without a normalizer, or with only SentencePiece's and a "▁" piece (without it, byte fallback
    writes a space in 3 pieces). (NFKC, say, writes one character as several, whose pieces can
    then outnumber the bytes it was given.)"""
    normalizer = json.loads(backend.to_str()).get("normalizer")
    if normalizer is None:
        return True
    steps = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    return backend.token_to_id("\u2581") is not None and all(
        step.get("type") == "Prepend" and step.get("prepend") == "\u2581" or step == _SPM_SPACE
        for step in steps)
