"""The streamed-draft machine both Telegram and Discord use, against a service of plain functions:
edits rate-limited with the latest text winning, rate limits waited out, a refused draft given up
without costing the reply, the reply's first send replacing the draft, idle drafts forgotten."""

from __future__ import annotations

import asyncio
import time
from itertools import pairwise

import pytest

from connectors import drafts as drafts_module
from connectors.drafts import DraftStream


class Gone(Exception):
    """The draft's message was deleted."""


class Refused(Exception):
    """The service refuses the message for good: its send is not retried."""


class SlowDown(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"retry in {seconds}")
        self.seconds = seconds


class Service:
    """Messages by id; `fail` queues errors for the next sends or edits."""

    def __init__(self) -> None:
        self.messages: dict[int, str] = {}
        self.calls: list[tuple[str, str, float]] = []  # (send | edit, text, when)
        self.fail: list[Exception] = []

    async def send(self, chat_id: str, text: str) -> int:
        self._called("send", text)
        self.messages[len(self.messages) + 1] = text
        return len(self.messages)

    async def edit(self, chat_id: str, message_id: int, text: str) -> None:
        self._called("edit", text)
        if message_id not in self.messages:
            raise Gone()
        self.messages[message_id] = text

    def _called(self, what: str, text: str) -> None:
        self.calls.append((what, text, time.monotonic()))
        if self.fail:
            raise self.fail.pop(0)

    def stream(self, interval: float = 0.1) -> DraftStream:
        return DraftStream("test", send=self.send, edit=self.edit, limit=20, interval=interval,
                           message_gone=lambda exc: isinstance(exc, Gone),
                           retried=lambda exc: not isinstance(exc, Refused),
                           retry_after=lambda exc: exc.seconds if isinstance(exc, SlowDown) else None)


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_one_message_edited_at_most_once_per_interval_with_the_latest_text():
    service = Service()
    drafts = service.stream(interval=0.2)
    for text in ("a", "a b", "a b c", "a b c d   "):
        drafts.update("chat", text)
        await asyncio.sleep(0.05)
    await until(lambda: service.messages == {1: "a b c d"})  # trailing spaces dropped
    assert [what for what, _, _ in service.calls] == ["send"] + ["edit"] * (len(service.calls) - 1)
    assert all(b[2] - a[2] >= 0.18 for a, b in pairwise(service.calls))  # 0.2 s apart, minus slack
    drafts.update("chat", "x" * 50)
    await until(lambda: service.messages[1] == "x" * 19 + "…")  # cut to the message limit
    assert await drafts.replace("chat", lambda mid: service.edit("chat", mid, "the reply")) == "1"
    assert service.messages == {1: "the reply"} and len(drafts) == 0


async def test_a_rate_limit_is_waited_out_and_a_refusal_gives_the_draft_up():
    service = Service()
    drafts = service.stream(interval=0.01)
    service.fail = [SlowDown(0.3)]
    drafts.update("chat", "first")
    await until(lambda: service.messages == {1: "first"})
    assert service.calls[1][2] - service.calls[0][2] >= 0.28  # asked to wait 0.3 s
    service.fail = [RuntimeError("refused")]
    drafts.update("chat", "second")
    await until(lambda: len(service.calls) == 3)
    drafts.update("chat", "third")  # given up: no more edits for this reply
    await asyncio.sleep(0.1)
    assert len(service.calls) == 3 and service.messages == {1: "first"}
    # The reply still turns the draft's message into itself.
    assert await drafts.replace("chat", lambda mid: service.edit("chat", mid, "reply")) == "1"


async def test_a_draft_never_sent_or_deleted_leaves_the_reply_to_a_new_message():
    service = Service()
    drafts = service.stream()
    service.fail = [RuntimeError("refused")]
    drafts.update("chat", "draft")
    await until(lambda: service.calls)
    assert await drafts.replace("chat", lambda mid: service.edit("chat", mid, "reply")) is None
    drafts.update("other", "draft")
    await until(lambda: service.messages)
    del service.messages[1]  # deleted by the user
    assert await drafts.replace("other", lambda mid: service.edit("other", mid, "reply")) is None


async def test_a_reply_that_fails_for_now_keeps_the_draft_for_its_retry():
    service = Service()
    drafts = service.stream()
    drafts.update("chat", "draft")
    await until(lambda: service.messages)
    service.fail = [ConnectionError("down")]
    with pytest.raises(ConnectionError):
        await drafts.replace("chat", lambda mid: service.edit("chat", mid, "reply"))
    assert await drafts.replace("chat", lambda mid: service.edit("chat", mid, "reply")) == "1"
    assert service.messages == {1: "reply"}


async def test_a_reply_refused_for_good_leaves_no_draft_behind_for_the_next_reply():
    service = Service()
    drafts = service.stream()
    drafts.update("chat", "turn 1 partial")
    await until(lambda: service.messages)
    service.fail = [Refused("400")]
    with pytest.raises(Refused):
        await drafts.replace("chat", lambda mid: service.edit("chat", mid, "turn 1 final"))
    drafts.update("chat", "turn 2 partial")  # a draft of its own, not swallowed by the dead one
    await until(lambda: len(service.messages) == 2)
    assert await drafts.replace("chat", lambda mid: service.edit("chat", mid, "turn 2 final")) == "2"
    assert service.messages == {1: "turn 1 partial", 2: "turn 2 final"}


async def test_closing_without_waiting_cancels_a_send_stuck_on_the_wire():
    stuck = asyncio.Event()

    async def send(chat_id: str, text: str) -> int:
        stuck.set()
        await asyncio.sleep(60)  # a library sleeping out a rate limit inside the request
        return 1

    drafts = DraftStream("test", send=send, edit=Service().edit, limit=20, interval=0.1,
                         message_gone=lambda exc: False)
    drafts.update("chat", "draft")
    await stuck.wait()
    started = time.monotonic()
    await drafts.close(wait_s=0)
    assert time.monotonic() - started < 1 and len(drafts) == 0


async def test_a_dropped_draft_stays_as_it_is_and_the_next_starts_a_new_message():
    service = Service()
    drafts = service.stream()
    drafts.update("chat", "stopped")
    await until(lambda: service.messages)
    drafts.drop("chat")
    drafts.update("chat", "next")
    await until(lambda: len(service.messages) == 2)
    assert service.messages == {1: "stopped", 2: "next"}


async def test_drafts_idle_for_long_are_forgotten(monkeypatch):
    monkeypatch.setattr(drafts_module, "DRAFT_IDLE_S", 0.2)
    service = Service()
    drafts = service.stream(interval=0.01)
    for chat in ("a", "b", "c"):
        drafts.update(chat, "never answered")
    await until(lambda: len(service.messages) == 3)
    await asyncio.sleep(0.25)
    drafts.update("d", "someone else")
    assert len(drafts) == 1
    await drafts.close()
    assert len(drafts) == 0
