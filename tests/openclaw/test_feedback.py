"""/good and /bad, and what a message says about the reply before it (a retry, "that's wrong"):
each lands on the right turn, and none reaches the model."""

from __future__ import annotations

import asyncio

import pytest

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.feedback import RETRY_WINDOW, repeats, says_wrong
from openclaw.gateway.feedback import NO_REPLY_YET, Grading
from openclaw.store import Store
from tests.helpers.clock import FakeClock
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.grades import grades
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel, echo, last_user
from tests.helpers.waiting import until

ADA, BOB, GROUP = "1001", "1002", "-500"


class Chat:
    """The daemon, spoken to on the terminal (the owner, "local") or on a remote channel."""

    def __init__(self, daemon: Daemon, model: ScriptedModel) -> None:
        self.daemon, self.model = daemon, model
        self.terminal, self.remote = daemon.connectors

    async def say(self, words: str, user: str = "local", chat: str | None = None) -> str:
        conn = self.terminal if user == "local" else self.remote
        before = len(conn.sent)
        await conn.handler(msg(words, user=user, chat=chat, channel=conn.name,
                               is_group=chat == GROUP))
        await self.daemon.gateway.wait_answered(conn.name, chat or user)
        assert len(conn.sent) > before, f"no reply to {words!r}"
        return answer(conn.sent[-1][1])

    def asked(self) -> list[str]:
        return [last_user(p) for p in self.model.prompts]


@pytest.fixture
async def chat(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
admins = ["terminal:local"]
allow = ["telegram:{ADA}", "telegram:{BOB}"]
[admin]
enabled = false
""")
    model = ScriptedModel(echo)
    daemon = Daemon(load_config(path), model=model,
                    connectors=[RecordingConnector(), RecordingConnector("telegram")])
    await daemon.start()
    yield Chat(daemon, model)
    await daemon.stop()


async def test_good_and_bad_grade_the_last_reply_and_never_reach_the_model(chat):
    assert await chat.say("/good") == NO_REPLY_YET
    assert await chat.say("hello") == "re: hello"
    assert await chat.say("what is 2+2?") == "re: what is 2+2?"
    assert await chat.say("/good") == "Thanks: noted as good."
    assert (await chat.say("/help")).startswith("Commands:")  # a command's answer is no turn
    assert await chat.say("/bad") == "Thanks: noted as bad."  # replaces the /good
    assert await grades(chat.daemon.store) == [("terminal:local", "what is 2+2?", "bad", "command")]
    assert chat.asked() == ["hello", "what is 2+2?"]


async def test_in_a_group_each_grades_the_last_reply_to_them(chat):
    await chat.say("plan the trip", user=ADA, chat=GROUP)
    await chat.say("book the hotel", user=BOB, chat=GROUP)
    await chat.say("weather there?", user=ADA)  # her private chat: not the group's
    assert await chat.say("/good", user=ADA, chat=GROUP) == "Thanks: noted as good."
    assert await chat.say("/bad", user=BOB, chat=GROUP) == "Thanks: noted as bad."
    assert await grades(chat.daemon.store) == [
        (f"telegram:{ADA}", "plan the trip", "good", "command"),
        (f"telegram:{BOB}", "book the hotel", "bad", "command")]


async def test_a_repeated_message_grades_the_turn_it_repeats_as_a_retry(chat):
    await chat.say("What is the capital of Australia?")
    await chat.say("what is the capital of australia")  # case and punctuation aside: the same
    await chat.say("thanks")
    await chat.say("thanks")  # short: said twice for other reasons
    await chat.say("What is the capital of Austria?")  # another question
    await chat.say("/new")
    await chat.say("What is the capital of Austria?")  # a fresh conversation asks anew
    assert await grades(chat.daemon.store) == [
        ("terminal:local", "What is the capital of Australia?", "retry", "text")]
    assert len(chat.asked()) == 6  # each was still answered


async def test_saying_the_answer_was_wrong_grades_it_bad(chat):
    await chat.say("how many legs has a spider?")
    await chat.say("That's wrong!")
    await chat.say("what's wrong with my code?")  # a question, not a grade
    await chat.say("no, that’s not it")
    assert await grades(chat.daemon.store) == [
        ("terminal:local", "how many legs has a spider?", "bad", "text"),
        ("terminal:local", "what's wrong with my code?", "bad", "text")]
    assert "That's wrong!" in chat.asked()  # still answered by the model



async def test_the_check_of_a_message_runs_after_its_reply_and_holds_up_neither(chat):
    # The check's store read held until released: the message is still acknowledged (the
    # connector's handler returns) and answered; the grade lands once the check goes on.
    store = chat.daemon.store
    released = asyncio.Event()
    last_answered_turn = store.last_answered_turn
    checked: list[int] = []

    async def held(*args, **kwargs):
        checked.append(len(chat.terminal.sent))  # the replies sent when the check began
        await released.wait()
        return await last_answered_turn(*args, **kwargs)

    await chat.say("how many legs has a spider?")
    store.last_answered_turn = held
    sent = len(chat.terminal.sent)
    await asyncio.wait_for(chat.terminal.handler(msg("that's wrong")), 5)
    await until(lambda: checked)
    assert checked == [sent + 1]  # after its own reply was sent
    assert answer(chat.terminal.sent[-1][1]) == "re: that's wrong"
    assert await grades(store) == []
    released.set()
    await chat.daemon.gateway.wait_idle()
    assert await grades(store) == [("terminal:local", "how many legs has a spider?", "bad", "text")]



async def test_a_message_is_judged_by_what_was_answered_when_it_came(chat):
    # Sent while the turn before it still runs: a repeat is impatience, not a retry, and "that's
    # wrong" is about the answer the user had, not the one still being written.
    chat.model.gate = asyncio.Event()  # each answer stalls after its first chunk until let go
    terminal = chat.terminal
    await terminal.handler(msg("where is my parcel now"))
    await until(lambda: chat.model.prompts)
    await terminal.handler(msg("where is my parcel now"))  # again, before any answer
    gate, chat.model.gate = chat.model.gate, None
    gate.set()
    await chat.daemon.gateway.wait_idle()
    assert await grades(chat.daemon.store) == []
    chat.model.gate = asyncio.Event()
    await terminal.handler(msg("second question"))
    await until(lambda: len(chat.model.prompts) == 3)
    await terminal.handler(msg("that's wrong"))  # the second answer is not out yet
    gate, chat.model.gate = chat.model.gate, None
    gate.set()
    await chat.daemon.gateway.wait_idle()
    assert await grades(chat.daemon.store) == [
        ("terminal:local", "where is my parcel now", "bad", "text")]


def test_the_text_rules():
    assert says_wrong("wrong") and says_wrong("Incorrect.") and says_wrong("that is not right")
    assert not says_wrong("what's wrong with my code") and not says_wrong("wrong answer, try x")
    assert not says_wrong("is that wrong?")  # matched whole: a question is no grade
    assert repeats("waht is the time in Tokyo", "what is the time in Tokyo?")  # a typo fixed
    assert not repeats("what is 2+2 times 3", "what is 3+3 times 3")
    assert not repeats("yes", "yes")


async def test_a_retry_counts_only_soon_after_an_answered_message(tmp_path):
    clock = FakeClock()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db'}", clock=clock)
    user = f"telegram:{ADA}"
    await store.ensure_user("telegram", ADA)
    grading = Grading(store, access=None)

    async def say(words: str, *, answered: bool = True):
        sent = msg(words, user=ADA, channel="telegram")
        event, _ = await store.record_inbound("telegram", sent.message_id, user, ADA, words)
        await grading.noticed(sent, event, "")
        if answered:
            conv = await store.active_conversation(user, ADA)
            [piece] = await store.add_reply("telegram", ADA, ["ok"], conversation_id=conv.id,
                                            answers=event.id)
            await store.mark_outbound(piece.id, "sent", external_message_id=event.id)
        return event

    try:
        await say("where is my parcel now", answered=False)
        await say("where is my parcel now")  # sent again before any answer: impatience
        first = await say("when does the shop open")
        clock.advance(RETRY_WINDOW.total_seconds() + 1)
        await say("when does the shop open")  # much later: asked anew
        assert await store.list_feedback() == []
        again = await say("is the bakery open today")
        clock.advance(60)
        grading = Grading(store, access=None)  # a restart: the message before is read back
        await say("is the bakery open today?")
        assert [(f.inbound_event_id, f.kind) for f in await store.list_feedback()] == \
            [(again.id, "retry")]
        assert first.id != again.id
    finally:
        await store.close()
