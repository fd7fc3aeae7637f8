"""The lines a chat shows for the tools a turn called ([agent] show_tools): "🔧 shell: ls -la —
exit 0". They are for the user only: the conversation the model reads never holds them."""

from __future__ import annotations

import json
import re
from typing import Any

from openclaw.gateway.contract import literal_block
from skills.base import visible
from skills.executor import Outcome

SUMMARY_CHARS = 60  # of the arguments, on the one line "brief" shows
FULL_ARGUMENT_CHARS = 1000  # "full": the arguments as JSON, cut there
FULL_RESULT_LINES = 8  # "full": the first lines of the result
FULL_LINE_CHARS = 200

# How a call that did not run ended, by its audit decision (skills.executor.AUDIT_DECISIONS).
_NOT_RUN = {"denied": "denied", "rejected": "denied", "timeout": "not approved in time",
            "invalid": "bad arguments", "unknown": "no such tool"}


def tool_line(mode: str, name: str, arguments: Any, outcome: Outcome) -> str | None:
    """What the chat shows for one call in `mode` ("brief", "full"; "off": None). Everything the
    model wrote goes through visible(), so no hidden character reaches the chat."""
    if mode == "off":
        return None
    summary = _summary(arguments)
    line = f"🔧 {cut(visible(name), 40)}{': ' + summary if summary else ''} — {_ending(outcome)}"
    if mode != "full":
        return line
    shown = json.dumps(arguments, ensure_ascii=False)
    result = outcome.text.splitlines()
    detail = [cut(visible(shown), FULL_ARGUMENT_CHARS)]
    detail += [cut(visible(r), FULL_LINE_CHARS) for r in result[:FULL_RESULT_LINES]]
    if len(result) > FULL_RESULT_LINES:
        detail.append(f"[{len(result) - FULL_RESULT_LINES} more lines]")
    return line + "\n" + literal_block("\n".join(detail))


def with_tool_lines(lines: list[str], text: str) -> str:
    """A reply (or a draft of it) with the turn's tool lines before it."""
    if not lines:
        return text
    return "\n".join(lines) + ("\n\n" + text if text else "")


def _summary(arguments: Any) -> str:
    """The arguments on one short line: a lone value as it is (the command), else key=value."""
    if isinstance(arguments, dict):
        values = list(arguments.values())
        if len(values) == 1 and isinstance(values[0], str):
            text = values[0]
        else:
            text = " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
                            for k, v in arguments.items())
    else:
        text = json.dumps(arguments, ensure_ascii=False)
    return cut(visible(re.sub(r"\s+", " ", text).strip()), SUMMARY_CHARS)


def _ending(outcome: Outcome) -> str:
    if outcome.decision != "allowed":
        return _NOT_RUN.get(outcome.decision, outcome.decision)
    if outcome.exit_status is not None:
        return f"exit {outcome.exit_status}"
    return "ok" if outcome.ok else "error"


def cut(text: str, limit: int) -> str:
    """`text` at most `limit` characters, an ellipsis where it was cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"
