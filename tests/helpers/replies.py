"""A reply as the model wrote it: without the tool lines the chat shows before it ([agent]
show_tools, "brief" by default), for tests about something else than those lines."""

from __future__ import annotations


def answer(text: str) -> str:
    """`text` without its leading "🔧 ..." lines and the blank line after them."""
    lines = text.split("\n")
    shown = 0
    while shown < len(lines) and lines[shown].startswith("🔧 "):
        shown += 1
    if not shown:
        return text
    return "\n".join(lines[shown:]).removeprefix("\n")


def answers(texts: list[str]) -> list[str]:
    return [answer(t) for t in texts]
