"""Catches a reply that repeats itself ("I'm happy to help with anything. I'm happy to help with
anything. ...") while it streams, so the turn ends there rather than at the token cap, and the user
gets the reply without the repeats.

Two patterns, each needing `repeats` occurrences:
- the text ends in the same passage `repeats` times in a row (a period of at least MIN_UNIT
  characters), the loop of greedy decoding;
- one sentence of at least MIN_UNIT characters occurs `repeats` times, also with other sentences
  between them (A B A B A), the loop sampling falls into.
"""

from __future__ import annotations

import re

MIN_UNIT = 16  # characters: shorter repeats ("ha ha ha", "|---|---|") are ordinary text
MAX_TAIL = 4000  # characters looked at for a periodic tail; a loop shows within them
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")


class LoopGuard:
    """Fed the reply so far, says whether it loops; `kept` is then the reply without the repeats."""

    def __init__(self, repeats: int = 3) -> None:
        self.repeats = repeats  # 0: never a loop
        self.kept: str | None = None
        self._checked = 0  # length of the text last looked at

    def looping(self, text: str) -> bool:
        """Whether `text` (the whole reply so far) has begun to loop. Cheap to call per token:
        it looks again only when a sentence or a line has ended since the last look."""
        if self.repeats < 2 or len(text) < MIN_UNIT * self.repeats:
            return False
        new = text[self._checked:]
        if not _SENTENCE_END.search(new) and not new.endswith((".", "!", "?", "…")):
            return False
        self._checked = len(text)
        kept = _periodic_tail(text, self.repeats)
        if kept is None:
            kept = _repeated_sentence(text, self.repeats)
        if kept is None:
            return False
        self.kept = kept.rstrip()
        return True


def _periodic_tail(text: str, repeats: int) -> str | None:
    """`text` with all but the first of its final `repeats` equal passages cut, or None."""
    tail = text.rstrip()[-MAX_TAIL:]
    n = len(tail)
    for period in range(MIN_UNIT, n // repeats + 1):
        unit = tail[n - period:]
        if tail.endswith(unit * repeats) and unit.strip():
            kept = text[:len(text.rstrip()) - period * (repeats - 1)]
            # The unit may start mid-sentence (where the stream happened to stop): end the kept
            # text at its last sentence end within that one copy, when there is one.
            ends = list(_SENTENCE_END.finditer(kept, max(0, len(kept) - period)))
            return kept[:ends[-1].start()] if ends else kept
    return None


def _repeated_sentence(text: str, repeats: int) -> str | None:
    """`text` up to the second occurrence of a sentence found `repeats` times, or None."""
    seen: dict[str, list[int]] = {}
    pos = 0
    for part in _SENTENCE_END.split(text):
        start = text.find(part, pos) if part else pos
        pos = start + len(part)
        key = " ".join(part.lower().split())
        if len(key) < MIN_UNIT:
            continue
        starts = seen.setdefault(key, [])
        starts.append(start)
        if len(starts) >= repeats:
            return text[:starts[1]]
    return None
