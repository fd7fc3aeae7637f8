"""Mail addresses as the model writes them, parsed; and the refusal of any text that could become
more than its one header once Python's email package has it (a line break, a control character, an
RFC 2047 encoded word)."""

from __future__ import annotations

import re
from email.headerregistry import Address
from typing import Any

from skills.base import SkillError

_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDRESS = re.compile(rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})*")
_NAMED = re.compile(r"\s*(?P<name>[^<>]*?)\s*<(?P<addr>[^<>]*)>\s*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
LINE_BREAK = re.compile(r"[\r\n]")
# An RFC 2047 encoded word, or anything Python's lenient header parser might take for one: it decodes
# them when the header is set, and before 3.11.10 / 3.12.5 (CVE-2024-6923) writes a decoded CR/LF out
# raw, as a header of the model's choosing.
ENCODED_WORD = re.compile(r"=\?.*\?=", re.DOTALL)


def parse_address(text: str, what: str) -> Address | None:
    """`addr@host` or `Name <addr@host>` as an Address; None when malformed. Raises SkillError on a
    line break, control character or encoded word, which could smuggle in extra headers."""
    refuse_header_text(text, what)
    named = _NAMED.fullmatch(text)
    name, addr = (named["name"].strip('" '), named["addr"].strip()) if named else ("", text.strip())
    if len(addr) > 254 or not _ADDRESS.fullmatch(addr) or '"' in name or "\\" in name:
        return None
    local, _, domain = addr.rpartition("@")
    return Address(display_name=name, username=local, domain=domain.lower())


def is_address(value: Any) -> bool:
    """Whether `value` is one address, on one line, with no encoded word (from_address)."""
    return (isinstance(value, str) and not CONTROL.search(value) and not ENCODED_WORD.search(value)
            and parse_address(value, "") is not None)


def refuse_header_text(text: str, what: str) -> None:
    """Refuse what could become more than this one header once Python's email package has it."""
    refuse_control(text, what)
    if ENCODED_WORD.search(text):
        raise SkillError(f"{what} contains an RFC 2047 encoded word (=?...?=), which could inject mail "
                         "headers; refused, nothing was sent. Write the text itself (any language is "
                         "fine); it is encoded for you.")


def refuse_control(text: str, what: str) -> None:
    if LINE_BREAK.search(text):
        raise SkillError(f"{what} contains a line break (CR/LF), which could inject mail headers; "
                         "refused, nothing was sent. Give it on one line.")
    if CONTROL.search(text):
        raise SkillError(f"{what} contains a control character; refused, nothing was sent")


def recipients(value: Any, what: str) -> list[Address]:
    """A string ("a@x.org" or "a@x.org, b@y.org") or a list of them, as Addresses."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise SkillError(f"{what!r} must be an address or a list of addresses")
    found, bad = [], []
    for item in items:
        for part in _split_addresses(item):
            address = parse_address(part, f"the recipient {one_line(part.strip())!r}")
            if address is None:
                bad.append(part.strip())
            else:
                found.append(address)
    if bad:
        raise SkillError(f"not valid email addresses in {what!r}: {', '.join(map(repr, bad))}; "
                         "use e.g. \"ann@example.org\" or \"Ann <ann@example.org>\"; nothing was sent")
    return found


def _split_addresses(text: str) -> list[str]:
    """The addresses of "a@x.org, Name <b@y.org>; c@z.org": split at commas and semicolons, but not
    inside quotes or angle brackets ('"Doe, John" <j@x.org>' is one address, as mail clients and
    the read action write it), and a bare "Doe, John <j@x.org>" is joined back into one too: a
    part with no @ cannot be an address by itself."""
    parts, current, quoted, angled = [], [], False, False
    for char in text:
        if char == '"' and not angled:
            quoted = not quoted
        elif char in "<>" and not quoted:
            angled = char == "<"
        elif char in ",;" and not quoted and not angled:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    joined: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        if joined and "@" not in joined[-1] and _NAMED.fullmatch(part) and '"' not in part:
            joined[-1] = f"{joined[-1]}, {part}"
        else:
            joined.append(part)
    return joined


def one_line(text: str) -> str:
    """One line: control characters (a line break in a header, say) shown as spaces."""
    return CONTROL.sub(" ", text)
