"""The fake Discord server: its state, what users do, what the bot did, ways to break things, and
the REST API (v10) with the CDN (see the package's docstring)."""

from __future__ import annotations

import fnmatch
import itertools
import re
import secrets
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.discord_api.gateway import GUILDS, Gateway
from tests.fakes.discord_api.payloads import (
    API,
    JSON,
    application_json,
    check_content,
    failure_response,
    guild_channel_json,
    guild_json,
    json_response,
    member_json,
    now,
    user_json,
)

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
        self.message_content_intent = True  # the developer portal's switch for the privileged intent
        self.attachment_url_lifetime = 86400.0  # seconds an attachment's signed URL works
        self._dm_channels: dict[int, int] = {}  # user id -> DM channel id
        self._files: dict[str, tuple[Upload, str]] = {}  # attachment id -> (file, URL signature)
        self._failures: list[_Failure] = []
        self.refused: dict[int, tuple[int, int, str]] = {}  # channel -> (status, code, message)
        self.gateway = Gateway(self)
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a free port the first time, and on the same port after a stop()."""
        app = web.Application(middlewares=[self._rest_middleware])
        app.router.add_get("/", self.gateway.handle)
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
        await self.gateway.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def connections(self) -> int:
        """Open gateway websockets."""
        return len(self.gateway.conns)

    @property
    def identifies(self) -> int:
        return self.gateway.identifies

    @property
    def resumes(self) -> int:
        return self.gateway.resumes

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}{API}"

    @property
    def gateway_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    # ---- what users do -------------------------------------------------------------------

    def user(self, user_id: int, name: str | None = None, *, bot: bool = False) -> dict:
        return user_json(user_id, name, bot=bot)

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
            message["mentions"] = [{**self.bot, "member": member_json()}]
        self._attach(message, files)
        self._store(message)
        return message

    def send_webhook_message(self, name: str, text: str, *, mention: bool = False) -> dict:
        """A webhook posts in the guild's channel under any `name` it likes: Discord sets
        `webhook_id`, and the author is the webhook (its id, bot: true), with no member."""
        webhook_id = self._next_id()
        author = {"id": str(webhook_id), "username": name, "avatar": None, "discriminator": "0000",
                  "bot": True}
        content = f"<@{self.bot['id']}> {text}" if mention else text
        message = self._message(self.guild_channel_id, author, content, guild=True)
        del message["member"]
        message["webhook_id"] = str(webhook_id)
        if mention:
            message["mentions"] = [{**self.bot, "member": member_json()}]
        self._store(message)
        return message

    def forward_dm(self, user_id: int, original: dict) -> dict:
        """`user_id` forwards `original` to the bot in a DM: as Discord sends it, the forward's own
        content is empty and the original is a snapshot (message_reference type 1)."""
        message = self._message(self.dm_channel_id(user_id), self.user(user_id), "")
        message["message_reference"] = {"type": 1, "channel_id": original["channel_id"],
                                        "message_id": original["id"]}
        message["message_snapshots"] = [{"message": {
            key: original[key] for key in ("type", "content", "embeds", "attachments", "timestamp",
                                           "edited_timestamp", "flags", "mentions", "mention_roles")}}]
        self._store(message)
        return message

    def react(self, user_id: int, message: dict, emoji: str, *, remove: bool = False) -> dict:
        """`user_id` adds (or with `remove` takes back) the Unicode `emoji` on `message` (any
        author's); returns the MESSAGE_REACTION_ADD / _REMOVE event as dispatched."""
        event = {"user_id": str(user_id), "channel_id": message["channel_id"],
                 "message_id": message["id"], "emoji": {"id": None, "name": emoji},
                 "burst": False, "type": 0}
        if "guild_id" in message:
            event["guild_id"] = message["guild_id"]
            if not remove:  # Discord sends the member with an add in a guild only
                event["member"] = {**member_json(), "user": self.user(user_id)}
        if not remove:
            event["message_author_id"] = message["author"]["id"]
        self.gateway.dispatch("MESSAGE_REACTION_REMOVE" if remove else "MESSAGE_REACTION_ADD",
                              event)
        return event

    def edit_by_user(self, message: dict, content: str) -> dict:
        """The message's author edits it: Discord sends MESSAGE_UPDATE with the whole message."""
        message.update(content=content, edited_timestamp=now())
        self.gateway.dispatch("MESSAGE_UPDATE", message)
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
                               channel_id=str(self.guild_channel_id),
                               channel=guild_channel_json(self.guild_id, self.guild_channel_id),
                               member={**member_json(), "user": user, "permissions": "0"},
                               guild={"id": str(self.guild_id), "locale": "en-US", "features": []})
        else:
            channel_id = self.dm_channel_id(user_id)
            interaction.update(context=1, channel_id=str(channel_id), user=user,
                               channel={"id": str(channel_id), "type": 1, "recipients": [user]})
        self.interactions[int(interaction["id"])] = {**interaction, "callback": None,
                                                     "response_id": None}
        self.gateway.dispatch("INTERACTION_CREATE", interaction)
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
        self.gateway.drop(code)

    def forget_sessions(self) -> None:
        """Discord lost every session: a RESUME is answered INVALID_SESSION (a new IDENTIFY is
        needed), and events until then are lost, as they are at Discord."""
        self.gateway.forget_sessions()

    # ---- REST ----------------------------------------------------------------------------

    def _add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(API + "/users/@me", self._answer(lambda: self.bot))
        r.add_get(API + "/oauth2/applications/@me", self._answer(
            lambda: application_json(self.application_id, self.bot, self.owner)))
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
            return json_response(payload())
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
            return failure_response(failure.status, failure.retry_after)
        webhook = path.startswith(("/webhooks/", "/interactions/"))  # the token is in the URL
        if not webhook and request.headers.get("Authorization") != f"Bot {self.token}":
            return json_response({"message": "401: Unauthorized", "code": 0}, 401)
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
            return json_response({"message": message, "code": code}, status)
        if (error := check_content(body.get("content"))) is not None:
            return error
        guild = channel_id == self.guild_channel_id
        message = self._message(channel_id, self.bot, body["content"], guild=guild)
        self._store(message)  # Discord echoes the bot's own messages back over the gateway
        return json_response(message)

    async def _edit_message(self, request: web.Request) -> web.Response:
        body = await request.json()
        message = self._find(int(request.match_info["channel"]), int(request.match_info["message"]))
        if message is None:
            return json_response({"message": "Unknown Message", "code": 10008}, 404)
        if (error := check_content(body.get("content"))) is not None:
            return error
        return json_response(self._edit(message, body["content"]))

    async def _trigger_typing(self, request: web.Request) -> web.Response:
        self.typing.append(int(request.match_info["channel"]))
        return web.Response(status=204)

    async def _open_dm(self, request: web.Request) -> web.Response:
        user_id = int((await request.json())["recipient_id"])
        user = self.user(user_id)
        return json_response({"id": str(self.dm_channel_id(user_id)), "type": 1, "recipients": [user],
                      "last_message_id": None})

    async def _overwrite_commands(self, request: web.Request) -> web.Response:
        self.commands = [{**c, "id": str(self._next_id()), "application_id": str(self.application_id),
                          "version": str(self._next_id()), "type": c.get("type", 1),
                          "default_member_permissions": c.get("default_member_permissions"),
                          "nsfw": c.get("nsfw", False), "options": c.get("options", [])}
                         for c in await request.json()]
        return json_response(self.commands)

    async def _interaction_callback(self, request: web.Request) -> web.Response:
        interaction = self.interactions.get(int(request.match_info["id"]))
        if (interaction is None or interaction["token"] != request.match_info["token"]
                or self.expire_interactions):
            return json_response({"message": "Unknown interaction", "code": 10062}, 404)
        if interaction["callback"] is not None:
            return json_response({"message": "Interaction has already been acknowledged.",
                                  "code": 40060}, 400)
        body = await request.json()
        interaction["callback"] = body["type"]
        resource: dict[str, Any] = {"type": body["type"]}
        if body["type"] == CHANNEL_MESSAGE:
            resource["message"] = self._respond(interaction, body["data"]["content"])
        answer = {"interaction": {"id": interaction["id"], "type": 2,
                                  "response_message_loading": body["type"] == DEFERRED_CHANNEL_MESSAGE},
                  "resource": resource}
        return json_response(answer) if request.query.get("with_response") else web.Response(status=204)

    async def _edit_original(self, request: web.Request) -> web.Response:
        interaction = self._interaction_for(request)
        if interaction is None or interaction["callback"] is None:
            return json_response({"message": "Unknown Webhook", "code": 10015}, 404)
        content = (await request.json()).get("content")
        if (error := check_content(content)) is not None:
            return error
        return json_response(self._respond(interaction, content))

    async def _delete_original(self, request: web.Request) -> web.Response:
        interaction = self._interaction_for(request)
        if interaction is None or interaction["callback"] is None:
            return json_response({"message": "Unknown Webhook", "code": 10015}, 404)
        interaction["deleted"] = True
        return web.Response(status=204)

    async def _followup(self, request: web.Request) -> web.Response:
        interaction = self._interaction_for(request)
        if interaction is None or interaction["callback"] is None:
            return json_response({"message": "Unknown Webhook", "code": 10015}, 404)
        content = (await request.json()).get("content")
        if (error := check_content(content)) is not None:
            return error
        message = self._message(int(interaction["channel_id"]), self.bot, content,
                                guild="guild_id" in interaction)
        message["webhook_id"] = str(self.application_id)
        self._store(message)
        return json_response(message)

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        self.cdn_requests.append(Recorded("GET", request.path, None, time.monotonic()))
        failure = self._take_failure(f"GET {request.path}")
        if failure is not None:
            return failure_response(failure.status, failure.retry_after)
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
            "author": author, "timestamp": now(), "edited_timestamp": None, "tts": False,
            "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [],
            "embeds": [], "pinned": False, "flags": 0, "components": [],
        }
        if guild:
            message.update(guild_id=str(self.guild_id), member=member_json())
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
            uploaded = time.time()
            query = (f"?ex={int(uploaded + self.attachment_url_lifetime):x}&is={int(uploaded):x}"
                     f"&hm={signature}&")
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
        self.gateway.dispatch("MESSAGE_CREATE", message)

    def _edit(self, message: dict, content: str) -> dict:
        message.update(content=content, edited_timestamp=now())
        self.edits.append((int(message["id"]), content, time.monotonic()))
        self.gateway.dispatch("MESSAGE_UPDATE", message)
        return message

    def _find(self, channel_id: int, message_id: int) -> dict | None:
        return next((m for m in self.messages.get(channel_id, []) if int(m["id"]) == message_id), None)

    def ready_events(self, session_id: str, intents: int) -> list[tuple[str, dict]]:
        """READY for a session just identified, and the guild if its intents include guilds."""
        ready = {"v": 10, "user": self.bot, "session_id": session_id,
                 "resume_gateway_url": self.gateway_url, "shard": [0, 1],
                 "guilds": [{"id": str(self.guild_id), "unavailable": True}],
                 "application": {"id": str(self.application_id), "flags": 0},
                 "private_channels": [], "relationships": [], "presences": [],
                 "geo_ordered_rtc_regions": [], "user_settings": {}}
        events = [("READY", ready)]
        if intents & GUILDS:
            events.append(("GUILD_CREATE", guild_json(self.guild_id, self.guild_channel_id,
                                                      self.owner, self.bot)))
        return events

    def _next_id(self) -> int:
        return next(self._ids)
