"""👍 / 👎 on the bot's replies in Telegram, through the real python-telegram-bot client against the
fake Bot API's message_reaction updates: a reaction grades the turn whose reply it is on (any piece
of a long one), a later one replaces it, taking it back deletes it, and none of it runs a turn. A
stranger's reaction lands nothing and gets no pairing code."""

from __future__ import annotations

from openclaw.daemon import Daemon
from openclaw.gateway.contract import InboundReaction
from tests.helpers import telegram_env
from tests.helpers.grades import grades
from tests.helpers.scripted_model import ScriptedModel, last_user
from tests.helpers.waiting import until

fake, env = telegram_env.fake, telegram_env.env
ADA, BOB = telegram_env.ADA, 1002  # the admin; a stranger
GROUP = -100500
LONG = "\n\n".join(f"Paragraph {i}: " + " ".join(f"w{i}.{j}" for j in range(60)) for i in range(12))


def reply_to(messages: list[dict]) -> str:
    asked = last_user(messages)
    return LONG if "long" in asked else f"re: {asked}"


def counting(daemon: Daemon) -> list[InboundReaction]:
    """The reactions the gateway finished with, in order (to wait on)."""
    [connector] = daemon.connectors
    handled, gateway_handler = [], connector.on_reaction

    async def handler(reaction: InboundReaction) -> None:
        await gateway_handler(reaction)
        handled.append(reaction)

    connector.on_reaction = handler
    return handled


async def test_a_thumb_grades_the_turn_it_is_on_replaced_then_taken_back(env, fake):
    model = ScriptedModel(reply_to, chunk=1000)
    daemon = await env.start(model)
    handled = counting(daemon)
    fake.send("first question")
    await env.replies(ADA, 1)
    fake.send("a long answer please")
    pieces = await env.replies(ADA, 3)
    await daemon.gateway.wait_answered("telegram", str(ADA))  # their ids stored
    assert len(pieces) == 3  # one reply to the first, two pieces of the long one
    first, long_1, long_2 = (m.message_id for m in fake.bot_messages[ADA])

    fake.react(ADA, long_2, "👍")  # on the long reply's second piece
    fake.react(ADA, first, "👍🏽")  # any skin tone
    await until(lambda: len(handled) == 2)
    assert await grades(daemon.store) == [(f"telegram:{ADA}", "a long answer please", "good", "reaction"),
                                    (f"telegram:{ADA}", "first question", "good", "reaction")]

    fake.react(ADA, first, "👎")  # replaces the 👍: one reaction update, 👍 out and 👎 in
    fake.react(ADA, long_2, ["❤", "👍"])  # another emoji beside it changes nothing
    await until(lambda: len(handled) == 5)
    assert [(t, k) for _, t, k, _ in await grades(daemon.store)] == [
        ("a long answer please", "good"), ("first question", "bad")]

    fake.react(ADA, long_2, None)  # both taken back
    fake.react(ADA, long_1, "🔥")  # grades nothing
    await until(lambda: len(handled) == 8)
    assert [(t, k) for _, t, k, _ in await grades(daemon.store)] == [("first question", "bad")]
    assert [last_user(p) for p in model.prompts] == ["first question", "a long answer please"]
    assert len(fake.texts(ADA)) == 3  # no answer to any reaction


async def test_a_strangers_reaction_lands_nothing_and_gets_no_code(env, fake):
    daemon = await env.start(ScriptedModel(reply_to))
    handled = counting(daemon)
    fake.send(f"@{fake.username} hello all", chat=GROUP)
    await env.replies(GROUP, 1)
    await daemon.gateway.wait_answered("telegram", str(GROUP))
    [reply] = fake.bot_messages[GROUP]
    fake.react(GROUP, reply.message_id, "👎", user=BOB, first_name="Bob")
    fake.react(GROUP, reply.message_id, "👍")  # Ada's, after it
    await until(lambda: len(handled) == 2)
    assert await grades(daemon.store) == [(f"telegram:{ADA}", "hello all", "good", "reaction")]
    assert fake.texts(BOB) == [] and len(fake.texts(GROUP)) == 1  # no pairing code, no answer
    assert await daemon.store.get_user("telegram", str(BOB)) is None


async def test_the_bot_asks_for_reactions(env, fake):
    await env.start(ScriptedModel(reply_to))
    assert "message_reaction" in fake.allowed_updates  # Telegram sends none otherwise
