"""The feedback table: a grade lands on the turn whose reply it names, a later one from the same
source replaces it, taking it back deletes it, and it goes with its turn."""

from __future__ import annotations

import pytest
import sqlalchemy
from sqlalchemy.exc import IntegrityError

from openclaw.feedback import feedback_of
from openclaw.store import Store
from tests.helpers.store import fresh_store

ADA, BOB = "telegram:1001", "telegram:1002"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request, tmp_path):
    async with fresh_store(request, tmp_path) as opened:
        yield opened


async def answered(store: Store, user: str, chat_id: str, message_id: str, pieces: list[str],
                   first_external: int) -> int:
    """A turn of `user`'s answered in `pieces`, sent with the service's ids from `first_external`
    on; its inbound event's id."""
    await store.ensure_user("telegram", user.partition(":")[2])
    event, _ = await store.record_inbound("telegram", message_id, user, chat_id, "question")
    conv = await store.active_conversation(user, chat_id)
    stored = await store.add_reply("telegram", chat_id, pieces, conversation_id=conv.id,
                                   answers=event.id)
    for n, piece in enumerate(stored):
        await store.mark_outbound(piece.id, "sent", external_message_id=first_external + n)
    return event.id


async def test_every_piece_of_a_long_reply_names_its_turn(store):
    first = await answered(store, ADA, "1001", "m1", ["one", "two", "three"], 50)
    second = await answered(store, ADA, "1001", "m2", ["four"], 53)
    assert [await store.turn_of_sent("telegram", "1001", n) for n in (50, 51, 52, 53)] == \
        [first, first, first, second]
    assert await store.turn_of_sent("telegram", "1001", 54) is None  # not ours
    assert await store.turn_of_sent("telegram", "2002", 50) is None  # another chat's 50
    assert await store.turn_of_sent("discord", "1001", 50) is None


async def test_a_forum_topics_reply_is_found_from_the_chat_alone(store):
    turn = await answered(store, ADA, "-100/7", "m1", ["in a topic"], 90)
    assert await store.turn_of_sent("telegram", "-100", 90) == turn
    assert await store.turn_of_sent("telegram", "-1000", 90) is None  # a prefix is not the chat


async def test_a_commands_answer_is_no_turn(store):
    event, _ = await store.record_inbound("telegram", "m1", ADA, "1001", "/help")
    [piece] = await store.add_reply("telegram", "1001", ["Commands: ..."], answers=event.id)
    await store.mark_outbound(piece.id, "sent", external_message_id=70)
    assert await store.turn_of_sent("telegram", "1001", 70) is None
    assert await store.last_answered_turn("telegram", "1001", ADA) is None


async def test_the_last_answered_turn_is_this_users_in_this_chat(store):
    ada_1 = await answered(store, ADA, "-5", "a1", ["to ada"], 10)
    bob_1 = await answered(store, BOB, "-5", "b1", ["to bob"], 11)
    ada_2 = await answered(store, ADA, "1001", "a2", ["in private"], 12)
    assert await store.last_answered_turn("telegram", "-5", ADA) == ada_1
    assert await store.last_answered_turn("telegram", "-5", BOB) == bob_1
    assert await store.last_answered_turn("telegram", "1001", ADA) == ada_2
    # Stored but not delivered yet: not "the last reply delivered".
    event, _ = await store.record_inbound("telegram", "a3", ADA, "1001", "more")
    conv = await store.active_conversation(ADA, "1001")
    await store.add_reply("telegram", "1001", ["pending"], conversation_id=conv.id, answers=event.id)
    assert await store.last_answered_turn("telegram", "1001", ADA) == ada_2


async def test_a_later_grade_from_the_same_source_replaces_the_earlier(store):
    turn = await answered(store, ADA, "1001", "m1", ["hi"], 1)
    await store.grade(ADA, turn, "good", "reaction")
    await store.grade(ADA, turn, "bad", "reaction")
    await store.grade(ADA, turn, "good", "command")  # another source stands beside it
    await store.grade(BOB, turn, "good", "reaction")  # and another grader
    assert [(f.user, f.kind, f.source) for f in await store.list_feedback(turn)] == \
        [(ADA, "bad", "reaction"), (ADA, "good", "command"), (BOB, "good", "reaction")]
    assert await feedback_of(store, [turn, turn + 99]) == {turn: ["bad", "good", "good"]}


async def test_taking_a_reaction_back_deletes_only_that_grade(store):
    turn = await answered(store, ADA, "1001", "m1", ["hi"], 1)
    await store.grade(ADA, turn, "good", "reaction")
    await store.grade(ADA, turn, "bad", "reaction")  # 👎 replaced 👍
    assert not await store.ungrade(ADA, turn, "reaction", kind="good")  # the 👍 taken back
    assert await feedback_of(store, [turn]) == {turn: ["bad"]}
    assert await store.ungrade(ADA, turn, "reaction", kind="bad")
    assert await feedback_of(store, [turn]) == {}


async def test_a_grade_goes_with_its_turn_and_must_name_one(store):
    turn = await answered(store, ADA, "1001", "m1", ["hi"], 1)
    await store.grade(ADA, turn, "retry", "text")
    async with store.engine.begin() as conn:
        await conn.execute(sqlalchemy.text("DELETE FROM outbound_messages"))
        await conn.execute(sqlalchemy.text("DELETE FROM inbound_events"))
    assert await store.list_feedback() == []
    with pytest.raises(IntegrityError):
        await store.grade(ADA, turn + 99, "good", "command")
    with pytest.raises(ValueError):
        await store.grade(ADA, turn, "meh", "command")
