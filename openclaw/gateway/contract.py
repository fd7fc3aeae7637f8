"""What connectors and the daemon share, and nothing else: the message a connector hands in, the
base class every connector implements, and the errors a connector raises to say what happened to
a send. Connectors import this module and no other of `openclaw`, so dependencies point one way."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

# The last line of a request to approve a tool call: a connector that can show buttons finds the
# request's number here and offers "/approve N" and "/deny N" as taps.
APPROVAL_ASKED = re.compile(r"Reply /approve (\d+) to allow it or /deny \1 to refuse\.\Z")


def approval_asked(number: int) -> str:
    """The line that ends a request to approve a tool call (see APPROVAL_ASKED)."""
    return f"Reply /approve {number} to allow it or /deny {number} to refuse."


# A block of text that must show exactly as it is (a command to approve): a ``` fence with this
# info string. Each backtick in it is followed by ZERO WIDTH SPACE, so no run of three can end the
# block early (Discord's code blocks end at the first ```, whatever its length) and the text keeps
# its length there; a connector with its own markup (Telegram's <pre>) takes them out again.
LITERAL_INFO = "literal"
LITERAL_BLOCK = re.compile(rf"^```{LITERAL_INFO}\n(.*?)\n```$", re.MULTILINE | re.DOTALL)
_UNCLOSABLE = "`\u200b"


def literal_block(text: str) -> str:
    """`text` as a block the connectors show literally (see LITERAL_INFO); `text` holds no raw
    zero-width space when it went through skills' visible()."""
    return f"```{LITERAL_INFO}\n" + text.replace("`", _UNCLOSABLE) + "\n```"


def literal_text(block: str) -> str:
    """The text a literal block's content (LITERAL_BLOCK's group 1) stands for."""
    return block.replace(_UNCLOSABLE, "`")


def without_literal_blocks(text: str) -> str:
    """`text` with each literal block replaced by the text it holds: for a channel without markup
    (a terminal), where the fence would only be noise."""
    return LITERAL_BLOCK.sub(lambda m: literal_text(m[1]), text)


@dataclass(frozen=True)
class InboundMessage:
    channel: str  # "terminal" | "telegram" | "discord"
    user_id: str  # the app's user id, as text
    chat_id: str  # where to answer (a DM or a group)
    message_id: str  # unique per channel: the dedupe key
    text: str
    display_name: str | None = None
    is_group: bool = False
    # Files the user sent, as the connector names them: fetched (Connector.fetch_attachment) into
    # the user's workspace only once the gateway admitted the user and the turn runs.
    attachments: list[str] = field(default_factory=list)
    # A fixed answer instead of the model's, for what the agent cannot take yet (a voice note):
    # sent after access control and storage, like any reply.
    notice: str | None = None

    @property
    def user(self) -> str:
        """The user's name in config and store: "channel:id"."""
        return f"{self.channel}:{self.user_id}"


@dataclass(frozen=True)
class InboundReaction:
    """A user's emoji reaction added to (or taken back from) a message in a chat: the gateway
    takes 👍 / 👎 on one of its replies as a grade of it (gateway/feedback.py), and no more."""

    channel: str
    user_id: str
    chat_id: str  # the chat as the service names it (a Telegram forum's, not its topic's)
    message_id: str  # the service's id of the message reacted to, as send_text returned it
    emoji: str  # the emoji itself ("👍"), or its name for a custom one
    added: bool  # False: taken back

    @property
    def user(self) -> str:
        return f"{self.channel}:{self.user_id}"


# Called by a connector for each message; returns once the message is stored, which is when the
# connector may acknowledge it to its service.
Handler = Callable[[InboundMessage], Awaitable[None]]
# Called by a connector for each reaction; returns once it is recorded (or ignored).
ReactionHandler = Callable[[InboundReaction], Awaitable[None]]
# (channel, chat id, the chat's new id): a chat lives on under another id. Returns once what the
# chat had (conversations, reminders, pending replies) moved; raises if it could not.
ChatMoved = Callable[[str, str, str], Awaitable[None]]


class ConnectorStartError(Exception):
    """A connector cannot start for a reason the admin must fix (a rejected token): the daemon
    stops with this message instead of a traceback."""


class DeliveryRefused(Exception):
    """The service refused a message for good (the user blocked the bot, the chat is gone, the text
    is invalid): the gateway marks it failed instead of retrying. Any other exception from
    send_text means "try again later". `chat_gone`: the chat takes nothing more from the bot for
    good, so what was meant to reach it later (a repeating reminder) is given up too. `moved_to`:
    the chat lives on under this id (a Telegram group upgraded to a supergroup)."""

    def __init__(self, message: str, *, chat_gone: bool = False, moved_to: str | None = None) -> None:
        super().__init__(message)
        self.chat_gone, self.moved_to = chat_gone, moved_to


class RetryLater(Exception):
    """The service asked to wait `seconds` before the next message (a rate limit). Raised at once
    instead of sleeping, so the wait is the gateway's: other chats and the next updates go on."""

    def __init__(self, message: str, seconds: float) -> None:
        super().__init__(message)
        self.seconds = seconds


@dataclass(frozen=True)
class Folder:
    """Where a connector saves the files a user sends: their workspace, opened by the gateway.
    `fd` (an O_PATH descriptor will do; the gateway closes it) is the very folder the gateway
    checked, so files are created relative to it, never through a path a command may have
    redirected since. `owner`: the uid (and gid) each file is given through its own descriptor;
    None leaves it as created."""

    fd: int
    owner: int | None = None


class Connector(ABC):
    """A messaging app, as the gateway sees it. The four abstract methods are what every channel
    has; the rest are capabilities some have, with defaults that say "not here"."""

    name: str  # the channel: "terminal", "telegram", "discord"
    max_message_len: int  # the gateway chunks replies to this
    # Whether draft() shows a reply while it is generated (the gateway streams only then).
    streams_drafts: bool = False
    # Whether the service is reachable now, where the connector can tell (one it keeps
    # reconnecting to overrides this): /healthz reports it, and due reminders wait for it.
    connected: bool = True
    # Set by the gateway; a connector whose chats can change id (a Telegram group upgraded to a
    # supergroup) awaits it when the service says so, before confirming that update.
    on_chat_moved: ChatMoved | None = None
    # Set by the gateway; a connector that sees reactions to messages (Telegram, Discord) awaits
    # it for each one added or taken back.
    on_reaction: ReactionHandler | None = None

    @abstractmethod
    async def start(self, handler: Handler) -> None:
        """Begin receiving; call `handler` for each message."""

    @abstractmethod
    async def stop(self) -> None: ...

    @abstractmethod
    async def send_text(self, chat_id: str, text: str) -> str | None:
        """Send one message (already within max_message_len); return its id if the app has one.
        Raise DeliveryRefused or RetryLater as they say, anything else to have it retried later.
        If a draft is open in this chat, the first send of the reply replaces the draft's text."""

    @abstractmethod
    async def typing(self, chat_id: str) -> None:
        """Show that a reply is coming (the apps show it for about 5 s)."""

    async def draft(self, chat_id: str, text: str) -> None:
        """Show the reply so far (the whole text each call); called only when `streams_drafts`
        is true and the channel's `stream_edits` is on. The connector rate-limits its edits."""
        return None

    async def fetch_attachment(self, ref: str, folder: Folder) -> tuple[str | None, str | None]:
        """Save one of InboundMessage.attachments into `folder`: (its file name there, None), or
        (None, a note for the agent saying why not)."""
        return None, f"[The user sent a file ({ref}) that the {self.name} channel cannot fetch.]"
