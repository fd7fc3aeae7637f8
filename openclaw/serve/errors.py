"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, so clients built
for OpenAI (and vLLM) read them as they read theirs."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    """A request the server answers with an error: the HTTP status and OpenAI's fields."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)

    def sse(self) -> bytes:
        """The error as a server-sent event: what a stream that already began ends with."""
        return f"data: {json.dumps(self.body())}\n\n".encode()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's location as the request's field: ("messages", 0, "role") -> messages[0].role."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation_error(exc: ValidationError) -> APIError:
    """The first problem of a request body that did not validate, naming its field. The value is
    not repeated: it may be a user's text."""
    errors = exc.errors(include_url=False, include_input=False)
    loc, branched = _field_loc(errors[0]["loc"])
    param = field_path(loc) or None
    if branched:  # a field of several forms (str or list, "auto" or an object): each one's say
        said = [e["msg"] for e in errors if _field_loc(e["loc"])[0] == loc]
        message = "matches none of its forms: " + "; ".join(dict.fromkeys(said))
    else:
        message = errors[0]["msg"].removeprefix("Value error, ")
    return bad_request(f"{param}: {message}" if param else message, param)


def _field_loc(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], bool]:
    """The location up to the first union branch pydantic names in it ("str", "list[int]",
    "NamedToolChoice"), and whether there was one."""
    for i, part in enumerate(loc):
        if isinstance(part, str) and ("[" in part or part[:1].isupper() or part in _SCALARS):
            return loc[:i], True
    return loc, False


_SCALARS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})
