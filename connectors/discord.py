"""Discord through discord.py: direct messages, and guild channels where the bot is mentioned, with
their attached files; the slash commands /new /stop /status /help; replies sent as messages of at
most 2000 characters, and optionally streamed by editing one draft message.

discord.py owns the transport: REST rate limits (it waits out a 429's retry-after), heartbeats, and
the gateway's reconnect-and-RESUME once connected. This module adds what the daemon needs around it:
a start that does not hang when Discord is down (it keeps trying in the background), a clear error
for a rejected token, and arrival order for inbound messages. Attached files come from Discord's CDN
through a plain HTTP session of our own: it needs no token, so a file in a message recovered at
start-up is fetched while the client is still logging in.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import discord
import yarl
from discord import app_commands

from connectors.attachments import MAX_FILE_BYTES, Writer, media_note, safe_file_name, save_attachment
from connectors.discord_commands import slash_commands
from connectors.discord_reactions import add_reaction_intents, deliver_reaction
from connectors.downloads import DownloadFailed, FileDownloads, reason_for
from connectors.drafts import DraftStream
from openclaw.gateway.contract import (
    Connector,
    ConnectorStartError,
    DeliveryRefused,
    Folder,
    Handler,
    InboundMessage,
)

log = logging.getLogger(__name__)

DRAFT_EDIT_INTERVAL = 1.0  # seconds between edits of a streamed draft (Discord allows ~5 per 5 s)
HAND_OVER_AT_STOP_S = 10.0  # stop() waits this long at most for messages still to hand over
# Discord's JSON error codes: an unknown channel or message; a user who closed their DMs or
# blocked the bot, and a channel the bot lost access to.
_UNKNOWN_CHANNEL, _UNKNOWN_MESSAGE, _CANNOT_DM, _MISSING_ACCESS = 10003, 10008, 50007, 50001
# Attachments the agent cannot open yet, by the major part of their content type.
UNSUPPORTED_MEDIA = {"image": "an image", "audio": "an audio file", "video": "a video"}


class DiscordLoginError(ConnectorStartError):
    """Discord refused the bot (bad token, intents not enabled): retrying cannot help."""


class DiscordConnector(Connector):
    name = "discord"
    max_message_len = 2000
    streams_drafts = True

    def __init__(self, token: str, *, api_base: str | None = None, gateway_url: str | None = None,
                 connect_timeout: float = 30.0, retry_delay: float = 1.0, max_retry_delay: float = 60.0,
                 max_ratelimit_wait: float = 30.0, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        """`api_base` / `gateway_url` replace discord.com's endpoints (tests, proxies).
        `start()` waits at most `connect_timeout` for the first connection. Logging in is retried
        after `retry_delay`, doubling up to `max_retry_delay`. A 429 asking to wait longer than
        `max_ratelimit_wait` makes a send fail (the gateway retries it later) instead of stalling
        the conversation. A file larger than `max_file_bytes` is not downloaded."""
        self._token = token
        self._endpoints = _Endpoints(api_base.rstrip("/") if api_base else None,
                                     yarl.URL(gateway_url) if gateway_url else None)
        if api_base or gateway_url:
            _install_endpoint_overrides()
        self.connect_timeout, self.retry_delay, self.max_retry_delay = (
            connect_timeout, retry_delay, max_retry_delay)
        self.max_ratelimit_wait, self.max_file_bytes = max_ratelimit_wait, max_file_bytes
        self._client: _Client | None = None
        self._handler: Handler | None = None
        # Messages waiting to be handed to the gateway, per channel, each with a task that hands
        # them over in order and ends when they are all taken: a send that waits out one
        # channel's rate limit (up to max_ratelimit_wait) holds up no other channel.
        self._inboxes: dict[str, list[tuple[InboundMessage, discord.Interaction | None]]] = {}
        self._handing: dict[str, asyncio.Task] = {}
        self._context: contextvars.Context | None = None
        self._tasks: list[asyncio.Task] = []
        self._first_outcome: asyncio.Future[Exception | None] | None = None
        self._stopping = False
        self._failures = 0  # failed attempts since the last successful connection
        self._drafts = DraftStream(
            self.name, limit=self.max_message_len, interval=DRAFT_EDIT_INTERVAL,
            send=self._send_draft, edit=self._edit_message,  # discord.py waits out short 429s
            message_gone=lambda exc: isinstance(exc, discord.NotFound) and exc.code == _UNKNOWN_MESSAGE,
            retried=lambda exc: not _refused(exc))
        self._cdn = FileDownloads("Discord's CDN")  # attached files; its session made on first use

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self, handler: Handler) -> None:
        """Connect. Returns once connected (READY); raises DiscordLoginError when Discord refuses
        the bot; when Discord cannot be reached, logs a warning and returns while it keeps trying
        in the background, so a network outage does not keep the daemon from starting."""
        self._handler = handler
        self._first_outcome = asyncio.get_running_loop().create_future()
        context = self._context = contextvars.copy_context()  # every task of ours sees our endpoints
        context.run(_endpoints.set, self._endpoints)
        self._tasks = [asyncio.create_task(self._run(), name="discord client", context=context)]
        try:
            outcome = await asyncio.wait_for(asyncio.shield(self._first_outcome), self.connect_timeout)
        except TimeoutError:
            log.warning("discord: not connected after %.0f s; still trying in the background",
                        self.connect_timeout)
            return
        if isinstance(outcome, DiscordLoginError):
            await self.stop()
            raise outcome

    async def stop(self) -> None:
        self._stopping = True
        if self._client is not None:
            await self._client.close()
        handing = list(self._handing.values())
        if handing:
            # Messages taken but not yet handed over: Discord never delivers them again, and the
            # handler, even while the daemon stops, stores them for its next start. Cancelled,
            # they were lost. Bounded: a handler that hangs must not hang the stop.
            await asyncio.wait(handing, timeout=HAND_OVER_AT_STOP_S)
        for task in [*self._tasks, *handing]:
            task.cancel()
        # Not waited for: discord.py sleeps out a rate limit inside the request, closed client or not.
        await self._drafts.close(wait_s=0)
        await asyncio.gather(*self._tasks, *handing, return_exceptions=True)
        self._tasks = []
        self._inboxes.clear()
        self._handing.clear()
        await self._cdn.close()

    @property
    def connected(self) -> bool:
        """Whether the gateway connection is up (READY or RESUMED, and not closed since)."""
        client = self._client
        return bool(client and client.is_ready() and client.ws is not None and client.ws.open)

    async def _run(self) -> None:
        """Log in and stay connected; a failure before the client is connected is retried here
        with backoff (once connected, discord.py reconnects and resumes by itself)."""
        while not self._stopping:
            client = self._client = _Client(self)
            delay = None
            try:
                await self._login(client)
                await client.connect(reconnect=True)  # returns once closed by stop()
            except (discord.LoginFailure, discord.PrivilegedIntentsRequired,
                    discord.ConnectionClosed) as exc:
                # ConnectionClosed only escapes connect() for codes that mean "fix your config"
                error = DiscordLoginError(_explain(exc))
                log.error("%s", error)
                self._settle(error)
                return
            except Exception as exc:  # unreachable, 5xx, a 429 on login...: try again later
                if self._stopping:
                    return
                delay = min(self.max_retry_delay, self.retry_delay * 2 ** self._failures)
                delay *= random.uniform(0.5, 1.0)  # jitter: many bots must not return in step
                self._failures += 1
                log.warning("discord: cannot connect (%s: %s); retrying in %.1f s",
                            type(exc).__name__, exc, delay)
                self._settle(exc)
            finally:
                await client.close()
            if delay is not None:
                await asyncio.sleep(delay)

    async def _login(self, client: _Client) -> None:
        await client.login(self._token)  # GET /users/@me (401: LoginFailure), application info
        for command in slash_commands(self._on_slash):
            client.tree.add_command(command)
        try:
            await client.tree.sync()  # one bulk overwrite; unchanged commands cost Discord nothing
        except discord.HTTPException as exc:  # the text forms still work: not worth failing for
            log.warning("discord: could not register the slash commands: %s", exc)

    def _settle(self, outcome: Exception | None) -> None:
        """Report how the first attempt went to a waiting start() (later attempts only log)."""
        if self._first_outcome is not None and not self._first_outcome.done():
            self._first_outcome.set_result(outcome)

    def _on_ready(self, client: _Client) -> None:
        log.info("discord: connected as %s (%s)", client.user, client.user.id if client.user else "?")
        self._failures = 0
        self._settle(None)

    # ---- inbound -------------------------------------------------------------------------

    def _on_message(self, client: _Client, message: discord.Message) -> None:
        """Queue a message meant for the bot. No await before the queue: discord.py runs each
        event in its own task, and queueing at once keeps the order Discord sent them in. Its files
        travel as references: the gateway has them fetched only once it admitted the sender."""
        text = _text_for_bot(client, message)
        if text is None:
            return
        files, media = _attachments(message.attachments)
        if message.stickers:
            media.append("a sticker")
        notice = None
        if media:  # images, sound, video: named to the agent beside the rest, or a fixed notice
            text, notice = media_note(" and ".join(media), text, with_files=bool(files))
        if not text and not files and notice is None:
            return
        author = message.author
        is_group = not isinstance(message.channel, discord.DMChannel)
        self._queue(InboundMessage(
            "discord", str(author.id), str(message.channel.id), str(message.id), text,
            display_name=author.display_name, is_group=is_group, attachments=files,
            notice=notice), None)

    async def fetch_attachment(self, ref: str, folder: Folder) -> tuple[str | None, str | None]:
        """Download a file into the sender's workspace (called by the gateway for admitted users
        only) from its signed CDN URL, streamed: (its name in the folder, None) or (None, a note
        for the agent saying why not). The URL works for about a day; an expired one is not
        refreshed (that needs the logged-in client): the agent is told to ask for the file again."""
        file = json.loads(ref)

        async def download(out: Writer) -> None:
            if _link_expired(file["url"]):
                raise DownloadFailed("its link expired (Discord's file links last about a day); ask "
                                     "the user to send the file again.")
            await self._cdn.fetch(file["url"], out)

        return await save_attachment(folder, file["name"], download, size=file["size"],
                                     max_bytes=self.max_file_bytes, channel=self.name,
                                     errors=(DownloadFailed, OSError), why=reason_for)

    async def _on_slash(self, interaction: discord.Interaction, text: str) -> None:
        """Acknowledge at once (Discord allows 3 s) with "thinking..."; the gateway's answer then
        replaces it. If acknowledging fails, the answer goes to the channel as a message."""
        user = interaction.user
        msg = InboundMessage("discord", str(user.id), str(interaction.channel_id), str(interaction.id),
                             text, display_name=user.display_name,
                             is_group=interaction.guild_id is not None)
        try:
            await interaction.response.defer()
        except discord.HTTPException as exc:
            # The command's name only: its options are the user's words, which are never logged.
            log.warning("discord: could not acknowledge /%s (interaction %s): %s",
                        text.lstrip("/").split(" ", 1)[0], interaction.id, exc)
            self._queue(msg, None)
            return
        self._queue(msg, interaction)

    def _queue(self, msg: InboundMessage, interaction: discord.Interaction | None) -> None:
        """Hand `msg` to the gateway after the ones of its channel before it."""
        waiting = self._inboxes.get(msg.chat_id)
        if waiting is not None:  # its channel's task is at work and takes it in turn
            waiting.append((msg, interaction))
            return
        self._inboxes[msg.chat_id] = [(msg, interaction)]
        self._handing[msg.chat_id] = asyncio.create_task(
            self._deliver(msg.chat_id), name=f"discord inbox {msg.chat_id}",
            # A copy each: the slash command being answered (_replying) is one channel's task's.
            context=None if self._context is None else self._context.copy())

    async def _deliver(self, chat_id: str) -> None:
        """Hand a channel's queued messages to the gateway one at a time, in arrival order; end
        when none is left (no await between that look and the end: a message queued after it
        starts a new task)."""
        waiting = self._inboxes[chat_id]
        try:
            while waiting:
                msg, interaction = waiting.pop(0)
                try:
                    await self._hand_over(msg, interaction)
                except Exception:
                    log.exception("discord: could not hand over message %s", msg.message_id)
        finally:
            if self._inboxes.get(chat_id) is waiting:
                del self._inboxes[chat_id]
                self._handing.pop(chat_id, None)

    async def _hand_over(self, msg: InboundMessage, interaction: discord.Interaction | None) -> None:
        reply = _InteractionReply(interaction) if interaction is not None else None
        token = _replying.set(reply)  # send_text within the handler answers the interaction
        try:
            await self._handler(msg)
        except RuntimeError as exc:  # the daemon is shutting down; Discord will not redeliver
            log.warning("discord: message %s not taken: %s", msg.message_id, exc)
        except Exception:
            log.exception("discord: handing over message %s failed", msg.message_id)
        finally:
            _replying.reset(token)
        if reply is not None:  # unanswered (a blocked user, a refusal): remove "thinking...",
            await reply.close()  # and say nothing: the access check may not have run

    # ---- outbound ------------------------------------------------------------------------

    async def send_text(self, chat_id: str, text: str) -> str | None:
        """Send one message (a slash command's answer, or the open draft made final, when there
        is one). Raises DeliveryRefused when Discord refuses it for good, another error when it
        may work later (discord.py has already waited out rate limits)."""
        try:
            return await self._send_text(chat_id, text)
        except discord.HTTPException as exc:
            if not _refused(exc):  # a server error, a rate limit not waited out
                raise
            raise DeliveryRefused(f"discord refused a message to channel {chat_id}: {exc}",
                                  chat_gone=_chat_gone(exc)) from exc

    async def _send_text(self, chat_id: str, text: str) -> str | None:
        with self._using_endpoints():
            reply = _replying.get()
            if reply is not None and reply.chat_id == chat_id:
                self._drafts.drop(chat_id)  # a stopped turn's draft must not become a later reply
                sent = await reply.send(text)
                if sent is not None:
                    return sent
            drafted = await self._drafts.replace(
                chat_id, lambda message_id: self._edit_message(chat_id, message_id, text))
            if drafted is not None:
                return drafted
            message = await self._channel(chat_id).send(text)
            return str(message.id)

    async def typing(self, chat_id: str) -> None:
        with self._using_endpoints():
            await self._channel(chat_id).typing()

    async def draft(self, chat_id: str, text: str) -> None:
        """Show the reply so far (see DraftStream): sent, then edited at most once per
        DRAFT_EDIT_INTERVAL. Never waits for the network."""
        with self._using_endpoints():  # the draft's task inherits them
            self._drafts.update(chat_id, text)

    async def _send_draft(self, chat_id: str, text: str) -> int:
        return (await self._channel(chat_id).send(text)).id

    async def _edit_message(self, chat_id: str, message_id: int, text: str) -> None:
        await self._channel(chat_id).get_partial_message(message_id).edit(content=text)

    def _channel(self, chat_id: str) -> discord.PartialMessageable:
        return self._live_client().get_partial_messageable(int(chat_id))

    def _live_client(self) -> _Client:
        client = self._client
        if client is None or client.is_closed() or client.user is None:  # user: set by logging in
            raise RuntimeError("discord: no connection to Discord now (stopped, or reconnecting)")
        return client

    @contextlib.contextmanager
    def _using_endpoints(self) -> Iterator[None]:
        """Calls from the gateway's tasks reach discord.py outside our client's tasks."""
        token = _endpoints.set(self._endpoints)
        try:
            yield
        finally:
            _endpoints.reset(token)


class _Client(discord.Client):
    """discord.py's client with our intents and handlers, and a command tree for slash commands."""

    def __init__(self, connector: DiscordConnector) -> None:
        intents = discord.Intents.none()
        intents.guilds = True  # guild and channel objects, so guild messages resolve properly
        intents.dm_messages = intents.guild_messages = True
        intents.message_content = True  # privileged: enable it in the developer portal
        add_reaction_intents(intents)  # 👍 / 👎 on a reply grade it
        super().__init__(intents=intents, guild_ready_timeout=0, max_messages=None,
                         max_ratelimit_timeout=connector.max_ratelimit_wait,
                         allowed_mentions=discord.AllowedMentions.none())  # model text pings nobody
        self.connector = connector
        self.tree = app_commands.CommandTree(self)

    async def on_ready(self) -> None:
        self.connector._on_ready(self)

    async def on_message(self, message: discord.Message) -> None:
        self.connector._on_message(self, message)

    async def on_raw_reaction_add(self, event: discord.RawReactionActionEvent) -> None:
        await deliver_reaction(self, event, self.connector.on_reaction)

    on_raw_reaction_remove = on_raw_reaction_add


def _text_for_bot(client: discord.Client, message: discord.Message) -> str | None:
    """The text addressed to the bot ("" when there is none, as with only a file), or None: bots
    (itself included) and system messages are ignored, and in guild channels only messages that
    mention the bot count (mention removed)."""
    me = client.user
    if me is None or message.author.bot or message.author.id == me.id or message.webhook_id:
        return None
    if message.type not in (discord.MessageType.default, discord.MessageType.reply):
        return None
    text = message.content
    if not isinstance(message.channel, discord.DMChannel):
        if not any(user.id == me.id for user in message.mentions):
            return None
        text = re.sub(rf"\s*<@!?{me.id}>\s*", " ", text)
    return text.strip()


def _attachments(attachments: list[discord.Attachment]) -> tuple[list[str], list[str]]:
    """The files the agent can be given, as references for fetch_attachment (the name already
    made safe), and the kinds of media among them it cannot open yet ("an image"), each once."""
    files: list[str] = []
    media: list[str] = []
    for attachment in attachments:
        kind = _media_kind(attachment)
        if kind is None:
            name = safe_file_name(attachment.filename, f"attachment-{attachment.id}")
            files.append(json.dumps({"url": attachment.url, "size": attachment.size, "name": name}))
        elif kind not in media:
            media.append(kind)
    return files, media


def _link_expired(url: str) -> bool:
    """Whether a signed CDN URL is past its expiry (`ex`: hex Unix time; none: it does not expire)."""
    expires = yarl.URL(url).query.get("ex", "")
    try:
        return int(expires, 16) <= time.time()
    except ValueError:
        return False


def _media_kind(attachment: discord.Attachment) -> str | None:
    if attachment.is_voice_message():
        return "a voice note"
    major = (attachment.content_type or "").partition("/")[0].lower()
    return UNSUPPORTED_MEDIA.get(major)


# ---- slash command replies ----------------------------------------------------------------------


_replying: contextvars.ContextVar[_InteractionReply | None] = contextvars.ContextVar(
    "discord_interaction_reply", default=None)


class _InteractionReply:
    """Where the answer to one slash command goes: first its deferred response, then follow-ups.
    Set (in a context variable) only while the gateway handles that command, so a reply to some
    other message in the same chat never lands in it."""

    def __init__(self, interaction: discord.Interaction) -> None:
        self.interaction = interaction
        self.chat_id = str(interaction.channel_id)
        self.answered = False

    async def send(self, text: str) -> str | None:
        """The sent message's id, or None if the interaction cannot carry it (expired)."""
        try:
            if not self.answered:
                message = await self.interaction.edit_original_response(content=text)
            else:
                message = await self.interaction.followup.send(text, wait=True)
        except discord.HTTPException as exc:
            log.warning("discord: answering the slash command failed (%s); sending it plainly", exc)
            return None
        self.answered = True
        return str(message.id)

    async def close(self) -> None:
        """If nothing answered the command, remove its "thinking..." response."""
        if self.answered:
            return
        try:
            await self.interaction.delete_original_response()
        except discord.HTTPException as exc:
            log.debug("discord: tidying the slash command's response failed: %s", exc)


# ---- endpoints: discord.com's, or the ones in the config ---------------------------------------


@dataclass(frozen=True)
class _Endpoints:
    api_base: str | None
    gateway: yarl.URL | None


_endpoints: contextvars.ContextVar[_Endpoints | None] = contextvars.ContextVar(
    "discord_endpoints", default=None)


class _PerContext:
    """A discord.py class attribute (Route.BASE, DiscordWebSocket.DEFAULT_GATEWAY) whose value is
    the current context's endpoint, else the library's own. discord.py reads these globals when it
    builds each request, so a plain assignment would send every connector in the process to the
    last one's server; a context variable keeps each connector's calls on its own endpoints."""

    def __init__(self, field_name: str, default: object) -> None:
        self.field_name, self.default = field_name, default

    def __get__(self, obj: object, owner: type) -> object:
        endpoints = _endpoints.get()
        value = getattr(endpoints, self.field_name) if endpoints is not None else None
        return self.default if value is None else value


def _install_endpoint_overrides() -> None:
    """Done once, and only when a connector has endpoints of its own."""
    route, websocket = discord.http.Route, discord.gateway.DiscordWebSocket
    if not isinstance(route.__dict__.get("BASE"), _PerContext):
        route.BASE = _PerContext("api_base", route.BASE)
    if not isinstance(websocket.__dict__.get("DEFAULT_GATEWAY"), _PerContext):
        websocket.DEFAULT_GATEWAY = _PerContext("gateway", websocket.DEFAULT_GATEWAY)


def _refused(exc: Exception) -> bool:
    """Discord refused the message for good (DeliveryRefused: the outbox does not retry it)."""
    return isinstance(exc, discord.HTTPException) and exc.status in (400, 403, 404)


def _chat_gone(exc: discord.HTTPException) -> bool:
    """Whether Discord refuses everything in this channel for good (the user closed their DMs or
    blocked the bot, the bot lost access, the channel was deleted), not just this message or for
    a while (a moderator's time-out is 50013 Missing Permissions; 40004, sending disabled)."""
    return exc.code in (_CANNOT_DM, _MISSING_ACCESS, _UNKNOWN_CHANNEL)


def _explain(exc: Exception) -> str:
    if isinstance(exc, discord.LoginFailure):
        return ("discord: the bot token was rejected (401 on GET /users/@me); set discord.token to "
                "the token under Bot > Token in the Discord developer portal")
    if isinstance(exc, discord.PrivilegedIntentsRequired):
        return ("discord: the bot needs the Message Content intent; enable it under Bot > "
                "Privileged Gateway Intents in the Discord developer portal")
    code = getattr(exc, "code", None)
    return f"discord: the gateway closed the connection with code {code} ({exc}); check the token and intents"
