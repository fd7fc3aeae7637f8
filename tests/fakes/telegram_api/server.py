"""The fake Bot API server: its state, what users do, what tests inspect or arrange, and the Bot
API methods the connector calls (see the package's docstring)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fakes.loopback import serve
from tests.fakes.telegram_api.files import Content, Cut, Download, chunks, stream
from tests.fakes.telegram_api.wire import (
    MAX_TEXT,
    ApiError,
    BotMessage,
    Call,
    answer,
    chat_id_of,
    chat_json,
    entities_in,
    inline_keyboard,
    request_params,
    visible_html,
)

# Update kinds Telegram sends only to a bot that names them in allowed_updates.
OPT_IN_UPDATES = ("chat_member", "message_reaction", "message_reaction_count")


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
        # The bot's getUpdates allowed_updates, kept from call to call as Telegram does; None:
        # every kind but those Telegram sends only when asked (OPT_IN_UPDATES).
        self.allowed_updates: list[str] | None = None
        self._reactions: dict[tuple[int, int, int], list[dict]] = {}  # (chat, message, user)
        self.downloads: list[Download] = []  # every GET of /file/bot<token>/...
        self._cuts: list[Cut] = []
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
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._api)
        app.router.add_get("/bot{token}/{method}", self._api)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        # stop() drops open connections (a held long poll too) almost at once, as an outage does
        self._runner, self.port = await serve(app, self.port)

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
                   "chat": chat_json(chat_id, first_name),
                   "from": {"id": user, "is_bot": False, "first_name": first_name}, **fields}
        if topic is not None:
            message["chat"]["is_forum"] = True
            message.update(message_thread_id=topic, is_topic_message=True)
        if text is not None:
            key = "caption" if any(k in fields for k in ("document", "photo", "voice")) else "text"
            message[key] = text
            found = entities if entities is not None else entities_in(text)
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
                for chunk in chunks(content):
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

    def react(self, chat: int, message_id: int, emoji: str | list[str] | None, user: int = 1001,
              *, first_name: str = "Ada") -> int:
        """`user` sets their reactions to message `message_id` of `chat` to `emoji` (one, several
        as a premium user may, or None: all taken back); Telegram's message_reaction update
        says what they were and what they are now. Returns the update's id."""
        new = [{"type": "emoji", "emoji": e}
               for e in ([] if emoji is None else [emoji] if isinstance(emoji, str) else emoji)]
        old = self._reactions.get((chat, message_id, user), [])
        self._reactions[(chat, message_id, user)] = new
        return self.add_update({"message_reaction": {
            "chat": chat_json(chat), "message_id": message_id, "date": int(time.time()),
            "user": {"id": user, "is_bot": False, "first_name": first_name},
            "old_reaction": old, "new_reaction": new}})

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
        self._cuts.append(Cut(after, stall))

    # ---- the HTTP side ------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await request_params(request)
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
            return answer({"ok": True, "result": await handler(params)})
        except ApiError as exc:
            call.status = exc.code
            body = {"ok": False, "error_code": exc.code, "description": exc.description}
            if exc.retry_after is not None:
                body["parameters"] = {"retry_after": exc.retry_after}
            if exc.migrate_to is not None:
                body["parameters"] = {"migrate_to_chat_id": exc.migrate_to}
            return answer(body, exc.code)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        record = Download(request.match_info["path"])
        self.downloads.append(record)
        try:
            content = self._file_at(request)
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = record.size = len(content)
            await response.prepare(request)
            cut = self._cuts.pop(0) if self._cuts else None
            await stream(request, response, content, record, cut)
            return response
        except ApiError as exc:
            record.status = exc.code
            return answer({"ok": False, "error_code": exc.code, "description": exc.description},
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
        if params.get("allowed_updates") is not None:
            self.allowed_updates = list(params["allowed_updates"])
        offset = int(params.get("offset") or 0)
        if offset > 0:  # everything below the offset is confirmed and forgotten
            self.confirmed = max(self.confirmed, offset)
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        self.updates = [u for u in self.updates if self._allowed(u)]
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
        # Kinds the bot did not ask for are never sent, nor kept for later.
        self.updates = [u for u in self.updates if self._allowed(u)]
        return self.updates[:limit]

    def _allowed(self, update: dict) -> bool:
        kind = next(key for key in update if key != "update_id")
        if self.allowed_updates is None or not self.allowed_updates:  # [] means the default too
            return kind not in OPT_IN_UPDATES
        return kind in self.allowed_updates

    def _take_over_polling(self) -> _Poll:
        """As Telegram does, a new getUpdates ends the one still waiting (409 Conflict)."""
        if self._poll is not None:
            self._poll.terminated.set()
        self._poll = _Poll()
        return self._poll

    async def _m_sendMessage(self, params: dict) -> dict:
        chat = chat_id_of(params)
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
                          buttons=inline_keyboard(params))
        self.bot_messages[chat].append(sent)
        message = self._message_json(chat, sent)
        self._history[chat][message_id] = message
        return message

    async def _m_editMessageText(self, params: dict) -> dict:
        chat = chat_id_of(params)
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
        target.buttons = inline_keyboard(params)  # an edit without one removes the keyboard
        target.edits += 1
        return self._message_json(chat, target)

    async def _m_answerCallbackQuery(self, params: dict) -> bool:
        self.answered_taps.append(str(params.get("callback_query_id")))
        return True

    async def _m_sendChatAction(self, params: dict) -> bool:
        chat = chat_id_of(params)
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
        shown = visible_html(text) if parse_mode == "HTML" else text
        if not shown.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if len(shown) > MAX_TEXT:
            raise ApiError(400, "Bad Request: message is too long")
        return shown

    def _message_json(self, chat: int, sent: BotMessage) -> dict:
        message = {"message_id": sent.message_id, "date": int(time.time()), "chat": chat_json(chat),
                   "from": self._me(), "text": sent.shown}
        if sent.topic is not None:
            message.update(message_thread_id=sent.topic, is_topic_message=True)
        if sent.buttons:
            message["reply_markup"] = {"inline_keyboard": sent.buttons}
        return message

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

