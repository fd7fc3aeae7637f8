"""Chunking replies to a channel's message limit, preferring paragraph, line and word boundaries."""

from __future__ import annotations


def chunk_text(text: str, limit: int) -> list[str]:
    """Split `text` into pieces of at most `limit` characters, preferring paragraph, then line,
    then word boundaries. A piece that ends inside a ``` code fence closes it, and the next piece
    reopens it (with the same info string, unless that is long), so each message renders on its
    own."""
    if limit < 16:
        raise ValueError("chunk limit must be at least 16 characters")
    pieces: list[str] = []
    rest = text
    reopen = ""
    while rest:
        if len(reopen) + len(rest) <= limit:
            pieces.append(reopen + rest)
            break
        # Cut in `rest`, after the reopened fence: every round takes some text, however long the
        # fence line (cutting reopen + rest could take no more than the fence line each round).
        cut = _best_cut(rest, limit - len(reopen) - 4)  # room for a closing "\n```"
        piece, rest = reopen + rest[:cut], rest[cut:].lstrip("\n")
        fence = _open_fence(piece)
        if fence is not None:
            piece = piece.rstrip("\n") + "\n```"
            # A fence line as long as the limit would leave no room for what it reopens.
            reopen = (fence if len(fence) <= limit // 4 else "```") + "\n"
        else:
            reopen = ""
        pieces.append(piece.rstrip())
    return [p for p in pieces if p.strip()]


def _best_cut(text: str, budget: int) -> int:
    window = text[:budget]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > budget // 4:  # never a tiny first piece just to hit a boundary
            return at + len(sep)
    return budget


def _open_fence(piece: str) -> str | None:
    """The opening fence line (e.g. "```python") if `piece` ends inside a code block. As in
    CommonMark, a line whose info string holds a backtick ("```ls -l```") opens none: it is code
    on one line, and reopening it in every later piece would repeat it."""
    fence = None
    for line in piece.split("\n"):
        stripped = line.strip()
        if not stripped.startswith("```"):
            continue
        if fence is not None:
            fence = None
        elif "`" not in stripped.lstrip("`"):
            fence = stripped
    return fence
