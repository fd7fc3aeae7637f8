"""Telegram, through python-telegram-bot's Bot: our own long-polling loop, replies, drafts, files.

The connector polls itself (not PTB's Updater, which confirms an update before handling it) and
confirms an update only once the gateway stored its message; a redelivery after a crash is
recognised by its stable message id ("chat:message").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import re
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

from telegram import (
    Bot,
    BotCommand,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    Message,
    MessageEntity,
    Update,
)
from telegram.constants import ChatAction, ChatType, ParseMode
from telegram.error import BadRequest, ChatMigrated, Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.warnings import PTBDeprecationWarning

from connectors.attachments import MAX_FILE_BYTES, Writer, media_note, safe_file_name, save_attachment
from connectors.downloads import DOWNLOAD_CHUNK, DownloadFailed, FileDownloads, reason_for
from connectors.drafts import DraftStream
from connectors.telegram_html import markdown_to_html
from connectors.telegram_reactions import ALLOWED_UPDATES, deliver_reactions
from openclaw.gateway.contract import (
    APPROVAL_ASKED,
    Connector,
    ConnectorStartError,
    DeliveryRefused,
    Folder,
    Handler,
    InboundMessage,
    RetryLater,
    without_literal_blocks,
)

log = logging.getLogger(__name__)

COMMANDS = [
    BotCommand("new", "Archive this conversation and start a fresh one"),
    BotCommand("stop", "Stop the answer being generated"),
    BotCommand("status", "Model, queue and tokens used today"),
    BotCommand("help", "What I can do and the commands"),
    BotCommand("approve", "Allow a tool call: /approve N"),
    BotCommand("deny", "Refuse a tool call: /deny N"),
    BotCommand("remind", "Remind you: /remind in 20 minutes stretch"),
    BotCommand("reminders", "Your reminders here; /reminders cancel N"),
    BotCommand("jobs", "Your scheduled jobs; /jobs cancel N"),
    BotCommand("heartbeat", "A look at your checklist now and then: on, off, every 30m"),
    BotCommand("remember", "Keep something in my memory of you: /remember TEXT"),
    BotCommand("memory", "What I keep of you; /memory forget N, off, on"),
    BotCommand("audit", "Your last tool calls and how they ended"),
    BotCommand("good", "Grade my last reply to you as good"),
    BotCommand("bad", "Grade my last reply to you as bad"),
    BotCommand("private", "Keep no trace of your turns for improving me: on, off"),
    BotCommand("sh", "Run a shell command yourself: /sh ls -la"),
    BotCommand("run", "Call a skill yourself: /run SKILL key=value"),
]
# Media we cannot read yet, as the agent is told about them (checked in this order).
UNSUPPORTED = [("voice", "a voice note"), ("video_note", "a video message"), ("audio", "an audio file"),
               ("video", "a video"), ("animation", "a GIF"), ("photo", "a photo"),
               ("sticker", "a sticker"), ("location", "a location"), ("contact", "a contact"),
               ("poll", "a poll")]
TELEGRAM_API = "https://api.telegram.org/"
STOP_HANDLER_S = 5.0  # stop waits this long at most for an update's handler that began


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays: doubling from `initial` up to `maximum`, each scaled by a random factor in
    [0.5, 1] so many clients cut off together do not all come back in the same instant."""

    initial: float = 1.0
    maximum: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.maximum, self.initial * 2 ** max(failures - 1, 0)) * random.uniform(0.5, 1.0)


class TelegramConnector(Connector):
    name = "telegram"
    max_message_len = 4096
    streams_drafts = True

    def __init__(self, token: str, *, base_url: str | None = None, base_file_url: str | None = None,
                 poll_timeout: float = 30.0, backoff: Backoff = Backoff(),
                 max_file_bytes: int = MAX_FILE_BYTES, draft_interval: float = 1.0,
                 file_read_timeout: float = 60.0) -> None:
        keep_token_out_of_logs()  # before Bot(), which logs its URLs
        urls = {k: v for k, v in (("base_url", base_url), ("base_file_url", base_file_url)) if v}
        self._bot = Bot(token, **urls)
        # Documents stream from the file server through a session of our own (PTB's request layer
        # reads a whole body into memory). Like PTB's httpx client, it honours HTTPS_PROXY.
        self._files = FileDownloads("Telegram's file server", refused=_refused, trust_env=True,
                                    read_timeout=file_read_timeout)
        self._poll_timeout, self._backoff = poll_timeout, backoff
        self._max_file_bytes = max_file_bytes
        self._handler: Handler | None = None
        self._task: asyncio.Task | None = None
        self._offset: int | None = None  # the next update id wanted; all below are handled
        # Set while no update is being handled: stop lets a handler that began end first.
        self._between_updates = asyncio.Event()
        self._between_updates.set()
        self._stopping = False
        self._read: dict[int, InboundMessage | None] = {}  # update id -> translation, for retries
        # Drafts go as plain text; the reply's first send edits the draft into the formatted reply.
        self._drafts = DraftStream(
            self.name, limit=self.max_message_len, interval=draft_interval, why=_why,
            send=self._send_draft, edit=self._edit_draft,
            retry_after=lambda exc: _retry_seconds(exc) if isinstance(exc, RetryAfter) else None,
            message_gone=lambda exc: isinstance(exc, BadRequest),  # deleted meanwhile, say
            retried=lambda exc: not isinstance(exc, (Forbidden, ChatMigrated)))  # DeliveryRefused
        self.connected = False  # the Bot API answered the last call (for /healthz, reminders)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self, handler: Handler) -> None:
        """Check the token (a rejected one stops the daemon's start), then poll in the background.
        An unreachable service is not fatal: the loop keeps trying with backoff."""
        self._handler = handler
        try:
            await self._bot.initialize()
        except InvalidToken:
            await self._bot.shutdown()
            # `from None`: PTB's message repeats the token, which must never reach a log
            raise ConnectorStartError("telegram: the Bot API rejected the bot token; check telegram.token "
                               "(from @BotFather)") from None
        except TelegramError as exc:
            log.warning("telegram: cannot reach the Bot API yet (%s); will keep trying", _why(exc))
        self._task = asyncio.create_task(self._run(), name="telegram polling")

    async def stop(self) -> None:
        """End polling at once (the long poll is cancelled), confirm what was handled, and close
        the HTTP clients (the Bot's, and the file downloads' session)."""
        if self._task is not None:
            # An update whose handler began ends first (its message is then stored, or refused):
            # cut short, it would be neither confirmed below nor answered until delivered again.
            self._stopping = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._between_updates.wait(), STOP_HANDLER_S)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._drafts.close()
        if self._offset is not None:  # saves the next start a redelivery (harmless, but noise)
            try:
                await asyncio.wait_for(self._bot.get_updates(offset=self._offset, timeout=0), 2)
            except (TelegramError, TimeoutError) as exc:
                log.debug("telegram: could not confirm the last updates at stop: %s", _why(exc))
        await self._files.close()
        await self._bot.shutdown()

    async def _run(self) -> None:
        try:
            await self._poll()
        except InvalidToken:  # revoked while running, or rejected once the service came back
            self.connected = False
            log.error("telegram: the Bot API rejected the bot token; polling stopped. Fix "
                      "telegram.token (from @BotFather) and restart the daemon")

    async def _poll(self) -> None:
        await self._connect()
        failures = 0
        while True:
            try:
                updates = await self._bot.get_updates(offset=self._offset, timeout=self._poll_timeout,
                                                      allowed_updates=ALLOWED_UPDATES)
            except RetryAfter as exc:
                await asyncio.sleep(_retry_seconds(exc))
                continue
            except InvalidToken:
                raise
            except TelegramError as exc:  # unreachable, 5xx, timed out, 409 another poller...
                failures += 1
                self.connected = False
                await self._pause("polling failed", exc, failures)
                continue
            except Exception:  # e.g. an update PTB cannot parse: keep the bot alive, and loud
                failures += 1
                log.exception("telegram: polling failed unexpectedly")
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            self.connected = True
            delivered = True
            for update in updates:
                if self._stopping:
                    break
                self._between_updates.clear()
                try:
                    delivered = await self._deliver(update)
                finally:
                    self._between_updates.set()
                if not delivered:
                    break
                self._offset = update.update_id + 1  # confirmed by the next getUpdates
            if delivered:
                failures = 0
            else:
                failures += 1
                await asyncio.sleep(self._backoff.delay(failures))

    async def _connect(self) -> None:
        """getMe (the bot's id and username, for groups), drop any webhook (it would make getUpdates
        fail with 409) and register the command menu; retried until the service answers."""
        failures = 0
        while True:
            try:
                await self._bot.initialize()
                await self._bot.delete_webhook(drop_pending_updates=False)
                await self._bot.set_my_commands(COMMANDS)
                # Reachable now, not only once the first long poll returns (up to poll_timeout
                # later): a reminder due at start must not wait for that.
                self.connected = True
                return
            except RetryAfter as exc:
                await asyncio.sleep(_retry_seconds(exc))
            except InvalidToken:
                raise
            except TelegramError as exc:
                failures += 1
                await self._pause("connecting failed", exc, failures)

    async def _pause(self, what: str, exc: TelegramError, failures: int) -> None:
        delay = self._backoff.delay(failures)
        log.warning("telegram: %s (%s); retrying in %.1f s", what, _why(exc), delay)
        await asyncio.sleep(delay)

    # ---- inbound ------------------------------------------------------------------------------

    async def _deliver(self, update: Update) -> bool:
        """Hand one update to the gateway. False: not stored (the daemon is stopping, the store
        failed): leave it unconfirmed so Telegram delivers it again."""
        if update.message_reaction is not None:  # 👍 / 👎 on a reply: feedback, not a turn
            return await deliver_reactions(update.message_reaction, self.on_reaction)
        if not await self._follow_migration(update):
            return False
        if update.update_id not in self._read:
            try:
                self._read[update.update_id] = await self._inbound(update)
            except Exception:  # a bug reading one update must not block all the ones after it
                log.exception("telegram: skipping update %d, which could not be read", update.update_id)
                return True
        inbound = self._read[update.update_id]
        if inbound is not None:
            try:
                await self._handler(inbound)
            except Exception as exc:
                log.warning("telegram: message %s was not stored (%s); it stays unconfirmed",
                            inbound.message_id, exc)
                return False
        del self._read[update.update_id]
        return True

    async def _follow_migration(self, update: Update) -> bool:
        """When a group becomes a supergroup (a new chat id), Telegram says so in both: the old
        group's last message has `migrate_to_chat_id`, the supergroup's first has
        `migrate_from_chat_id`. Either has the gateway move the chat (the second moves nothing).
        False: not moved (the store failed), so the update stays unconfirmed."""
        msg = update.message
        if msg is None or self.on_chat_moved is None:
            return True
        if msg.migrate_to_chat_id:
            old, new = msg.chat.id, msg.migrate_to_chat_id
        elif msg.migrate_from_chat_id:
            old, new = msg.migrate_from_chat_id, msg.chat.id
        else:
            return True
        try:
            await self.on_chat_moved(self.name, str(old), str(new))
        except Exception as exc:
            log.warning("telegram: chat %s became %s, but moving what it had failed (%s); the "
                        "update stays unconfirmed", old, new, exc)
            return False
        return True

    async def _inbound(self, update: Update) -> InboundMessage | None:
        """The update as the gateway's message; None for what is not for the agent (edits,
        button presses, membership changes, other bots, group talk not addressed to us)."""
        if update.callback_query is not None:
            return await self._tapped(update.callback_query)
        msg = update.message  # None for edits and channel posts: neither is a new turn
        if msg is None or msg.from_user is None or msg.from_user.is_bot:
            return None
        # Sent on behalf of a chat (a channel's post copied into its discussion group comes "from"
        # Telegram's own account, 777000): no user of ours wrote it.
        if msg.sender_chat is not None or msg.chat.type == ChatType.CHANNEL:
            return None
        is_group = msg.chat.type in (ChatType.GROUP, ChatType.SUPERGROUP)
        text = msg.text or msg.caption or ""
        if is_group:
            text = self._addressed(msg, text)
            if text is None:
                return None
        text = _origin_note(msg) + text
        attachments: list[str] = []
        notice = None
        if msg.document is not None:  # fetched by the gateway once the user is admitted
            doc = msg.document
            name = safe_file_name(doc.file_name, f"document-{doc.file_unique_id}")
            attachments = [json.dumps({"file_id": doc.file_id, "size": doc.file_size, "name": name})]
        elif (kind := _unsupported_kind(msg)) is not None:  # a caption is still worth answering
            text, notice = media_note(kind, text)
        if not text and not attachments and notice is None:
            return None  # a service message (pinned, joined...): nothing to answer
        return InboundMessage("telegram", str(msg.from_user.id), _chat_key(msg),
                              f"{msg.chat.id}:{msg.message_id}", text,
                              display_name=msg.from_user.full_name, is_group=is_group,
                              attachments=attachments, notice=notice)

    async def _tapped(self, query: CallbackQuery) -> InboundMessage | None:
        """A tap on an Approve or Deny button (see _buttons) as the command it stands for, from
        the user who tapped: the gateway lets only the user the call acts for answer it, as when
        they type it. Anything else is answered (the client's spinner stops) and dropped."""
        with contextlib.suppress(TelegramError):
            await self._bot.answer_callback_query(query.id)
        msg, data = query.message, query.data or ""
        if (not isinstance(msg, Message) or query.from_user is None or query.from_user.is_bot
                or not re.fullmatch(r"/(approve|deny) \d+", data)):
            return None
        return InboundMessage("telegram", str(query.from_user.id), _chat_key(msg), f"tap:{query.id}",
                              data, display_name=query.from_user.full_name,
                              is_group=msg.chat.type in (ChatType.GROUP, ChatType.SUPERGROUP))

    def _addressed(self, msg: Message, text: str) -> str | None:
        """A group message's text without the mention, if it is for us: it mentions the bot, replies
        to one of its messages, or is a command (plain, or /cmd@ourbot); else None."""
        me = self._bot.bot
        entities = msg.parse_entities() if msg.text else msg.parse_caption_entities()
        mention = re.compile(rf"(?<![\w@])@{re.escape(me.username or '')}\b", re.IGNORECASE)
        named = [value for entity, value in entities.items()
                 if entity.type == MessageEntity.TEXT_MENTION and entity.user and entity.user.id == me.id]
        replied = (msg.reply_to_message is not None and msg.reply_to_message.from_user is not None
                   and msg.reply_to_message.from_user.id == me.id)
        if not (replied or named or mention.search(text) or _command_for(entities, me.username)):
            return None
        for value in named:
            text = text.replace(value, "", 1)
        text = re.sub(r"[ \t]{2,}", " ", mention.sub("", text))
        return text.strip().lstrip(",:;").strip()

    async def fetch_attachment(self, ref: str, folder: Folder) -> tuple[str | None, str | None]:
        """Download a document into the sender's workspace: getFile names it, and its body streams
        from the file server (or a --local Bot API server's file is copied) through the size limit,
        so nothing is held in memory. Its URL and local path hold the bot token: no note or log
        line names them."""
        doc = json.loads(ref)

        async def download(out: Writer) -> None:
            remote = await self._bot.get_file(doc["file_id"])
            source = self._file_source(remote.file_path)
            if isinstance(source, Path):
                await _copy_local(source, out)
            else:
                await self._files.fetch(source, out)

        return await save_attachment(folder, doc["name"], download, size=doc.get("size"),
                                     max_bytes=self._max_file_bytes, channel=self.name,
                                     why=lambda exc: _why(exc, self._bot.token),
                                     errors=(DownloadFailed, TelegramError, OSError))

    def _file_source(self, file_path: str | None) -> str | Path:
        """Where getFile's `file_path` is: the URL on the file server (PTB has put base_file_url
        and the token before Telegram's relative path), or a local Bot API server's file here."""
        if not file_path:
            raise DownloadFailed("Telegram gave no path to download it from")
        base = self._bot.base_file_url  # "<base_file_url><token>"
        if file_path.startswith(base + "/"):
            relative = file_path[len(base) + 1:]
        elif Path(file_path).is_absolute():  # a --local server's file; PTB saw it exists here
            if self._bot.base_url.startswith(TELEGRAM_API):  # only a self-hosted server does that
                raise DownloadFailed("Telegram's Bot API named a local file instead of a download; "
                                     "not read")
            return Path(file_path)
        else:  # PTB leaves a relative path alone when a file of that name is in the current folder
            relative = file_path
        if relative.startswith("/"):  # --local mode, but its files are not on this machine
            raise DownloadFailed("the local Bot API server keeps its files on its own machine "
                                 "(--local mode), out of this daemon's reach; run the daemon "
                                 "where it can read them, or the server without --local")
        return f"{base}/{quote(relative)}"  # encoded as PTB's own download does

    # ---- outbound -----------------------------------------------------------------------------

    async def send_text(self, chat_id: str, text: str) -> str | None:
        """Send one message (as Telegram HTML, plain text if Telegram cannot parse it). If a draft
        is open in this chat, it becomes this message instead. Raises DeliveryRefused when Telegram
        refuses it for good (bot blocked, chat gone), another error when it may work later."""
        try:
            return await self._send_or_finish_draft(chat_id, text)
        except (Forbidden, BadRequest, ChatMigrated) as exc:
            moved = str(exc.new_chat_id) if isinstance(exc, ChatMigrated) else None
            raise DeliveryRefused(f"telegram refused a message to chat {chat_id}: {exc}",
                                  chat_gone=_chat_gone(exc), moved_to=moved) from exc

    async def _send_or_finish_draft(self, chat_id: str, text: str) -> str:
        drafted = await self._drafts.replace(
            chat_id, lambda message_id: self._edit(chat_id, message_id, text))
        if drafted is not None:
            return drafted
        topic = _topic(chat_id)
        try:
            message = await self._formatted(
                lambda body, mode: self._bot.send_message(_chat(chat_id), body, parse_mode=mode,
                                                          message_thread_id=topic,
                                                          reply_markup=_buttons(text)), text)
        except BadRequest as exc:
            # The topic was deleted (or Telegram lost it) since the question, say a reminder set
            # there: the chat still takes the reply, in its General topic.
            if topic is None or _THREAD_GONE not in str(exc).lower():
                raise
            log.info("telegram: topic %d of chat %s is gone (%s); replying in the chat's General "
                     "topic", topic, _chat(chat_id), _why(exc))
            message = await self._formatted(
                lambda body, mode: self._bot.send_message(_chat(chat_id), body, parse_mode=mode,
                                                          reply_markup=_buttons(text)), text)
        return str(message.message_id)

    async def _edit(self, chat_id: str, message_id: int, text: str) -> None:
        """Turn a message (the draft) into `text`, formatted as a reply is."""
        try:
            await self._formatted(lambda body, mode: self._bot.edit_message_text(
                body, _chat(chat_id), message_id, parse_mode=mode,
                reply_markup=_buttons(text)), text)
        except BadRequest as exc:
            if "not modified" not in str(exc).lower():  # the same text again: already done
                raise

    async def typing(self, chat_id: str) -> None:
        await self._bot.send_chat_action(_chat(chat_id), ChatAction.TYPING,
                                         message_thread_id=_topic(chat_id))

    async def _formatted(self, call: Callable[[str, str | None], Awaitable[Any]], text: str) -> Any:
        try:
            return await self._rate_limit_raised(lambda: call(markdown_to_html(text), ParseMode.HTML))
        except BadRequest as exc:
            if "can't parse entities" not in str(exc).lower():
                raise
            log.info("telegram: formatting rejected (%s); sending plain text", exc)
            plain = without_literal_blocks(text)  # plain text shows a literal block's text as is
            return await self._rate_limit_raised(lambda: call(plain, None))

    async def _rate_limit_raised(self, op: Callable[[], Awaitable[Any]]) -> Any:
        """`op()`; a 429 becomes RetryLater at once instead of a sleep here, which would hold up
        every other chat's replies and the next updates: the outbox waits in the background."""
        try:
            return await op()
        except RetryAfter as exc:
            wait = _retry_seconds(exc)
            log.info("telegram: rate limited; the reply waits %.0f s", wait)
            raise RetryLater(f"telegram: flood control, retry in {wait:.0f} s", wait) from exc

    # ---- streamed drafts ----------------------------------------------------------------------

    async def draft(self, chat_id: str, text: str) -> None:
        """Show the reply so far (see DraftStream): sent, then edited at most once per
        draft_interval. Never waits for the network."""
        self._drafts.update(chat_id, text)

    async def _send_draft(self, chat_id: str, text: str) -> int:
        message = await self._bot.send_message(_chat(chat_id), text, message_thread_id=_topic(chat_id))
        return message.message_id

    async def _edit_draft(self, chat_id: str, message_id: int, text: str) -> None:
        await self._bot.edit_message_text(text, _chat(chat_id), message_id)


# ---- helpers ------------------------------------------------------------------------------------


def _origin_note(msg: Message) -> str:
    """What the agent is told of words its sender did not write: a forwarded message is the
    forwarder's (they chose to send it), and one sent via an inline bot its sender's, but the text
    is someone else's, so it is said, and it is never read as a command ("/approve N")."""
    if msg.forward_origin is not None:
        return "[Forwarded message]\n"
    if msg.via_bot is not None:
        return f"[Sent via @{msg.via_bot.username or msg.via_bot.id}]\n"
    return ""


def _command_for(entities: dict[MessageEntity, str], username: str | None) -> bool:
    """The message starts with a command that is ours: "/cmd" or "/cmd@ourbot"."""
    for entity, value in entities.items():
        if entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            _, _, target = value.partition("@")
            return not target or target.lower() == (username or "").lower()
    return False


def _unsupported_kind(msg: Message) -> str | None:
    return next((what for attr, what in UNSUPPORTED if getattr(msg, attr, None)), None)


def _buttons(text: str) -> InlineKeyboardMarkup | None:
    """Approve and Deny as taps under a request to approve a tool call (its last line names the
    request's number); none under anything else."""
    asked = APPROVAL_ASKED.search(text)
    if asked is None:
        return None
    number = asked[1]
    return InlineKeyboardMarkup([[InlineKeyboardButton("Approve", callback_data=f"/approve {number}"),
                                  InlineKeyboardButton("Deny", callback_data=f"/deny {number}")]])


def _chat_key(msg: Message) -> str:
    """The chat a message is answered in: "<chat id>", or "<chat id>/<topic id>" for a topic of a
    forum supergroup. Telegram puts a message sent without the topic's id in the General topic,
    and each topic is a conversation of its own, as its people see it."""
    if msg.is_topic_message and msg.message_thread_id:
        return f"{msg.chat.id}/{msg.message_thread_id}"
    return str(msg.chat.id)


def _chat(chat_id: str) -> int | str:
    chat = chat_id.partition("/")[0]
    return int(chat) if chat.lstrip("-").isdigit() else chat


def _topic(chat_id: str) -> int | None:
    """The forum topic a chat key names (see _chat_key); None for a whole chat."""
    topic = chat_id.partition("/")[2]
    return int(topic) if topic.isdigit() else None


def _retry_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():  # PTB 22 warns that retry_after becomes a timedelta; take both
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


# What Telegram says (as a BadRequest) when the chat itself is gone for good. Not "not enough
# rights to send": a group may restrict the bot for a while.
_GONE_CHAT_ERRORS = ("chat not found", "chat was deactivated")
_THREAD_GONE = "message thread not found"  # a forum topic deleted


def _chat_gone(exc: TelegramError) -> bool:
    """Whether Telegram refuses everything in this chat for good (the user blocked the bot, it
    was removed, the chat is gone) rather than one message (an unparsable text, say)."""
    if isinstance(exc, Forbidden):
        return True
    return isinstance(exc, BadRequest) and any(part in str(exc).lower() for part in _GONE_CHAT_ERRORS)


def _why(exc: BaseException, token: str | None = None) -> str:
    # PTB repeats the token in some messages (InvalidToken); a bot token is "<digits>:<secret>".
    text = reason_for(exc)  # a DownloadFailed's message as it is
    if token:
        text = text.replace(token, "***")
    return re.sub(r"\b\d{3,}:[\w-]{20,}", "***", text)


def _refused(status: int, reason: str) -> str:
    """The note's reason for a file server's answer other than 200."""
    if status == 404:
        return ("Telegram no longer has it (404 Not Found: its download link expired, or the file "
                "is gone); ask the user to send the file again.")
    if status >= 500:
        return (f"Telegram's file server failed ({status} {reason}); ask the user to send the file "
                "again later.")
    return f"Telegram's file server answered {status} {reason}"


async def _copy_local(path: Path, out: Writer) -> None:
    """Copy a file a local Bot API server saved into `out` (whose limit holds), a chunk at a time,
    reading off the event loop. Its path holds the bot token: an error names it not."""
    try:
        source = open(path, "rb")  # a local file opens at once; closed below
    except OSError as exc:
        raise DownloadFailed(f"the local Bot API server's file cannot be read ({exc.strerror})") from None
    with source:
        while chunk := await asyncio.to_thread(source.read, 16 * DOWNLOAD_CHUNK):
            out.write(chunk)


def keep_token_out_of_logs() -> None:
    """httpx logs every request URL at INFO, and Bot API URLs contain the token; PTB's debug logs
    do too. The daemon logs at INFO, so both are held at WARNING (the one global tweak here)."""
    for name in ("httpx", "telegram"):
        logging.getLogger(name).setLevel(logging.WARNING)
