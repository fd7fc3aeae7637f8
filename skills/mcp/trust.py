"""Trust in an MCP server's tools: their names and descriptions cleaned of hidden text, and their
definitions pinned at first sight, so a tool that changes later (a rug pull) or appears later is
withheld from the model until the admin trusts it (`openclaw mcp trust NAME`).

Pure: the pins live behind the `PinStore` Protocol, which the daemon's store implements.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)

# A tool name the model may write and the registry may prefix ("git.git_status"): ASCII letters,
# digits, "_", "-" and ".", 1-64 characters, not starting with "." or "-". Anything else (spaces,
# quotes, angle brackets, invisible or look-alike characters) is refused, never cleaned: a cleaned
# name could collide with another tool's.
TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")

# Default_Ignorable_Code_Point characters that are not in category Cf (Unicode 15
# DerivedCoreProperties): they render as nothing, so they can hide text from the admin.
# Variation selectors carry whole hidden messages one byte per selector.
_IGNORABLE = (
    (0x034F, 0x034F),    # combining grapheme joiner
    (0x115F, 0x1160),    # Hangul choseong / jungseong fillers
    (0x17B4, 0x17B5),    # Khmer inherent vowels
    (0x180B, 0x180F),    # Mongolian free variation selectors
    (0x3164, 0x3164),    # Hangul filler
    (0xFE00, 0xFE0F),    # variation selectors 1-16
    (0xFFA0, 0xFFA0),    # halfwidth Hangul filler
    (0xE0000, 0xE0FFF),  # TAG characters (U+E0000-E007F) and variation selectors 17-256
)
_KEEP_CONTROLS = "\n\t"
_LINE_BREAKS = {"\u2028": "\n", "\u2029": "\n", "\r\n": "\n", "\r": "\n"}


def _hidden(ch: str) -> bool:
    """Characters the admin cannot see or that steer a terminal: Cf (zero-width, bidi controls,
    soft hyphen, the TAG characters), Co (private use), Cs (lone surrogates), Cn (unassigned),
    Cc controls other than newline and tab, and the other default-ignorable code points."""
    if ch in _KEEP_CONTROLS:
        return False
    code = ord(ch)
    if any(lo <= code <= hi for lo, hi in _IGNORABLE):
        return True
    return unicodedata.category(ch) in ("Cf", "Co", "Cs", "Cn", "Cc")


def clean_text(text: str) -> str:
    """`text` without the characters `_hidden` names; line and paragraph separators and CR become
    newlines. Everything visible is kept as is (no normalisation: the admin reads what the
    model reads)."""
    for old, new in _LINE_BREAKS.items():
        text = text.replace(old, new)
    return "".join(ch for ch in text if not _hidden(ch))


def safe_tool_name(name: Any) -> str | None:
    """`name` if it is a string in the `TOOL_NAME` charset, else None (the caller refuses it)."""
    if isinstance(name, str) and TOOL_NAME.fullmatch(name):
        return name
    return None


# The parts of a tool that reach the model or steer how a call is treated; the MCP spelling first,
# the SDK's Python attribute name second.
_FIELDS = (("name", "name"), ("title", "title"), ("description", "description"),
           ("inputSchema", "input_schema"), ("outputSchema", "output_schema"),
           ("annotations", "annotations"))


def tool_fields(tool: Any) -> dict[str, Any]:
    """The pinned fields of a tool given as a dict (either spelling) or an SDK `Tool` object,
    under their MCP names; absent and None fields are left out."""
    if not isinstance(tool, Mapping):
        dump = getattr(tool, "model_dump", None)
        if dump is None:
            raise TypeError(f"an MCP tool must be a mapping or an SDK Tool, got {type(tool).__name__}")
        tool = dump(by_alias=True, exclude_none=True, mode="json")
    out: dict[str, Any] = {}
    for mcp_name, py_name in _FIELDS:
        value = tool.get(mcp_name, tool.get(py_name))
        if value is not None:
            out[mcp_name] = value
    return out


def fingerprint(tool: Any) -> str:
    """sha256 of the tool's pinned fields as canonical JSON (sorted keys, no spaces, UTF-8), taken
    on the raw text: a change hidden in invisible characters is a change too."""
    canonical = json.dumps(tool_fields(tool), sort_keys=True, separators=(",", ":"),
                           ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _clean_strings(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_clean_strings(v) for v in value]
    if isinstance(value, dict):
        return {k: _clean_strings(v) for k, v in value.items()}
    return value


def _keys_clean(value: Any) -> bool:
    if isinstance(value, list):
        return all(_keys_clean(v) for v in value)
    if isinstance(value, dict):
        return all(clean_text(k) == k and _keys_clean(v) for k, v in value.items()
                   if isinstance(k, str))
    return True


@dataclass(frozen=True)
class CleanTool:
    """A tool as it may be offered: name checked, every text (title, description, each string in
    its schemas) cleaned. `raw_changed`: cleaning removed something (`skills list` marks it)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    title: str | None = None
    output_schema: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None
    raw_changed: bool = False
    fingerprint: str = ""


def clean_tool(tool: Any) -> CleanTool | str:
    """The tool cleaned, or why it is refused (an unsafe name, a schema key with hidden text)."""
    fields = tool_fields(tool)
    name = safe_tool_name(fields.get("name"))
    if name is None:
        return f"tool name {str(fields.get('name'))[:80]!r} is outside [A-Za-z0-9_.-]{{1,64}}"
    schema = fields.get("inputSchema") or {"type": "object", "properties": {}}
    if not isinstance(schema, dict):
        return f"tool {name!r}: inputSchema is not an object"
    if not _keys_clean(schema) or not _keys_clean(fields.get("outputSchema")):
        return f"tool {name!r}: a schema key holds invisible or control characters"
    cleaned = {k: _clean_strings(v) for k, v in fields.items()}
    description = cleaned.get("description")
    title = cleaned.get("title")
    return CleanTool(
        name=name,
        description=description if isinstance(description, str) else "",
        input_schema=cleaned.get("inputSchema") or schema,
        title=title if isinstance(title, str) else None,
        output_schema=cleaned.get("outputSchema"),
        annotations=cleaned.get("annotations"),
        raw_changed=cleaned != fields,
        fingerprint=fingerprint(fields),
    )


def preview(text: str, limit: int = 80) -> str:
    """A description as a log line may show it: cleaned, one line, at most `limit` characters."""
    text = " ".join(clean_text(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PinStore(Protocol):
    """Where a server's pins live (the daemon's store). Pins map tool name -> fingerprint."""

    async def get(self, server: str) -> dict[str, str] | None:
        """The trusted pins, or None when this server's tool list was never seen."""

    async def put(self, server: str, pins: dict[str, str]) -> None:
        """Replace the trusted pins (first sight, or the admin trusting what was seen)."""

    async def saw(self, server: str, seen: dict[str, str], notes: dict[str, str]) -> None:
        """Record the tool list just seen (name -> fingerprint) and a cleaned description
        preview per tool, for `openclaw mcp list` and `openclaw mcp trust`."""


@dataclass
class Review:
    """One look at a server's tool list against its pins."""

    allowed: list[CleanTool] = field(default_factory=list)  # offered to the model
    withheld: list[str] = field(default_factory=list)  # added + changed, until trusted
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # pinned, no longer listed: simply gone
    refused: list[str] = field(default_factory=list)  # why each refused tool is never offered
    first_sight: bool = False

    def allows(self, name: str) -> bool:
        return any(t.name == name for t in self.allowed)


async def review(server: str, tools: Sequence[Any], pins: PinStore,
                 log: logging.Logger | None = None) -> Review:
    """Check `tools` (as listed by `server`) against the pins: on first sight every tool is
    pinned and allowed; later a tool whose fingerprint changed, or a new one, is withheld and the
    log says which. Tools with an unsafe name are refused with a log line, never rendered."""
    log = log or logger
    result = Review()
    current: dict[str, CleanTool] = {}
    twice: set[str] = set()
    for tool in tools:
        cleaned = clean_tool(tool)
        if isinstance(cleaned, str):
            result.refused.append(cleaned)
            log.warning("mcp server %s: %s: not offered", server, cleaned)
        elif cleaned.name in current or cleaned.name in twice:
            # Which of the two is meant cannot be told: neither is offered.
            if cleaned.name not in twice:
                result.refused.append(f"tool {cleaned.name!r} is listed more than once")
                log.warning("mcp server %s: tool %r is listed more than once: not offered",
                            server, cleaned.name)
            twice.add(cleaned.name)
            current.pop(cleaned.name, None)
        else:
            current[cleaned.name] = cleaned
    seen = {name: t.fingerprint for name, t in current.items()}
    trusted = await pins.get(server)
    await pins.saw(server, seen, {name: preview(t.description, 200) for name, t in current.items()})
    if trusted is None:
        await pins.put(server, seen)
        result.first_sight = True
        result.allowed = list(current.values())
        log.info("mcp server %s: first sight, pinned %d tools: %s", server, len(seen),
                 ", ".join(sorted(seen)) or "none")
        return result
    for name, tool in current.items():
        if name not in trusted:
            result.added.append(name)
        elif trusted[name] != tool.fingerprint:
            result.changed.append(name)
        else:
            result.allowed.append(tool)
    result.removed = sorted(set(trusted) - set(current))
    result.withheld = sorted(result.added + result.changed)
    if result.withheld or result.removed:
        log.warning("mcp server %s: tool list differs from the trusted one: %s", server,
                    describe_changes(server, result, current))
    return result


def describe_changes(server: str, result: Review, current: Mapping[str, CleanTool]) -> str:
    """One log line's worth: which tools were added, changed, removed, and what to run."""
    parts = []
    for label, names in (("added", result.added), ("changed", result.changed)):
        if names:
            parts.append(f"{label} " + ", ".join(
                f"{n} ({preview(current[n].description)!r})" for n in sorted(names)))
    if result.removed:
        parts.append("removed " + ", ".join(result.removed))
    text = "; ".join(parts)
    if result.withheld:
        text += f"; withheld from the model until the admin runs `openclaw mcp trust {server}`"
    return text
