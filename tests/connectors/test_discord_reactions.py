"""👍 / 👎 on the bot's replies in Discord, through the real discord.py client against the fake
Discord's MESSAGE_REACTION_ADD / _REMOVE events: a reaction grades the turn whose reply it is on,
a 👎 after a 👍 replaces it, taking the standing one back deletes it, and none of it runs a turn;
a stranger's or a blocked user's reaction lands nothing."""

from __future__ import annotations

import discord

from connectors.discord_reactions import add_reaction_intents
from tests.connectors import test_discord
from tests.connectors.test_telegram_reactions import counting
from tests.fakes.discord_api.gateway import DIRECT_MESSAGE_REACTIONS, GUILD_MESSAGE_REACTIONS
from tests.helpers.grades import grades
from tests.helpers.scripted_model import ScriptedModel, echo, last_user
from tests.helpers.waiting import until

ADA, BOB, EVE = test_discord.ADA, test_discord.BOB, test_discord.EVE
fake, daemon_with, dm = test_discord.fake, test_discord.daemon_with, test_discord.dm


def bot_messages(fake, channel: int) -> list[dict]:
    return [m for m in fake.messages[channel] if m["author"]["id"] == fake.bot["id"]]


async def test_a_thumb_in_a_dm_grades_its_turn_is_replaced_and_taken_back(fake, daemon_with):
    model = ScriptedModel(echo)
    daemon, _ = await daemon_with(model)
    handled = counting(daemon)
    await dm(fake, ADA, "first question")
    await dm(fake, ADA, "second question")
    await daemon.gateway.wait_answered("discord", str(fake.dm_channel_id(ADA)))  # ids stored
    first, second = bot_messages(fake, fake.dm_channel_id(ADA))
    ada = f"discord:{ADA}"

    fake.react(ADA, second, "👍")
    fake.react(ADA, first, "👍🏻")
    await until(lambda: len(handled) == 2)
    assert sorted(await grades(daemon.store)) == [(ada, "first question", "good", "reaction"),
                                            (ada, "second question", "good", "reaction")]
    fake.react(ADA, first, "👎")  # Discord keeps both; the later one is the grade
    await until(lambda: len(handled) == 3)
    fake.react(ADA, first, "👍🏻", remove=True)  # the 👍 taken back leaves the 👎
    await until(lambda: len(handled) == 4)
    assert sorted((t, k) for _, t, k, _ in await grades(daemon.store)) == [
        ("first question", "bad"), ("second question", "good")]
    fake.react(ADA, second, "👍", remove=True)
    fake.react(ADA, second, "🎉")
    await until(lambda: len(handled) == 6)
    assert [(t, k) for _, t, k, _ in await grades(daemon.store)] == [("first question", "bad")]
    assert [last_user(p) for p in model.prompts] == ["first question", "second question"]
    assert len(bot_messages(fake, fake.dm_channel_id(ADA))) == 2  # no answer to any reaction


async def test_strangers_and_blocked_users_reactions_land_nothing(fake, daemon_with):
    daemon, _ = await daemon_with(ScriptedModel(echo))
    handled = counting(daemon)
    fake.send_guild_message(ADA, "hello all", mention=True)
    await until(lambda: bot_messages(fake, fake.guild_channel_id))
    await daemon.gateway.wait_answered("discord", str(fake.guild_channel_id))
    [reply] = bot_messages(fake, fake.guild_channel_id)
    fake.react(BOB, reply, "👎")
    fake.react(EVE, reply, "👎")
    await until(lambda: len(handled) == 2)
    fake.react(ADA, reply, "👍")
    await until(lambda: len(handled) == 3)
    assert await grades(daemon.store) == [(f"discord:{ADA}", "hello all", "good", "reaction")]
    assert fake.texts(fake.dm_channel_id(BOB)) == []  # no pairing code
    assert len(bot_messages(fake, fake.guild_channel_id)) == 1


def test_the_client_asks_for_reactions_in_dms_and_guilds():
    intents = discord.Intents.none()
    add_reaction_intents(intents)
    assert intents.value == DIRECT_MESSAGE_REACTIONS | GUILD_MESSAGE_REACTIONS
