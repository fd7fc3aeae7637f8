"""A local fake Discord for tests: the REST API (v10) and the websocket gateway on 127.0.0.1, speaking
enough of the real wire protocol that the real discord.py client logs in, identifies, resumes,
receives messages and slash commands, and answers them.

One bot (one token, one application) and one guild with one text channel. Tests inject what users
do (`send_dm`, `send_guild_message`, each with optional `files`; `slash`), read what the bot did
(`texts`, `typing`, `interactions`, `cdn_requests`), and break things: `fail` queues an error
answer for a route, `drop_websocket` cuts the gateway connection, `stop()` / `start()` take the
whole server away and bring it back on the same port (sessions and messages survive, as they do at
Discord).

Files users attach are served as Discord's CDN serves them: at the attachment's `url` (here on this
server, `/attachments/<channel>/<attachment>/<name>?ex=..&is=..&hm=..`), without the bot token, and
404 without the URL's signature or once the URL expired (`ex`, hex Unix time: a day after the upload,
or `attachment_url_lifetime` seconds).
"""

from __future__ import annotations

import asyncio
import fnmatch
import itertools
import json
import re
import secrets
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

API = "/api/v10"
JSON = "application/json"  # exactly this: discord.py only decodes bodies whose type has no charset

# gateway opcodes and the intents this fake honours
DISPATCH, HEARTBEAT, IDENTIFY, RESUME, INVALID_SESSION, HELLO, HEARTBEAT_ACK = 0, 1, 2, 6, 9, 10, 11
GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES, MESSAGE_CONTENT = 1 << 0, 1 << 9, 1 << 12, 1 << 15
# interaction callback types
CHANNEL_MESSAGE, DEFERRED_CHANNEL_MESSAGE = 4, 5


@dataclass
class Recorded:
    """One REST request as the fake saw it."""

    method: str
    path: str  # under /api/v10, e.g. "/channels/123/messages"
    body: Any
    at: float  # time.monotonic()


@dataclass(frozen=True)
class Upload:
    """A file a user attaches to a message: what Discord's app uploads for them."""

    filename: str
    content: bytes
    content_type: str | None = None  # Discord leaves it out for types it does not recognise
    voice: bool = False  # recorded in the app as a voice message (audio/ogg with a waveform)
    declared_size: int | None = None  # the size the message states, if not the content's (a lie)


@dataclass
class _Failure:
    route: str  # "METHOD /path" with fnmatch wildcards
    status: int
    retry_after: float
    times: int


@dataclass
class _Session:
    """A gateway session: what it was sent (for RESUME) and the socket it is on, if any."""

    id: str
    intents: int
    seq: int = 0
    sent: list[dict] = field(default_factory=list)
    conn: _Connection | None = None


class _Connection:
    """One websocket; frames go out in order through a single writer."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.outbox: asyncio.Queue[dict | int] = asyncio.Queue()  # a frame, or a close code
        self.writer = asyncio.create_task(self._write())

    def send(self, frame: dict) -> None:
        self.outbox.put_nowait(frame)

    def close(self, code: int) -> None:
        self.outbox.put_nowait(code)

    async def _write(self) -> None:
        while True:
            item = await self.outbox.get()
            if isinstance(item, int):
                await self.ws.close(code=item)
                return
            try:
                await self.ws.send_str(json.dumps(item))
            except (ConnectionError, RuntimeError):
                return  # the client went away; what it missed is replayed on RESUME


class FakeDiscord:
    def __init__(self, token: str = "fake-bot-token") -> None:
        self.token = token
        self._ids = itertools.count(1_200_000_000_000_000_001)  # snowflake-sized: 19 digits
        self.bot = self.user(self._next_id(), "clawbot", bot=True)
        self.application_id = int(self.bot["id"])  # as for every bot made in the developer portal
        self.owner = self.user(self._next_id(), "owner")
        self.guild_id = self._next_id()
        self.guild_channel_id = self._next_id()
        self.port: int | None = None
        self.messages: dict[int, list[dict]] = {}  # channel id -> messages, every author, in order
        self.edits: list[tuple[int, str, float]] = []  # (message id, new content, when)
        self.typing: list[int] = []  # channel ids, one entry per typing trigger
        self.requests: list[Recorded] = []
        self.cdn_requests: list[Recorded] = []  # downloads of attached files, whether served or not
        self.commands: list[dict] = []  # the application's global slash commands
        self.interactions: dict[int, dict] = {}  # id -> payload plus "callback" and "response_id"
        self.expire_interactions = False  # answer callbacks as Discord does after its 3 s window
        self.identifies = 0
        self.resumes = 0
        self.message_content_intent = True  # the developer portal's switch for the privileged intent
        self.attachment_url_lifetime = 86400.0  # seconds an attachment's signed URL works
        self._dm_channels: dict[int, int] = {}  # user id -> DM channel id
        self._files: dict[str, tuple[Upload, str]] = {}  # attachment id -> (file, URL signature)
        self._failures: list[_Failure] = []
        self.refused: dict[int, tuple[int, int, str]] = {}  # channel -> (status, code, message)
        self._sessions: dict[str, _Session] = {}
        self._current: _Session | None = None  # the latest identified session: events go there
        self._conns: set[_Connection] = set()
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a free port the first time, and on the same port after a stop()."""
        app = web.Application(middlewares=[self._rest_middleware])
        app.router.add_get("/", self._gateway)
        self._add_routes(app)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port or 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """The network goes away: sockets close (1001, going away) and nothing listens."""
        for conn in list(self._conns):
            conn.close(1001)
        await asyncio.gather(*(c.writer for c in list(self._conns)), return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def connections(self) -> int:
        """Open gateway websockets."""
        return len(self._conns)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}{API}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    # ---- what users do -------------------------------------------------------------------

    def user(self, user_id: int, name: str | None = None, *, bot: bool = False) -> dict:
        name = name or f"user{str(user_id)[-4:]}"
        return {"id": str(user_id), "username": name, "global_name": name.title(),
                "discriminator": "0", "avatar": None, "bot": bot, "public_flags": 0}

    def dm_channel_id(self, user_id: int) -> int:
        if user_id not in self._dm_channels:
            self._dm_channels[user_id] = self._next_id()
        return self._dm_channels[user_id]

    def send_dm(self, user_id: int, text: str, *, name: str | None = None, bot: bool = False,
                files: Sequence[Upload] = (), sticker: str | None = None) -> dict:
        """A user writes to the bot in a direct message; returns the message as dispatched.
        `sticker` names a sticker sent with it (Discord's sticker_items)."""
        message = self._message(self.dm_channel_id(user_id), self.user(user_id, name, bot=bot), text)
        self._attach(message, files)
        if sticker is not None:
            message["sticker_items"] = [{"id": str(self._next_id()), "name": sticker, "format_type": 1}]
        self._store(message)
        return message

    def send_guild_message(self, user_id: int, text: str, *, mention: bool = False,
                           name: str | None = None, bot: bool = False, files: Sequence[Upload] = ()) -> dict:
        """A user writes in the guild's text channel; `mention` puts "<@bot>" in front, as the
        Discord app does when you pick the bot from the @ list."""
        author = self.user(user_id, name, bot=bot)
        content = f"<@{self.bot['id']}> {text}" if mention else text
        message = self._message(self.guild_channel_id, author, content, guild=True)
        if mention:
            message["mentions"] = [{**self.bot, "member": self._member()}]
        self._attach(message, files)
        self._store(message)
        return message

    def slash(self, user_id: int, command: str, *, guild: bool = False, name: str | None = None,
              options: dict[str, int | str] | None = None) -> dict:
        """A user runs /`command` (a registered global command), in a DM or in the guild, with
        `options` by name, typed as the command registered them."""
        registered = next((c for c in self.commands if c["name"] == command), None)
        if registered is None:
            raise AssertionError(f"/{command} is not registered (have {[c['name'] for c in self.commands]})")
        user = self.user(user_id, name)
        interaction = {
            "id": str(self._next_id()), "application_id": str(self.application_id), "type": 2,
            "token": uuid.uuid4().hex, "version": 1, "locale": "en-US", "app_permissions": "0",
            "entitlements": [], "attachment_size_limit": 8 * 1024 * 1024,
            "authorizing_integration_owners": {"0": str(self.guild_id if guild else user_id)},
            "data": {"id": registered["id"], "name": command, "type": 1},
        }
        if options:
            types = {o["name"]: o["type"] for o in registered.get("options", [])}
            unknown = set(options) - set(types)
            if unknown:
                raise AssertionError(f"/{command} has no option {sorted(unknown)} (has {sorted(types)})")
            interaction["data"]["options"] = [{"name": k, "type": types[k], "value": v}
                                              for k, v in options.items()]
        if guild:
            interaction.update(guild_id=str(self.guild_id), context=0,
                               channel_id=str(self.guild_channel_id), channel=self._guild_channel(),
                               member={**self._member(), "user": user, "permissions": "0"},
                               guild={"id": str(self.guild_id), "locale": "en-US", "features": []})
        else:
            channel_id = self.dm_channel_id(user_id)
            interaction.update(context=1, channel_id=str(channel_id), user=user,
                               channel={"id": str(channel_id), "type": 1, "recipients": [user]})
        self.interactions[int(interaction["id"])] = {**interaction, "callback": None,
                                                     "response_id": None}
        self._dispatch("INTERACTION_CREATE", interaction)
        return interaction

    # ---- what the bot did ----------------------------------------------------------------

    def texts(self, channel_id: int, *, by_bot: bool = True) -> list[str]:
        """The current text of the channel's messages (the bot's, or everyone's), in order."""
        return [m["content"] for m in self.messages.get(channel_id, [])
                if not by_bot or m["author"]["id"] == self.bot["id"]]

    def requests_to(self, method: str, pattern: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and fnmatch.fnmatch(r.path, pattern)]

    # ---- breaking things -----------------------------------------------------------------

    def fail(self, route: str, status: int = 429, *, retry_after: float = 0.5, times: int = 1) -> None:
        """Answer the next `times` requests matching `route` ("POST /channels/*/messages", or
        "GET /attachments/*" for the CDN) with `status`. A 429 carries `retry_after` the way Discord
        sends it (body and header)."""
        self._failures.append(_Failure(route, status, retry_after, times))

    def refuse_channel(self, channel_id: int, status: int = 403, code: int = 50007,
                       message: str = "Cannot send messages to this user") -> None:
        """From now on answer every message posted to this channel with this error, as Discord
        does once a user closed their DMs or blocked the bot (403, 50007), the bot lost access
        (403, 50001) or the channel was deleted (404, 10003)."""
        self.refused[channel_id] = (status, code, message)

    def delete_message(self, channel_id: int, message_id: int) -> None:
        """Someone deletes a message: editing it from now on gets 404 Unknown Message."""
        self.messages[channel_id] = [m for m in self.messages.get(channel_id, [])
                                     if int(m["id"]) != message_id]

    def drop_websocket(self, code: int = 4000) -> None:
        """Close the bot's gateway connection now (4000: an error the client may RESUME after).
        Events from here on wait in the session until the client resumes."""
        session = self._current
        if session is not None and session.conn is not None:
            session.conn.close(code)
            session.conn = None

    def forget_sessions(self) -> None:
        """Discord lost every session: a RESUME is answered INVALID_SESSION (a new IDENTIFY is
        needed), and events until then are lost, as they are at Discord."""
        for session in self._sessions.values():
            if session.conn is not None:
                session.conn.close(4000)
        self._sessions.clear()
        self._current = None

    # ---- REST ----------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(API + "/users/@me", self._answer(lambda: self.bot))
        r.add_get(API + "/oauth2/applications/@me", self._answer(self._application))
        r.add_get(API + "/gateway", self._answer(lambda: {"url": self.gateway_url}))
        r.add_get(API + "/gateway/bot", self._answer(lambda: {
            "url": self.gateway_url, "shards": 1,
            "session_start_limit": {"total": 1000, "remaining": 999, "reset_after": 0,
                                    "max_concurrency": 1}}))
        r.add_post(API + "/channels/{channel}/messages", self._create_message)
        r.add_patch(API + "/channels/{channel}/messages/{message}", self._edit_message)
        r.add_post(API + "/channels/{channel}/typing", self._trigger_typing)
        r.add_post(API + "/users/@me/channels", self._open_dm)
        r.add_put(API + "/applications/{app}/commands", self._overwrite_commands)
        r.add_get(API + "/applications/{app}/commands", self._answer(lambda: self.commands))
        r.add_post(API + "/interactions/{id}/{token}/callback", self._interaction_callback)
        r.add_patch(API + "/webhooks/{app}/{token}/messages/@original", self._edit_original)
        r.add_delete(API + "/webhooks/{app}/{token}/messages/@original", self._delete_original)
        r.add_post(API + "/webhooks/{app}/{token}", self._followup)
        r.add_get("/attachments/{channel}/{id}/{name:.+}", self._cdn)  # cdn.discordapp.com
        r.add_get("/media/attachments/{channel}/{id}/{name:.+}", self._cdn)  # media.discordapp.net

    @staticmethod
    def _answer(payload):
        """A handler for a GET that answers `payload()` as JSON."""
        async def handler(request: web.Request) -> web.Response:
            return _json(payload())
        return handler

    @web.middleware
    async def _rest_middleware(self, request: web.Request, handler) -> web.StreamResponse:
        if not request.path.startswith(API):
            return await handler(request)
        path = request.path[len(API):]
        body = await request.json() if request.content_type == JSON and request.can_read_body else None
        self.requests.append(Recorded(request.method, path, body, time.monotonic()))
        failure = self._take_failure(f"{request.method} {path}")
        if failure is not None:
            return _failure(failure)
        webhook = path.startswith(("/webhooks/", "/interactions/"))  # the token is in the URL
        if not webhook and request.headers.get("Authorization") != f"Bot {self.token}":
            return _json({"message": "401: Unauthorized", "code": 0}, 401)
        return await handler(request)

    def _take_failure(self, route: str) -> _Failure | None:
        for failure in self._failures:
            if fnmatch.fnmatch(route, failure.route):
                failure.times -= 1
                if failure.times <= 0:
                    self._failures.remove(failure)
                return failure
        return None

    async def _create_message(self, request: web.Request) -> web.Response:
        body = await request.json()
        channel_id = int(request.match_info["channel"])
        if (refusal := self.refused.get(channel_id)) is not None:
            status, code, message = refusal
            return _json({"message": message, "code": code}, status)
        if (error := _check_content(body.get("content"))) is not None:
            return error
        guild = channel_id == self.guild_channel_id
        message = self._message(channel_id, self.bot, body["content"], guild=guild)
        self._store(message)  # Discord echoes the bot's own messages back over the gateway
        return _json(message)

    async def _edit_message(self, request: web.Request) -> web.Response:
        body = await request.json()
        message = self._find(int(request.match_info["channel"]), int(request.match_info["message"]))
        if message is None:
            return _json({"message": "Unknown Message", "code": 10008}, 404)
        if (error := _check_content(body.get("content"))) is not None:
            return error
        return _json(self._edit(message, body["content"]))

    async def _trigger_typing(self, request: web.Request) -> web.Response:
        self.typing.append(int(request.match_info["channel"]))
        return web.Response(status=204)

    async def _open_dm(self, request: web.Request) -> web.Response:
        user_id = int((await request.json())["recipient_id"])
        user = self.user(user_id)
        return _json({"id": str(self.dm_channel_id(user_id)), "type": 1, "recipients": [user],
                      "last_message_id": None})

    async def _overwrite_commands(self, request: web.Request) -> web.Response:
        self.commands = [{**c, "id": str(self._next_id()), "application_id": str(self.application_id),
                          "version": str(self._next_id()), "type": c.get("type", 1),
                          "default_member_permissions": c.get("default_member_permissions"),
                          "nsfw": c.get("nsfw", False), "options": c.get("options", [])}
                         for c in await request.json()]
        return _json(self.commands)

    async def _interaction_callback(self, request: web.Request) -> web.Response:
        interaction = self.interactions.get(int(request.match_info["id"]))
        if (interaction is None or interaction["token"] != request.match_info["token"]
                or self.expire_interactions):
            return _json({"message": "Unknown interaction", "code": 10062}, 404)
        if interaction["callback"] is not None:
            return _json({"message": "Interaction has already been acknowledged.", "code": 40060}, 400)
        body = await request.json()
        interaction["callback"] = body["type"]
        resource: dict[str, Any] = {"type": body["type"]}
        if body["type"] == CHANNEL_MESSAGE:
            resource["message"] = self._respond(interaction, body["data"]["content"])
        answer = {"interaction": {"id": interaction["id"], "type": 2,
                                  "response_message_loading": body["type"] == DEFERRED_CHANNEL_MESSAGE},
                  "resource": resource}
        return _json(answer) if request.query.get("with_response") else web.Response(status=204)

    async def _edit_original(self, request: web.Request) -> web.Response:
        interaction = self._interaction_for(request)
        if interaction is None or interaction["callback"] is None:
            return _json({"message": "Unknown Webhook", "code": 10015}, 404)
        content = (await request.json()).get("content")
        if (error := _check_content(content)) is not None:
            return error
        return _json(self._respond(interaction, content))

    async def _delete_original(self, request: web.Request) -> web.Response:
        interaction = self._interaction_for(request)
        if interaction is None or interaction["callback"] is None:
            return _json({"message": "Unknown Webhook", "code": 10015}, 404)
        interaction["deleted"] = True
        return web.Response(status=204)

    async def _followup(self, request: web.Request) -> web.Response:
        interaction = self._interaction_for(request)
        if interaction is None or interaction["callback"] is None:
            return _json({"message": "Unknown Webhook", "code": 10015}, 404)
        content = (await request.json()).get("content")
        if (error := _check_content(content)) is not None:
            return error
        message = self._message(int(interaction["channel_id"]), self.bot, content,
                                guild="guild_id" in interaction)
        message["webhook_id"] = str(self.application_id)
        self._store(message)
        return _json(message)

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        self.cdn_requests.append(Recorded("GET", request.path, None, time.monotonic()))
        failure = self._take_failure(f"GET {request.path}")
        if failure is not None:
            return _failure(failure)
        upload, signature = self._files.get(request.match_info["id"], (None, None))
        if (upload is None or request.query.get("hm") != signature  # unknown, or the URL was cut
                or int(request.query.get("ex", "0"), 16) <= time.time()):  # or expired
            return web.Response(status=404, text="This content is no longer available.")
        return web.Response(body=upload.content,
                            headers={"Content-Type": upload.content_type or "application/octet-stream"})

    def _interaction_for(self, request: web.Request) -> dict | None:
        token = request.match_info["token"]
        return next((i for i in self.interactions.values() if i["token"] == token), None)

    def _respond(self, interaction: dict, content: str) -> dict:
        """Create or edit the interaction's response message (the "thinking..." one)."""
        if interaction["response_id"] is not None:
            found = self._find(int(interaction["channel_id"]), interaction["response_id"])
            if found is not None:
                return self._edit(found, content)
        message = self._message(int(interaction["channel_id"]), self.bot, content,
                                guild="guild_id" in interaction)
        message.update(webhook_id=str(self.application_id), type=20,  # CHAT_INPUT_COMMAND
                       interaction_metadata={"id": interaction["id"], "type": 2,
                                             "user": interaction.get("user") or interaction["member"]["user"],
                                             "authorizing_integration_owners": {}})
        interaction["response_id"] = int(message["id"])
        self._store(message)
        return message

    # ---- messages ------------------------------------------------------------------------

    def _message(self, channel_id: int, author: dict, content: str, *, guild: bool = False) -> dict:
        message = {
            "id": str(self._next_id()), "channel_id": str(channel_id), "type": 0, "content": content,
            "author": author, "timestamp": _now(), "edited_timestamp": None, "tts": False,
            "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
            "embeds": [], "pinned": False, "flags": 0, "components": [],
        }
        if guild:
            message.update(guild_id=str(self.guild_id), member=self._member())
        return message

    def _attach(self, message: dict, files: Sequence[Upload]) -> None:
        """Attachment objects as Discord puts them in a message, each file served at its url."""
        for upload in files:
            attachment_id = str(self._next_id())
            signature = secrets.token_hex(16)
            self._files[attachment_id] = (upload, signature)
            # the URL names the file as Discord does: its own safe spelling, whatever the upload said
            url_name = re.sub(r"[^\w.-]", "_", upload.filename).strip(".") or "unknown"
            path = f"attachments/{message['channel_id']}/{attachment_id}/{url_name}"
            now = time.time()
            query = f"?ex={int(now + self.attachment_url_lifetime):x}&is={int(now):x}&hm={signature}&"
            size = len(upload.content) if upload.declared_size is None else upload.declared_size
            attachment = {"id": attachment_id, "filename": upload.filename, "size": size,
                          "url": f"http://127.0.0.1:{self.port}/{path}{query}",
                          "proxy_url": f"http://127.0.0.1:{self.port}/media/{path}{query}"}
            if upload.content_type is not None:
                attachment["content_type"] = upload.content_type
            if upload.voice:
                attachment.update(duration_secs=1.5, waveform="AAAAAA==")
                message["flags"] |= 1 << 13  # IS_VOICE_MESSAGE
            message["attachments"].append(attachment)

    def _store(self, message: dict) -> None:
        self.messages.setdefault(int(message["channel_id"]), []).append(message)
        self._dispatch("MESSAGE_CREATE", message)

    def _edit(self, message: dict, content: str) -> dict:
        message.update(content=content, edited_timestamp=_now())
        self.edits.append((int(message["id"]), content, time.monotonic()))
        self._dispatch("MESSAGE_UPDATE", message)
        return message

    def _find(self, channel_id: int, message_id: int) -> dict | None:
        return next((m for m in self.messages.get(channel_id, []) if int(m["id"]) == message_id), None)

    # ---- gateway -------------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        conn = _Connection(ws)
        self._conns.add(conn)
        conn.send({"op": HELLO, "d": {"heartbeat_interval": 41_250}, "s": None, "t": None})
        try:
            async for frame in ws:
                if frame.type is not WSMsgType.TEXT:
                    continue
                payload = json.loads(frame.data)
                op, data = payload.get("op"), payload.get("d")
                if op == HEARTBEAT:
                    conn.send({"op": HEARTBEAT_ACK, "d": None, "s": None, "t": None})
                elif op == IDENTIFY:
                    self._identify(conn, data)
                elif op == RESUME:
                    self._resume(conn, data)
        finally:
            self._conns.discard(conn)
            for session in self._sessions.values():
                if session.conn is conn:
                    session.conn = None
            conn.close(1000)
        return ws

    def _identify(self, conn: _Connection, data: dict) -> None:
        if data.get("token") != self.token:
            conn.close(4004)  # Authentication failed
            return
        if int(data.get("intents", 0)) & MESSAGE_CONTENT and not self.message_content_intent:
            conn.close(4014)  # Disallowed intent(s)
            return
        self.identifies += 1
        session = _Session(uuid.uuid4().hex, int(data.get("intents", 0)), conn=conn)
        self._sessions[session.id] = session
        self._current = session
        self._send(session, "READY", {
            "v": 10, "user": self.bot, "session_id": session.id,
            "resume_gateway_url": self.gateway_url, "shard": [0, 1],
            "guilds": [{"id": str(self.guild_id), "unavailable": True}],
            "application": {"id": str(self.application_id), "flags": 0},
            "private_channels": [], "relationships": [], "presences": [],
            "geo_ordered_rtc_regions": [], "user_settings": {}})
        if session.intents & GUILDS:
            self._send(session, "GUILD_CREATE", self._guild())

    def _resume(self, conn: _Connection, data: dict) -> None:
        session = self._sessions.get(data.get("session_id", ""))
        if session is None or data.get("token") != self.token:
            conn.send({"op": INVALID_SESSION, "d": False, "s": None, "t": None})
            return
        self.resumes += 1
        session.conn = conn
        self._current = session
        for frame in session.sent:  # what it missed, in order, then RESUMED
            if frame["s"] > (data.get("seq") or 0):
                conn.send(frame)
        self._send(session, "RESUMED", {})

    def _dispatch(self, event: str, data: dict) -> None:
        session = self._current
        seen = None if session is None else _wanted(session.intents, event, data, self.bot["id"])
        if seen is not None:
            self._send(session, event, seen)

    def _send(self, session: _Session, event: str, data: dict) -> None:
        session.seq += 1
        frame = {"op": DISPATCH, "s": session.seq, "t": event, "d": json.loads(json.dumps(data))}
        session.sent.append(frame)
        if session.conn is not None:
            session.conn.send(frame)

    # ---- payloads ------------------------------------------------------------------------

    def _next_id(self) -> int:
        return next(self._ids)

    def _application(self) -> dict:
        return {"id": str(self.application_id), "name": self.bot["username"], "icon": None,
                "description": "", "bot_public": False, "bot_require_code_grant": False,
                "owner": self.owner, "verify_key": "0" * 64, "flags": 0, "team": None,
                "bot": self.bot, "rpc_origins": [], "interactions_endpoint_url": None,
                "redirect_uris": [], "tags": []}

    def _member(self) -> dict:
        return {"roles": [], "joined_at": _now(), "deaf": False, "mute": False, "flags": 0,
                "nick": None, "avatar": None}

    def _guild_channel(self) -> dict:
        return {"id": str(self.guild_channel_id), "type": 0, "name": "general",
                "guild_id": str(self.guild_id), "position": 0, "permission_overwrites": [],
                "nsfw": False, "topic": None, "last_message_id": None, "rate_limit_per_user": 0,
                "parent_id": None}

    def _guild(self) -> dict:
        everyone = {"id": str(self.guild_id), "name": "@everyone", "permissions": "1071698660929",
                    "position": 0, "color": 0, "hoist": False, "managed": False,
                    "mentionable": False, "flags": 0}
        return {"id": str(self.guild_id), "name": "Test guild", "owner_id": self.owner["id"],
                "unavailable": False, "large": False, "member_count": 3, "joined_at": _now(),
                "roles": [everyone], "channels": [self._guild_channel()],
                "members": [{**self._member(), "user": self.bot}], "emojis": [], "stickers": [],
                "features": [], "threads": [], "stage_instances": [], "guild_scheduled_events": [],
                "presences": [], "voice_states": [], "soundboard_sounds": [],
                "preferred_locale": "en-US", "premium_tier": 0, "verification_level": 0,
                "default_message_notifications": 0, "explicit_content_filter": 0, "mfa_level": 0,
                "nsfw_level": 0, "system_channel_flags": 0, "afk_timeout": 300}


def _wanted(intents: int, event: str, data: dict, bot_id: str) -> dict | None:
    """The event as a session with these intents receives it, or None if it does not."""
    if event not in ("MESSAGE_CREATE", "MESSAGE_UPDATE"):
        return data
    in_guild = "guild_id" in data
    if not intents & (GUILD_MESSAGES if in_guild else DIRECT_MESSAGES):
        return None
    addressed = not in_guild or any(m["id"] == bot_id for m in data.get("mentions", []))
    if not intents & MESSAGE_CONTENT and not addressed and data["author"]["id"] != bot_id:
        # a privileged intent: without it, guild chatter comes without its text and files
        return {**data, "content": "", "attachments": [], "embeds": []}
    return data


def _check_content(content: Any) -> web.Response | None:
    """Discord's validation of a message's text: present, and at most 2000 characters."""
    if not isinstance(content, str) or not content:
        return _json({"message": "Cannot send an empty message", "code": 50006}, 400)
    if len(content) > 2000:
        return _json({"message": "Invalid Form Body", "code": 50035, "errors": {"content": {
            "_errors": [{"code": "BASE_TYPE_MAX_LENGTH",
                         "message": "Must be 2000 or fewer in length."}]}}}, 400)
    return None


def _failure(failure: _Failure) -> web.Response:
    if failure.status != 429:
        return _json({"message": f"{failure.status}: injected failure", "code": 0}, failure.status)
    body = {"message": "You are being rate limited.", "retry_after": failure.retry_after,
            "global": False}
    # Via marks the answer as Discord's own (a 429 without it comes from Cloudflare: a ban)
    return _json(body, 429, headers={"Retry-After": str(failure.retry_after), "Via": "1.1 google",
                                     "X-RateLimit-Scope": "user"})


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), status=status,
                        headers={"Content-Type": JSON, **(headers or {})})


def _now() -> str:
    return datetime.now(UTC).isoformat()
