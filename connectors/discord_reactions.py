"""Discord's reaction events (MESSAGE_REACTION_ADD / MESSAGE_REACTION_REMOVE) as the gateway's
reactions. They come only with the reaction intents (`add_reaction_intents`), which are not
privileged: nothing to enable in the developer portal."""

from __future__ import annotations

import logging

import discord

from openclaw.gateway.contract import InboundReaction, ReactionHandler

log = logging.getLogger(__name__)


def add_reaction_intents(intents: discord.Intents) -> None:
    """Reactions in direct messages and in guild channels."""
    intents.dm_reactions = intents.guild_reactions = True


def reaction_of(me: discord.ClientUser | None, event: discord.RawReactionActionEvent
                ) -> InboundReaction | None:
    """The reaction, or None for the bot's own, another bot's, or a server's custom emoji (only
    Unicode emoji can grade a reply)."""
    if me is None or event.user_id == me.id or (event.member is not None and event.member.bot):
        return None
    if not event.emoji.is_unicode_emoji():
        return None
    return InboundReaction("discord", str(event.user_id), str(event.channel_id),
                           str(event.message_id), event.emoji.name,
                           added=event.event_type == "REACTION_ADD")


async def deliver_reaction(client: discord.Client, event: discord.RawReactionActionEvent,
                           handler: ReactionHandler | None) -> None:
    """Hand the reaction to the gateway. Discord sends an event once: one not recorded (the store
    failed) is lost, and logged."""
    reaction = reaction_of(client.user, event)
    if reaction is None or handler is None:
        return
    try:
        await handler(reaction)
    except Exception as exc:
        log.warning("discord: a reaction to message %s was not recorded: %s", event.message_id, exc)
