"""Whether a file is a GGUF at all, from its first bytes: cheap enough for a config check."""

from __future__ import annotations

from pathlib import Path

GGUF_MAGIC = b"GGUF"


def gguf_magic_problem(path: Path) -> str | None:
    """Why `path` is not a GGUF file at all (a download that saved an HTML error page, a renamed
    file), from its first bytes; None when it begins as one."""
    try:
        with path.open("rb") as file:
            head = file.read(len(GGUF_MAGIC))
    except OSError as exc:
        return f"{path}: cannot be read: {exc.strerror or exc}"
    if head != GGUF_MAGIC:
        return (f"{path.name}: not a GGUF file (it does not begin with the bytes {GGUF_MAGIC!r}); "
                "download it again, or name the model's Hugging Face folder")
    return None

