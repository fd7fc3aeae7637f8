"""What one skill call may hold in the daemon's memory: the per-call budget for in-daemon skills
(files, email, SKILL.md), and how to measure a result's size before building it.

In-daemon skills run in the daemon's own process, beside every user's conversation and the model:
a call that builds a result of gigabytes takes the whole daemon down with it. So each computes
the size of what it would build first and refuses past the budget, instead of building and then
checking.
"""

from __future__ import annotations

from skills.base import SkillDenied

# All a single call may allocate for its work and its result (a file edit holds the file and its
# new text). Well under a MemoryMax= the daemon's unit can afford (docs/operating.md).
CALL_MEMORY_BYTES = 256 << 20
# What a command's output is captured to, whatever the role's output_bytes: the model reads at
# most the executor's result limit (16,000 characters) of it, so more is memory for nothing.
CAPTURE_BYTES = 1 << 20
_CHUNK_CHARS = 1 << 20


def utf8_size(text: str) -> int:
    """len(text.encode()) without holding a second copy of a long text: encoded a piece at a time."""
    if text.isascii():
        return len(text)
    # surrogatepass: a lone surrogate is measured here (3 bytes) and refused where it is encoded.
    return sum(len(text[i:i + _CHUNK_CHARS].encode("utf-8", "surrogatepass"))
               for i in range(0, len(text), _CHUNK_CHARS))


def check_call_memory(what: str, needed: int, hint: str) -> None:
    """Refuse, before allocating, work that would hold `needed` bytes, over the per-call budget."""
    if needed > CALL_MEMORY_BYTES:
        raise SkillDenied(f"{what} would need {needed:,} bytes of memory, over the "
                          f"{CALL_MEMORY_BYTES:,} one call may use; nothing was done. {hint}")
