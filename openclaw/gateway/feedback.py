"""Feedback as it comes in (issue 29): /good and /bad, 👍 / 👎 reactions on our replies, and each
new message checked for a retry or a "that's wrong". Each lands on the turn whose reply it
grades (openclaw/store/feedback.py); what counts as which grade is openclaw/feedback.py's.

    /good, /bad   grade the last reply delivered to you in this chat

None of these runs a turn or reaches the model; a reaction from someone who may not talk to the
bot does nothing (no pairing code either: a reaction is no request to talk).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import datetime

from openclaw.feedback import RETRY_WINDOW, reaction_kind, repeats, says_wrong
from openclaw.gateway.access import Access
from openclaw.gateway.contract import InboundMessage, InboundReaction
from openclaw.store import InboundEvent, Store
from openclaw.store.feedback_records import FeedbackKind, FeedbackSource

log = logging.getLogger(__name__)

FEEDBACK_COMMANDS = ("/good", "/bad")
NO_REPLY_YET = "There is no reply of mine to you in this chat to grade yet."
REMEMBERED_CHATS = 4096  # (user, chat) pairs whose last message is kept for the retry check


async def answer_feedback(store: Store, command: str, msg: InboundMessage) -> str:
    """The reply to /good or /bad: the last reply delivered to this user in this chat graded."""
    turn = await store.last_answered_turn(msg.channel, msg.chat_id, msg.user)
    if turn is None:
        return NO_REPLY_YET
    kind = FeedbackKind.GOOD if command == "/good" else FeedbackKind.BAD
    await store.grade(msg.user, turn, kind, FeedbackSource.COMMAND)
    return f"Thanks: noted as {kind}."


class Grading:
    """Reactions (the connectors' `on_reaction`) and the check of each new message (`noticed`)."""

    def __init__(self, store: Store, access: Access) -> None:
        self.store, self.access = store, access
        # (user, chat) -> (inbound event id, text, when, a command?) of their latest message:
        # the retry check reads the store only for a pair's first message since the start.
        self._last: OrderedDict[tuple[str, str], tuple[int, str, datetime, bool]] = OrderedDict()

    async def reaction(self, reaction: InboundReaction) -> None:
        """A reaction added or taken back: 👍 / 👎 on one of our replies grades its turn (a later
        one replaces it), taking it back deletes that grade. Anything else does nothing."""
        kind = reaction_kind(reaction.emoji)
        if kind is None or not await self.access.still_allowed(reaction.user):
            return
        turn = await self.store.turn_of_sent(reaction.channel, reaction.chat_id,
                                             reaction.message_id)
        if turn is None:  # not a reply of ours (a command's answer, the user's own message)
            return
        if reaction.added:
            await self.store.grade(reaction.user, turn, kind, FeedbackSource.REACTION)
        else:
            await self.store.ungrade(reaction.user, turn, FeedbackSource.REACTION, kind=kind)

    async def noticed(self, msg: InboundMessage, event: InboundEvent, command: str) -> None:
        """`notice`, and its check at once: for a message answered without a turn."""
        check = self.notice(msg, event, command)
        if check is not None:
            await check()

    def notice(self, msg: InboundMessage, event: InboundEvent,
               command: str) -> Callable[[], Awaitable[None]] | None:
        """A new message (`msg`, stored as `event`; `command` if it is one), taken as the user's
        latest in the chat now, in the order messages come (no await: a message handed in while
        another's note waited could not overtake it); and the check of what it says, for the
        caller to run (after the message's turn replied: the reply never waits for it). A
        message that says the last reply was wrong grades it bad; one that repeats the message
        before it, within RETRY_WINDOW, grades that one's turn "retry". None: nothing to check.
        The check never raises: a grade lost is better than a message refused."""
        key = (msg.user, msg.chat_id)
        previous = self._last.pop(key, None)  # None: not known since the start; read if needed
        self._last[key] = (event.id, msg.text, event.received_at, bool(command))
        while len(self._last) > REMEMBERED_CHATS:
            self._last.popitem(last=False)
        if command:
            return None
        return functools.partial(self._check, msg, event, previous)

    async def _check(self, msg: InboundMessage, event: InboundEvent,
                     previous: tuple[int, str, datetime, bool] | None) -> None:
        try:
            if says_wrong(msg.text):
                turn = await self.store.last_answered_turn(msg.channel, msg.chat_id, msg.user,
                                                           before=event.id)
                if turn is not None:
                    await self.store.grade(msg.user, turn, FeedbackKind.BAD, FeedbackSource.TEXT)
                return
            if previous is None:  # the message before this one, whenever the check runs
                stored = await self.store.previous_inbound(msg.user, msg.chat_id, event.id)
                previous = None if stored is None else (
                    stored.id, stored.text, stored.received_at,
                    stored.text.lstrip().startswith("/"))
            if previous is not None and await self._retried(msg, event, previous):
                await self.store.grade(msg.user, previous[0], FeedbackKind.RETRY,
                                       FeedbackSource.TEXT)
        except Exception:
            log.exception("feedback: could not check message %s:%s for a retry", msg.channel,
                          msg.message_id)

    async def _retried(self, msg: InboundMessage, event: InboundEvent,
                       previous: tuple[int, str, datetime, bool]) -> bool:
        turn, text, at, was_command = previous
        if was_command or event.received_at - at > RETRY_WINDOW or not repeats(text, msg.text):
            return False
        # Its answer came, and is the latest: sent again before it, the message was only
        # impatience, which says nothing of the answer.
        return await self.store.last_answered_turn(msg.channel, msg.chat_id, msg.user,
                                                   before=event.id) == turn
