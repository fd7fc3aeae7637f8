"""The Bot API's wire format as the fake speaks it: a call's parameters, answers, chats and
messages as JSON, the entities Telegram computes, and its check of HTML text."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from aiohttp import web

MAX_TEXT = 4096
_STRING_PARAMS = {"text", "caption", "parse_mode", "action", "file_id", "url", "language_code"}
_HTML_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a",
              "code", "pre", "blockquote", "tg-emoji"}


class ApiError(Exception):
    """An error answer: its HTTP code, description, and the parameters Telegram adds."""

    def __init__(self, code: int, description: str, retry_after: int | None = None,
                 migrate_to: int | None = None) -> None:
        super().__init__(description)
        self.code, self.description, self.retry_after = code, description, retry_after
        self.migrate_to = migrate_to  # a group upgraded to a supergroup: its new id


@dataclass
class Call:
    """One Bot API call as the fake saw it."""

    method: str
    params: dict[str, Any]
    at: float  # time.monotonic() when it arrived
    status: int = 200  # the HTTP status it was answered with


@dataclass
class BotMessage:
    """A message the bot sent: what it asked for, and what the chat shows now."""

    message_id: int
    text: str  # as sent (markup included)
    parse_mode: str | None
    shown: str  # the visible text after markup
    edits: int = 0
    topic: int | None = None  # the forum topic it was sent to (None: the chat, or its General)
    buttons: list[list[dict]] | None = None  # its inline keyboard's rows, as sent


async def request_params(request: web.Request) -> dict[str, Any]:
    """A Bot API call's parameters: JSON body, or form fields whose values are JSON-encoded
    (strings are sent as they are, so text-like fields are never decoded)."""
    if request.content_type == "application/json":
        return await request.json()
    form = dict(await request.post()) if request.method == "POST" else dict(request.query)
    params: dict[str, Any] = {}
    for key, value in form.items():
        if not isinstance(value, str):  # an uploaded file
            params[key] = value
        elif key in _STRING_PARAMS:
            params[key] = value
        else:
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
    return params


def inline_keyboard(params: dict) -> list[list[dict]] | None:
    """The rows of the call's inline keyboard, if it has one."""
    markup = params.get("reply_markup")
    return markup.get("inline_keyboard") if isinstance(markup, dict) else None


def answer(body: dict, status: int = 200) -> web.Response:
    """A Bot API answer (`{"ok": ...}`) as JSON."""
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def chat_json(chat: int, first_name: str = "Ada") -> dict:
    """A chat as Telegram describes it: a user's private chat has their (positive) id; a
    supergroup's id is -100 and then at least ten digits; other negative ids are basic groups."""
    if chat > 0:
        return {"id": chat, "type": "private", "first_name": first_name}
    kind = "supergroup" if chat <= -1_000_000_000_000 else "group"
    return {"id": chat, "type": kind, "title": "A group"}


def chat_id_of(params: dict) -> int:
    """The call's chat_id; 400 "chat not found" when it has none that is a number."""
    try:
        return int(params["chat_id"])
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "Bad Request: chat not found") from None


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def entities_in(text: str) -> list[dict]:
    """Mentions and a leading bot command, with offsets in UTF-16 units as Telegram counts them."""
    found = []
    command = re.match(r"/[A-Za-z0-9_]{1,32}(@[A-Za-z0-9_]{5,32})?", text)
    if command:
        found.append({"type": "bot_command", "offset": 0, "length": _utf16_len(command.group())})
    for m in re.finditer(r"(?<![\w/])@[A-Za-z0-9_]{5,32}", text):
        found.append({"type": "mention", "offset": _utf16_len(text[:m.start()]),
                      "length": _utf16_len(m.group())})
    return found


class _HtmlText(HTMLParser):
    """Telegram's HTML: only its tags, properly nested; collects the visible text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.open: list[str] = []
        self.error: str | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag not in _HTML_TAGS:
            self.error = self.error or f'Unsupported start tag "{tag}"'
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            self.error = self.error or f'Unexpected end tag "{tag}"'

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def visible_html(text: str) -> str:
    """The text Telegram HTML shows; 400 "can't parse entities" for markup Telegram refuses."""
    stray = re.search(r"&(?!#?\w+;)|<(?!/?[a-z-]+[\s>])", text)
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    error = parser.error or (f"Can't find end tag corresponding to start tag \"{parser.open[-1]}\""
                             if parser.open else None)
    if stray is not None and error is None:
        error = f"Unescaped {stray.group()!r} at byte offset {len(text[:stray.start()].encode())}"
    if error:
        raise ApiError(400, f"Bad Request: can't parse entities: {error}")
    return "".join(parser.parts)  # convert_charrefs: entities are already decoded
