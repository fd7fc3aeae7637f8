"""A local fake of the Telegram Bot API that speaks the real wire protocol, for driving the real
python-telegram-bot client in tests.

Requests are POSTs (form-encoded with JSON-encoded values, or a JSON body) to `/bot<token>/<method>`;
answers are `{"ok": true, "result": ...}` or `{"ok": false, "error_code": N, "description": ...,
"parameters": {...}}`. Files download from `/file/bot<token>/<file_path>`, streamed in chunks with
their Content-Length; with `local_dir` the fake is a local Bot API server in --local mode instead:
getFile names the file as an absolute path under `local_dir/<token>/`, where it was written, and
nothing is served over HTTP. It keeps Telegram's
semantics where a client could get them wrong: getUpdates drops updates below `offset` (they are
confirmed), holds a long poll open for `timeout` seconds, and ends an older poll with 409 when a
newer one arrives; message ids count per chat; entities (mentions, commands) are computed by the
server; HTML text is checked and its visible text is limited to 4096 characters.

Test helpers: `send` / `send_document` / `send_voice` / `send_photo` (a user writes; `topic=`: in
a forum topic, where a bot message sent without `message_thread_id` lands in General), `add_update`
(any raw update), `texts(chat)` (what the bot's messages in a chat show now), `fail_next` (queue an
error such as 429 with retry_after for a method's next call; "download" for the next file
download), `cut_next_download` (the connection breaks or stalls partway through a file),
`downloads` (what each file download sent before it ended), `reject_formatting`, `migrate` (a
group becomes a supergroup: its service messages, then every call to the old id is refused with
the new one), and `stop()` /
`start()` on the same port to make the service go away and come back. A file's content may be
`Generated(size)`: its bytes are made as they are sent, never held whole.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from aiohttp import web

MAX_TEXT = 4096
CHUNK = 1 << 16  # how much of a file each write sends
_STRING_PARAMS = {"text", "caption", "parse_mode", "action", "file_id", "url", "language_code"}
_HTML_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a",
              "code", "pre", "blockquote", "tg-emoji"}


class ApiError(Exception):
    def __init__(self, code: int, description: str, retry_after: int | None = None,
                 migrate_to: int | None = None) -> None:
        super().__init__(description)
        self.code, self.description, self.retry_after = code, description, retry_after
        self.migrate_to = migrate_to  # a group upgraded to a supergroup: its new id


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float  # time.monotonic() when it arrived
    status: int = 200  # the HTTP status it was answered with


@dataclass(frozen=True)
class Generated:
    """A file's content of `size` bytes of `fill`, made chunk by chunk as it is sent (a large file
    the fake does not hold in memory)."""

    size: int
    fill: bytes = b"x"

    def __len__(self) -> int:
        return self.size

    def chunks(self) -> Iterator[bytes]:
        block = (self.fill * (CHUNK // len(self.fill) + 1))[:CHUNK]
        for start in range(0, self.size, CHUNK):
            yield block[:min(CHUNK, self.size - start)]


Content = bytes | Generated


@dataclass
class Download:
    """One GET of a file: its status, and how many bytes of the body the server wrote before the
    download ended (all of it, the client closed the connection, or a cut)."""

    path: str
    status: int = 200
    sent: int = 0
    size: int = 0  # the whole body's length (Content-Length)
    complete: bool = False  # every byte was sent
    ended: bool = False  # the handler is done (so `sent` is final)


@dataclass
class _Cut:
    after: int  # bytes sent before the break
    stall: bool  # hold the connection open silently instead of dropping it


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


@dataclass
class _Poll:
    terminated: asyncio.Event = field(default_factory=asyncio.Event)


class FakeTelegram:
    def __init__(self, token: str = "123456:TEST-fake-token", *, bot_id: int = 777_000,
                 username: str = "openclaw_test_bot", local_dir: Path | None = None) -> None:
        self.token, self.bot_id, self.username = token, bot_id, username
        self.local_dir = local_dir  # set: a local Bot API server in --local mode
        self.port: int | None = None
        self.calls: list[Call] = []
        self.updates: list[dict] = []  # not yet confirmed, oldest first
        self.confirmed = 0  # every update id below this was confirmed by an offset
        self.bot_messages: dict[int, list[BotMessage]] = defaultdict(list)
        self.actions: list[tuple[int, str]] = []  # sendChatAction (chat, action)
        self.answered_taps: list[str] = []  # answerCallbackQuery, by callback query id
        self.commands: list[dict] = []  # from setMyCommands
        self.reject_formatting = False  # answer any parse_mode with 400 "can't parse entities"
        self.blocked_by: set[int] = set()  # chats whose user blocked the bot (or removed it)
        self.migrated: dict[int, int] = {}  # group -> the supergroup it was upgraded to
        self.polls_waiting = 0  # getUpdates requests held open right now
        self.downloads: list[Download] = []  # every GET of /file/bot<token>/...
        self._cuts: list[_Cut] = []
        self._failures: dict[str, list[ApiError]] = defaultdict(list)
        self._files: dict[str, tuple[str, Content]] = {}  # file_id -> (file_path, content)
        self._declared_sizes: dict[str, int] = {}  # file_id -> a file_size that is not len(content)
        self._history: dict[int, dict[int, dict]] = defaultdict(dict)  # chat -> id -> message
        self._message_ids: dict[int, itertools.count] = defaultdict(lambda: itertools.count(1))
        self._update_ids = itertools.count(10_001)
        self._file_ids = itertools.count(1)
        self._changed = asyncio.Event()
        self._poll: _Poll | None = None
        self._runner: web.AppRunner | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

    async def start(self) -> None:
        """Listen on a free port, or on the same port again after stop()."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port or 0))
        self.port = sock.getsockname()[1]
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        # stop() drops open connections (a held long poll too) almost at once, as an outage does;
        # a timeout of 0 would mean "wait for every handler to finish"
        self._runner = web.AppRunner(app, shutdown_timeout=0.01, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Go away: close the port and every open connection. State is kept for start()."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ---- what users do ------------------------------------------------------------------------

    def send(self, text: str | None = None, user: int = 1001, *, chat: int | None = None,
             first_name: str = "Ada", reply_to: dict | None = None,
             entities: list[dict] | None = None, topic: int | None = None, **fields: Any) -> dict:
        """A user writes `text` (in a private chat, or in group `chat` when it is negative; with
        `topic`, in that topic of a forum supergroup). Entities are computed as Telegram does
        unless given. Returns the message."""
        chat_id = chat if chat is not None else user
        message = {"message_id": next(self._message_ids[chat_id]), "date": int(time.time()),
                   "chat": _chat_json(chat_id, first_name),
                   "from": {"id": user, "is_bot": False, "first_name": first_name}, **fields}
        if topic is not None:
            message["chat"]["is_forum"] = True
            message.update(message_thread_id=topic, is_topic_message=True)
        if text is not None:
            key = "caption" if any(k in fields for k in ("document", "photo", "voice")) else "text"
            message[key] = text
            found = entities if entities is not None else _entities(text)
            if found:
                message[f"{key}_entities" if key == "caption" else "entities"] = found
        if reply_to is not None:
            message["reply_to_message"] = reply_to
        self._history[chat_id][message["message_id"]] = message
        self.add_update({"message": message})
        return message

    def send_document(self, file_name: str, content: Content, user: int = 1001, *,
                      caption: str | None = None, declared_size: int | None = None, **kw: Any) -> dict:
        """A user sends a file; `declared_size` makes the message and getFile state that size
        while the download serves all of `content` (a server that lies, or a file that changed)."""
        file_id = self.add_file(content, f"documents/file_{len(self._files)}")
        if declared_size is not None:
            self._declared_sizes[file_id] = declared_size
        document = {"file_id": file_id, "file_unique_id": f"u{file_id}", "file_name": file_name,
                    "mime_type": "application/octet-stream",
                    "file_size": self._declared_sizes.get(file_id, len(content))}
        return self.send(caption, user, document=document, **kw)

    def send_voice(self, user: int = 1001, **kw: Any) -> dict:
        file_id = self.add_file(b"OggS fake voice", f"voice/file_{len(self._files)}.oga")
        voice = {"file_id": file_id, "file_unique_id": f"u{file_id}", "duration": 3,
                 "mime_type": "audio/ogg", "file_size": 15}
        return self.send(None, user, voice=voice, **kw)

    def send_photo(self, user: int = 1001, *, caption: str | None = None, **kw: Any) -> dict:
        file_id = self.add_file(b"\xff\xd8 fake jpeg", f"photos/file_{len(self._files)}.jpg")
        photo = [{"file_id": file_id, "file_unique_id": f"u{file_id}", "width": 90, "height": 90,
                  "file_size": 12}]
        return self.send(caption, user, photo=photo, **kw)

    def migrate(self, group: int, supergroup: int, user: int = 1001, *, announce: bool = True) -> None:
        """`user` upgrades `group` to `supergroup` (a new id, "-100..."). From now on Telegram
        refuses every call to the group's id with 400 and the new id (migrate_to_chat_id). With
        `announce`, the bot gets the service messages Telegram sends: the group's last message
        names the supergroup, the supergroup's first names the group."""
        self.migrated[group] = supergroup
        if announce:
            self.send(None, user, chat=group, migrate_to_chat_id=supergroup)
            self.send(None, user, chat=supergroup, migrate_from_chat_id=group)

    def add_file(self, content: Content, file_path: str) -> str:
        file_id = f"F{next(self._file_ids)}"
        if self.local_dir is not None:  # --local: the server keeps files under <dir>/<token>/
            local = self.local_dir / self.token / file_path
            local.parent.mkdir(parents=True, exist_ok=True)
            with local.open("wb") as out:
                for chunk in _chunks(content):
                    out.write(chunk)
            file_path = str(local.resolve())
        self._files[file_id] = (file_path, content)
        return file_id

    def tap(self, chat: int, message_id: int, data: str, user: int = 1001, *,
            first_name: str = "Ada") -> int:
        """A user taps an inline button whose callback data is `data`, under the bot's message
        `message_id` of `chat`; returns the update's id."""
        sent = next(m for m in self.bot_messages[chat] if m.message_id == message_id)
        return self.add_update({"callback_query": {
            "id": f"tap-{next(self._update_ids)}", "chat_instance": f"ci{chat}", "data": data,
            "from": {"id": user, "is_bot": False, "first_name": first_name},
            "message": self._message_json(chat, sent)}})

    def add_update(self, update: dict) -> int:
        """Queue any update (e.g. {"edited_message": ...}); returns its update_id."""
        update = {"update_id": next(self._update_ids), **update}
        self.updates.append(update)
        self._wake()
        return update["update_id"]

    # ---- what tests inspect or arrange -------------------------------------------------------

    def texts(self, chat: int) -> list[str]:
        """What the bot's messages in `chat` show now, in order."""
        return [m.shown for m in self.bot_messages[chat]]

    def message(self, chat: int, message_id: int) -> dict:
        """A message of the chat (the user's or the bot's), e.g. to reply to it."""
        return self._history[chat][message_id]

    def calls_to(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def fail_next(self, method: str, code: int = 429, description: str | None = None, *,
                  retry_after: int | None = None) -> None:
        """Answer the next call of `method` (or the next file download: "download") with this
        error instead of serving it."""
        if description is None:
            description = (f"Too Many Requests: retry after {retry_after}" if code == 429
                           else "Internal Server Error")
        self._failures[method].append(ApiError(code, description, retry_after))

    def cut_next_download(self, after: int, *, stall: bool = False) -> None:
        """The next file download sends `after` bytes of the body, then the connection drops (or,
        with `stall`, stays open with nothing more coming)."""
        self._cuts.append(_Cut(after, stall))

    # ---- the HTTP side ------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await _params(request)
        call = Call(method, params, time.monotonic())
        self.calls.append(call)
        try:
            if request.match_info["token"] != self.token:
                raise ApiError(401, "Unauthorized")
            handler = getattr(self, f"_m_{method}", None)
            if handler is None:
                raise ApiError(404, "Not Found")
            if self._failures[method]:
                raise self._failures[method].pop(0)
            return _answer({"ok": True, "result": await handler(params)})
        except ApiError as exc:
            call.status = exc.code
            body = {"ok": False, "error_code": exc.code, "description": exc.description}
            if exc.retry_after is not None:
                body["parameters"] = {"retry_after": exc.retry_after}
            if exc.migrate_to is not None:
                body["parameters"] = {"migrate_to_chat_id": exc.migrate_to}
            return _answer(body, exc.code)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        record = Download(request.match_info["path"])
        self.downloads.append(record)
        try:
            content = self._file_at(request)
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = record.size = len(content)
            await response.prepare(request)
            await self._stream(request, response, content, record)
            return response
        except ApiError as exc:
            record.status = exc.code
            return _answer({"ok": False, "error_code": exc.code, "description": exc.description},
                           exc.code)
        finally:
            record.ended = True

    def _file_at(self, request: web.Request) -> Content:
        if request.match_info["token"] != self.token:
            raise ApiError(401, "Unauthorized")
        if self._failures["download"]:
            raise self._failures["download"].pop(0)
        path = request.match_info["path"]
        found = [content for file_path, content in self._files.values() if file_path == path]
        if not found or self.local_dir is not None:  # --local serves no files over HTTP
            raise ApiError(404, "Not Found")
        return found[0]

    async def _stream(self, request: web.Request, response: web.StreamResponse, content: Content,
                      record: Download) -> None:
        """Send the body a chunk at a time, as far as the client takes it (or a cut allows)."""
        cut = self._cuts.pop(0) if self._cuts else None
        try:
            for chunk in _chunks(content):
                if cut is not None and record.sent + len(chunk) > cut.after:
                    chunk = chunk[:cut.after - record.sent]
                    await response.write(chunk)
                    record.sent += len(chunk)
                    while cut.stall and _open(request):  # until the client gives up
                        await asyncio.sleep(0.02)
                    if _open(request):
                        request.transport.close()  # the network breaks mid-file
                    return
                await response.write(chunk)  # waits while the client does not read
                record.sent += len(chunk)
            await response.write_eof()
            record.complete = True
        except ConnectionError:  # the client closed the connection: stop sending
            pass

    def _me(self) -> dict:
        return {"id": self.bot_id, "is_bot": True, "first_name": "OpenClaw", "username": self.username,
                "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}

    async def _m_getMe(self, params: dict) -> dict:
        return self._me()

    async def _m_deleteWebhook(self, params: dict) -> bool:
        return True

    async def _m_setMyCommands(self, params: dict) -> bool:
        self.commands = list(params.get("commands") or [])
        return True

    async def _m_getUpdates(self, params: dict) -> list[dict]:
        offset = int(params.get("offset") or 0)
        if offset > 0:  # everything below the offset is confirmed and forgotten
            self.confirmed = max(self.confirmed, offset)
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        limit = int(params.get("limit") or 100)
        deadline = time.monotonic() + float(params.get("timeout") or 0)
        poll = self._take_over_polling()
        self.polls_waiting += 1
        try:
            while not self.updates and (left := deadline - time.monotonic()) > 0:
                changed = asyncio.ensure_future(self._changed.wait())
                ended = asyncio.ensure_future(poll.terminated.wait())
                try:
                    await asyncio.wait([changed, ended], timeout=left,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
                    ended.cancel()
                if poll.terminated.is_set():
                    raise ApiError(409, "Conflict: terminated by other getUpdates request; make sure "
                                        "that only one bot instance is running")
        finally:
            self.polls_waiting -= 1
        return self.updates[:limit]

    def _take_over_polling(self) -> _Poll:
        """As Telegram does, a new getUpdates ends the one still waiting (409 Conflict)."""
        if self._poll is not None:
            self._poll.terminated.set()
        self._poll = _Poll()
        return self._poll

    async def _m_sendMessage(self, params: dict) -> dict:
        chat = _chat_id(params)
        if chat in self.blocked_by:
            raise ApiError(403, "Forbidden: bot was blocked by the user" if chat > 0
                           else "Forbidden: bot was kicked from the supergroup chat")
        self._not_migrated(chat)
        text, parse_mode = str(params.get("text") or ""), params.get("parse_mode")
        shown = self._visible(text, parse_mode)
        message_id = next(self._message_ids[chat])
        # Without message_thread_id a message to a forum goes to its General topic.
        topic = int(params["message_thread_id"]) if params.get("message_thread_id") else None
        sent = BotMessage(message_id, text, parse_mode, shown, topic=topic,
                          buttons=_inline_keyboard(params))
        self.bot_messages[chat].append(sent)
        message = self._message_json(chat, sent)
        self._history[chat][message_id] = message
        return message

    async def _m_editMessageText(self, params: dict) -> dict:
        chat = _chat_id(params)
        self._not_migrated(chat)
        target = next((m for m in self.bot_messages[chat]
                       if m.message_id == int(params.get("message_id") or 0)), None)
        if target is None:
            raise ApiError(400, "Bad Request: message to edit not found")
        text, parse_mode = str(params.get("text") or ""), params.get("parse_mode")
        shown = self._visible(text, parse_mode)
        if shown == target.shown and text == target.text:
            raise ApiError(400, "Bad Request: message is not modified: specified new message content "
                                "and reply markup are exactly the same as a current content and "
                                "reply markup of the message")
        target.text, target.parse_mode, target.shown = text, parse_mode, shown
        target.buttons = _inline_keyboard(params)  # an edit without one removes the keyboard
        target.edits += 1
        return self._message_json(chat, target)

    async def _m_answerCallbackQuery(self, params: dict) -> bool:
        self.answered_taps.append(str(params.get("callback_query_id")))
        return True

    async def _m_sendChatAction(self, params: dict) -> bool:
        chat = _chat_id(params)
        self._not_migrated(chat)
        self.actions.append((chat, str(params.get("action"))))
        return True

    def _not_migrated(self, chat: int) -> None:
        """Telegram's answer to any call naming a group that became a supergroup."""
        if chat in self.migrated:
            raise ApiError(400, "Bad Request: group chat was upgraded to a supergroup chat",
                           migrate_to=self.migrated[chat])

    async def _m_getFile(self, params: dict) -> dict:
        file_id = str(params.get("file_id"))
        if file_id not in self._files:
            raise ApiError(400, "Bad Request: invalid file_id")
        file_path, content = self._files[file_id]
        return {"file_id": file_id, "file_unique_id": f"u{file_id}",
                "file_size": self._declared_sizes.get(file_id, len(content)), "file_path": file_path}

    def _visible(self, text: str, parse_mode: str | None) -> str:
        """The text a chat shows; raises the 400s Telegram gives for bad or too long text."""
        if parse_mode and self.reject_formatting:
            raise ApiError(400, "Bad Request: can't parse entities: Can't find end of the entity "
                                "starting at byte offset 0")
        shown = _html_text(text) if parse_mode == "HTML" else text
        if not shown.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if len(shown) > MAX_TEXT:
            raise ApiError(400, "Bad Request: message is too long")
        return shown

    def _message_json(self, chat: int, sent: BotMessage) -> dict:
        message = {"message_id": sent.message_id, "date": int(time.time()), "chat": _chat_json(chat),
                   "from": self._me(), "text": sent.shown}
        if sent.topic is not None:
            message.update(message_thread_id=sent.topic, is_topic_message=True)
        if sent.buttons:
            message["reply_markup"] = {"inline_keyboard": sent.buttons}
        return message

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()


# ---- wire helpers -------------------------------------------------------------------------------


async def _params(request: web.Request) -> dict[str, Any]:
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


def _inline_keyboard(params: dict) -> list[list[dict]] | None:
    markup = params.get("reply_markup")
    return markup.get("inline_keyboard") if isinstance(markup, dict) else None


def _open(request: web.Request) -> bool:
    return request.transport is not None and not request.transport.is_closing()


def _chunks(content: Content) -> Iterator[bytes]:
    if isinstance(content, Generated):
        return content.chunks()
    return (content[at:at + CHUNK] for at in range(0, len(content), CHUNK))


def _answer(body: dict, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(body), status=status, content_type="application/json")


def _chat_json(chat: int, first_name: str = "Ada") -> dict:
    """A chat as Telegram describes it: a user's private chat has their (positive) id; a
    supergroup's id is -100 and then at least ten digits; other negative ids are basic groups."""
    if chat > 0:
        return {"id": chat, "type": "private", "first_name": first_name}
    kind = "supergroup" if chat <= -1_000_000_000_000 else "group"
    return {"id": chat, "type": kind, "title": "A group"}


def _chat_id(params: dict) -> int:
    try:
        return int(params["chat_id"])
    except (KeyError, TypeError, ValueError):
        raise ApiError(400, "Bad Request: chat not found") from None


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _entities(text: str) -> list[dict]:
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


def _html_text(text: str) -> str:
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
