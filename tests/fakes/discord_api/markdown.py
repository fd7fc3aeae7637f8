"""What the Discord app shows for a message's content: its Markdown, as the client renders it.
Enough of it to tell whether a reader sees the text that was sent: code blocks (ended by the first
```, whatever came before), inline code, spoilers (hidden until clicked: shown here as one "▒" per
character), bold, italics, underline, strikethrough, backslash escapes. Zero-width characters
draw nothing, so they are left out of what is shown."""

from __future__ import annotations

import re

HIDDEN = "▒"
# The client's rules, tried in this order at each position (its parser is a list of such rules).
_BLOCK = re.compile(r"```(?:([a-z0-9_+\-.#]+?)\n)?\n*([^\n][\s\S]*?)\n*```", re.IGNORECASE)
_INLINE = re.compile(r"(`+)([\s\S]*?[^`])\1(?!`)")
_SPOILER = re.compile(r"\|\|([\s\S]+?)\|\|")
_STYLES = [re.compile(p) for p in (r"\*\*([\s\S]+?)\*\*(?!\*)", r"__([\s\S]+?)__(?!_)",
                                   r"\*(?=\S)([\s\S]+?)(?<=\S)\*(?!\*)", r"_([\s\S]+?)_(?!_)",
                                   r"~~([\s\S]+?)~~")]
_ESCAPE = re.compile(r"\\([^0-9A-Za-z\s])")
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff"


def shown(content: str) -> str:
    """The text a reader sees for `content`."""
    return "".join(c for c in _render(content) if c not in _INVISIBLE)


def _render(text: str) -> str:
    out, at = [], 0
    while at < len(text):
        for rule, render in ((_BLOCK, lambda m: m.group(2)), (_INLINE, lambda m: m.group(2).strip()),
                             (_ESCAPE, lambda m: m.group(1)),
                             (_SPOILER, lambda m: HIDDEN * len(_render(m.group(1)))),
                             *((style, lambda m: _render(m.group(1))) for style in _STYLES)):
            m = rule.match(text, at)
            if m:
                out.append(render(m))
                at = m.end()
                break
        else:
            out.append(text[at])
            at += 1
    return "".join(out)
