"""Fields of a chat request that not every server takes, and how a request does without one.

A strict server refuses a field it does not know with a 400 (OpenAI's own API: vLLM's
`cache_salt`, `top_k`...; FastAPI servers with a 422; Azure's older API versions even
`stream_options`), and OpenAI's newer models refuse
`max_tokens` for `max_completion_tokens`. Such a request is sent again without the field (or under
its new name), once per field; a field the server then took the request without is never sent to
it again (see OpenAIBackend)."""

from __future__ import annotations

import re
from typing import Any

from openclaw.backends.http import ServerRefused

# A field we may send -> what it becomes where refused: None, left out; a name, sent under it.
ADAPTABLE: dict[str, str | None] = {
    "cache_salt": None, "user": None, "top_k": None, "min_p": None, "repetition_penalty": None,
    "stream_options": None, "max_tokens": "max_completion_tokens", "tool_instructions": None,
}
# What doing without it costs, for the log's one line.
COST = {
    "cache_salt": "users' cached prompt prefixes are kept apart only as the server itself does",
    "user": "the server is not told which user a request is for",
    "stream_options": "an answer's tokens are estimated, as its stream brings no usage",
    "max_tokens": "the reply's limit is sent as max_completion_tokens",
    "tool_instructions": "the server writes its own tool prompt, not the tool instructions set",
}

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_QUOTED = re.compile(rf"""['"`]({_NAME})['"`]""")
# "Unrecognized request arguments supplied: cache_salt, top_k" (OpenAI's older words, Azure's)
_LISTED = re.compile(rf"(?:argument|parameter|field|propert(?:y|ie))s?(?: supplied)?:\s*"
                     rf"({_NAME}(?:,\s*{_NAME})*)", re.IGNORECASE)


def named(exc: ServerRefused, body: dict[str, Any]) -> list[str]:
    """The fields of `body` a refusal (400 or 422) names that the request can do without: its
    `param`, a name in quotes, or one listed after "arguments:". A name merely quoted in a message
    about something else is caught too; the caller keeps a field out for good only once the
    server took the request without it."""
    if exc.status not in (400, 422):
        return []
    names = set(_QUOTED.findall(exc.message))
    names.update(n.strip() for found in _LISTED.findall(exc.message) for n in found.split(","))
    if exc.param:
        names.add(exc.param)
    return [field for field in ADAPTABLE if field in body and field in names]


def without(body: dict[str, Any], fields: set[str] | list[str]) -> dict[str, Any]:
    """`body` with each of `fields` left out or renamed, as ADAPTABLE says."""
    out = dict(body)
    for field in fields:
        if field in out:
            value = out.pop(field)
            if (renamed := ADAPTABLE.get(field)) is not None:
                out[renamed] = value
    return out
