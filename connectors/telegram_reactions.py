"""Telegram's `message_reaction` updates as the gateway's reactions: what a user's reactions to a
message became, as the emoji added and those taken back. Telegram sends these only to a bot that
asks for them in getUpdates' allowed_updates (ALLOWED_UPDATES), and in groups only to an
administrator bot."""

from __future__ import annotations

import logging

from telegram import MessageReactionUpdated, ReactionTypeEmoji

from openclaw.gateway.contract import InboundReaction, ReactionHandler

log = logging.getLogger(__name__)

# What the connector polls for; "message_reaction" is never sent unless named here.
ALLOWED_UPDATES = ["message", "callback_query", "message_reaction"]


def reactions_of(update: MessageReactionUpdated) -> list[InboundReaction]:
    """The emoji taken back, then those added. None for an anonymous one (a group's admin
    reacting as the group: no user of ours), a bot's, or custom and paid reactions (no emoji)."""
    user = update.user
    if user is None or user.is_bot:
        return []
    old, new = _emoji(update.old_reaction), _emoji(update.new_reaction)
    chat, message = str(update.chat.id), str(update.message_id)
    return ([InboundReaction("telegram", str(user.id), chat, message, e, added=False)
             for e in old if e not in new] +
            [InboundReaction("telegram", str(user.id), chat, message, e, added=True)
             for e in new if e not in old])


async def deliver_reactions(update: MessageReactionUpdated, handler: ReactionHandler | None) -> bool:
    """Hand each reaction to the gateway. False: one was not recorded (the store failed), so the
    update stays unconfirmed and Telegram delivers it again."""
    if handler is None:
        return True
    try:
        for reaction in reactions_of(update):
            await handler(reaction)
    except Exception as exc:
        log.warning("telegram: a reaction to message %s was not recorded (%s); it stays "
                    "unconfirmed", update.message_id, exc)
        return False
    return True


def _emoji(reactions: tuple | list) -> list[str]:
    return [r.emoji for r in reactions if isinstance(r, ReactionTypeEmoji)]
