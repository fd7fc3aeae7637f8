"""Telegram HTML for a reply: the little Markdown models write (``` fences, `code`, **bold**), and
literal blocks (a call to approve, see openclaw/gateway/contract.py:literal_block) as <pre>."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from openclaw.gateway.contract import LITERAL_BLOCK, literal_text

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)\n?```", re.DOTALL)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.DOTALL)


def markdown_to_html(text: str) -> str:
    """The little Markdown models write, as Telegram HTML: ``` fences, `code`, **bold**. All else
    is escaped text, so no input can produce markup Telegram refuses (and if it does, the caller
    falls back to plain text). A literal block (a command to approve) is <pre> and nothing else,
    found before any Markdown, so no text around it can reach into it."""
    return _split(text, LITERAL_BLOCK, _literal_html, lambda rest: _split(
        rest, _FENCE, _fence_html, lambda outside: _split(
            outside, _INLINE_CODE, _code_html, _bold_html)))


def _split(text: str, pattern: re.Pattern, found: Callable[[re.Match], str],
           between: Callable[[str], str]) -> str:
    """`text` with each match of `pattern` rendered by `found` and the text between by `between`."""
    out, at = [], 0
    for m in pattern.finditer(text):
        out += [between(text[at:m.start()]), found(m)]
        at = m.end()
    out.append(between(text[at:]))
    return "".join(out)


def _literal_html(m: re.Match) -> str:
    return f"<pre>{html.escape(literal_text(m.group(1)), quote=False)}</pre>"


def _fence_html(m: re.Match) -> str:
    lang = m.group(1).strip()
    css = f' class="language-{lang}"' if re.fullmatch(r"[\w+#.-]+", lang) else ""
    return f"<pre><code{css}>{html.escape(m.group(2), quote=False)}</code></pre>"


def _code_html(m: re.Match) -> str:
    return f"<code>{html.escape(m.group(1), quote=False)}</code>"


def _bold_html(text: str) -> str:
    return _BOLD.sub(r"<b>\1</b>", html.escape(text, quote=False))
