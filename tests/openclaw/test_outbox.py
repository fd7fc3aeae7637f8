"""Replies survive a service that is down: they stay pending in the outbound table, are retried
with backoff in their order, and go out once it is back; a refusal for good is not retried."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc

import pytest

from openclaw.daemon import Daemon
from openclaw.gateway.contract import DeliveryRefused, RetryLater
from openclaw.gateway.outbox import Outbox
from openclaw.store.records import OutboundStatus
from tests.helpers.daemon import RecordingConnector, config, msg
from tests.helpers.outbox import SlowConnector, start
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until


class FlakyConnector(RecordingConnector):
    """Raises like a client library whose network is gone while `down`; refuses chats in `gone`,
    and those in `moved` with their new id."""

    max_message_len = 40

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.gone: set[str] = set()
        self.moved: dict[str, str] = {}
        self.attempts = 0

    async def send_text(self, chat_id: str, text: str) -> str:
        self.attempts += 1
        if chat_id in self.gone:
            raise DeliveryRefused("Forbidden: bot was blocked by the user", chat_gone=True)
        if chat_id in self.moved:
            raise DeliveryRefused("group chat was upgraded to a supergroup chat",
                                  moved_to=self.moved[chat_id])
        if self.down:
            raise ConnectionError("network is unreachable")
        return await super().send_text(chat_id, text)


async def outbound(daemon: Daemon):
    return [(o.chat_id, o.text, o.status, o.attempts) for o in await daemon.store.list_outbound()]


async def two_replies_waiting(daemon: Daemon, conn: FlakyConnector) -> None:
    """Two questions answered while the service is down: their replies (three pieces) wait."""
    conn.down = True
    for text in ("first question", "second question, which is long enough to need two pieces"):
        await conn.handler(msg(text, user="local"))
    await daemon.gateway.wait_idle()


async def test_replies_wait_out_an_outage_and_arrive_in_order(tmp_path):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    try:
        await two_replies_waiting(daemon, conn)
        rows = await outbound(daemon)
        assert rows and all(status is OutboundStatus.PENDING for _, _, status, _ in rows)
        await until(lambda: conn.attempts >= 3)  # it keeps trying while down
        conn.down = False
        await daemon.gateway.outbox.wait_delivered()
        sent = "".join(conn.texts("local")).replace("\n", " ")
        assert conn.texts("local")[0] == "reply to: first question"
        assert sent.index("first question") < sent.index("second question")
        assert all(status is OutboundStatus.SENT for _, _, status, _ in await outbound(daemon))
        assert max(attempts for *_, attempts in await outbound(daemon)) >= 2
        # and the chat goes on normally afterwards
        await conn.handler(msg("third", user="local"))
        await daemon.gateway.wait_idle()
        assert conn.texts("local")[-1] == "reply to: third"
    finally:
        await daemon.stop()


async def test_a_refusal_for_good_is_marked_failed_and_not_retried(tmp_path):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    try:
        conn.gone.add("local")
        await conn.handler(msg("hello", user="local"))
        await daemon.gateway.wait_idle()
        await daemon.gateway.outbox.wait_delivered()
        [(_, _, status, attempts)] = await outbound(daemon)
        assert status is OutboundStatus.FAILED and attempts == 1 and conn.attempts == 1
    finally:
        await daemon.stop()


@pytest.mark.parametrize("refusal", ["Forbidden: bot was blocked by the user",
                                     "group chat was upgraded to a supergroup chat"])
async def test_a_failing_refusal_handler_costs_no_other_piece(tmp_path, refusal):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn, reply=lambda m: "a reply that is long enough to need two pieces")
    told = []

    async def broken(channel: str, chat_id: str, refusal: DeliveryRefused) -> None:
        told.append((channel, chat_id, str(refusal)))
        raise RuntimeError("the database went away")

    daemon.gateway.outbox.on_chat_refused = broken
    try:
        if "blocked" in refusal:
            conn.gone.add("local")
        else:  # a move that cannot be followed: failed like any refusal, not retried in a loop
            conn.moved["local"] = "elsewhere"
        await conn.handler(msg("hello", user="local"))
        await daemon.gateway.wait_idle()
        rows = await outbound(daemon)
        assert len(rows) == 2 and all(status is OutboundStatus.FAILED for _, _, status, _ in rows)
        assert told == [("terminal", "local", refusal)] * 2
        assert daemon.gateway.outbox.backlog == 0
    finally:
        await daemon.stop()


async def test_replies_waiting_for_a_chat_that_moved_are_sent_to_its_new_id_in_order(tmp_path):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    try:
        await two_replies_waiting(daemon, conn)
        waiting = await daemon.store.pending_outbound()
        assert len(waiting) == 3
        conn.down, conn.moved["local"] = False, "elsewhere"  # the retry is refused: it moved
        await daemon.gateway.outbox.wait_delivered()
        assert conn.texts("local") == []
        assert conn.texts("elsewhere") == [o.text for o in waiting]  # all of them, in order
        rows = await daemon.store.list_outbound()
        assert [(o.id, o.chat_id, o.status) for o in rows] == [
            (o.id, "elsewhere", OutboundStatus.SENT) for o in waiting]  # the same rows, re-pointed
        assert daemon.gateway.outbox.backlog == 0
    finally:
        await daemon.stop()


async def test_what_a_stopped_daemon_left_pending_is_sent_at_the_next_start(tmp_path):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    conn.down = True
    await conn.handler(msg("before the restart", user="local"))
    await daemon.gateway.wait_idle()
    await daemon.stop()
    assert [s for *_, s, _ in await _rows_after(tmp_path)] == [OutboundStatus.PENDING]

    conn2 = FlakyConnector()
    daemon = await start(tmp_path, conn2)
    try:
        await until(lambda: conn2.texts("local"))
        assert conn2.texts("local") == ["reply to: before the restart"]
    finally:
        await daemon.stop()


async def _rows_after(tmp_path):
    from openclaw.store import Store

    store = await Store.open(config(tmp_path).store.url)
    try:
        return [(o.chat_id, o.text, o.status, o.attempts) for o in await store.pending_outbound()]
    finally:
        await store.close()


async def test_a_restart_during_the_send_resends_the_reply_but_never_reruns_the_turn(tmp_path):
    runs = []

    def model(messages):
        runs.append(1)
        return f"answer #{len(runs)}"

    conn = SlowConnector()
    daemon = await start(tmp_path, conn, reply=model)
    await conn.handler(msg("hello", user="local"))
    await until(lambda: runs)
    await asyncio.sleep(0.1)  # the reply is stored and its send is in flight
    await daemon.stop(drain_timeout=0.2)
    conn2 = FlakyConnector()
    daemon = await start(tmp_path, conn2, reply=model)
    try:
        await until(lambda: conn2.texts("local"))
        await asyncio.sleep(0.2)
        assert conn2.texts("local") == ["answer #1"] and len(runs) == 1
    finally:
        await daemon.stop()


class OffUntilStarted(FlakyConnector):
    """Cannot send before it is started, which takes a while (a client connecting)."""

    async def start(self, handler) -> None:
        await super().start(handler)
        await asyncio.sleep(0.3)
        self.down = False


async def test_replies_an_earlier_run_left_go_out_once_their_connector_is_up(tmp_path, monkeypatch):
    """At a start, what an earlier run left pending is tried before the connectors are started,
    fails, and waits out the backoff: once a connector is up, its chats' replies go at once."""
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    conn.down = True
    await conn.handler(msg("hello", user="local"))
    await daemon.gateway.wait_idle()
    await daemon.stop(drain_timeout=0.2)
    assert conn.texts("local") == []
    monkeypatch.setattr(Outbox, "__init__", functools.partialmethod(Outbox.__init__,
                                                                    first_delay_s=60))
    conn2 = OffUntilStarted()
    conn2.down = True
    daemon = Daemon(config(tmp_path), model=ScriptedModel(lambda m: "unused"), connectors=[conn2])
    await daemon.start()
    try:
        await asyncio.wait_for(daemon.gateway.outbox.settled("terminal", "local"), 10)
        assert conn2.texts("local") == ["reply to: hello"] and conn2.attempts == 2
    finally:
        await daemon.stop()


class Reconnecting(FlakyConnector):
    """Says whether it is connected, as the Telegram and Discord connectors do."""

    @property
    def connected(self) -> bool:
        return not self.down


async def test_waiting_replies_go_out_when_their_connector_comes_back(tmp_path, monkeypatch):
    """An outage grows the backoff (to max_delay_s, a minute): once the connector is back, the
    chat's replies go at once, not at the end of the wait."""
    monkeypatch.setattr(Outbox, "__init__", functools.partialmethod(Outbox.__init__,
                                                                    first_delay_s=60))
    conn = Reconnecting()
    daemon = Daemon(config(tmp_path), model=ScriptedModel(lambda m: "answer"), connectors=[conn])
    await daemon.start()
    try:
        conn.down = True
        await asyncio.sleep(1.5)  # the connections are looked at every second: this is seen
        await conn.handler(msg("hello", user="local"))
        await daemon.gateway.wait_idle()
        assert conn.texts("local") == [] and daemon.gateway.outbox.backlog == 1
        conn.down = False
        await asyncio.wait_for(daemon.gateway.outbox.settled("terminal", "local"), 10)
        assert conn.texts("local") == ["answer"]
    finally:
        await daemon.stop()


async def test_concurrent_replies_to_one_chat_are_each_sent_once_and_in_order(tmp_path):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    outbox = daemon.gateway.outbox
    try:
        conn.down = True
        first = asyncio.create_task(outbox.send("terminal", "local", ["a1", "a2"], conversation_id=None,
                                                answers=None))
        second = asyncio.create_task(outbox.send("terminal", "local", ["b1"], conversation_id=None,
                                                 answers=None))
        await asyncio.gather(first, second)
        await until(lambda: conn.attempts >= 2)
        conn.down = False
        await outbox.wait_delivered()
        third = outbox.send("terminal", "local", ["c1"], conversation_id=None, answers=None)
        await third
        # The two concurrent replies are stored in either order (two transactions race); each is
        # sent once, in the order stored, a reply's pieces together, and the later one after both.
        stored = await daemon.store.list_outbound()
        assert conn.texts("local") == [o.text for o in stored]
        assert conn.texts("local") in (["a1", "a2", "b1", "c1"], ["b1", "a1", "a2", "c1"])
        assert [o.status for o in stored] == [OutboundStatus.SENT] * 4
    finally:
        await daemon.stop()


async def test_a_turn_cut_during_its_send_is_still_counted_and_its_reply_resent_first(tmp_path):
    from openclaw.store import Store

    conn = SlowConnector()
    daemon = await start(tmp_path, conn)
    await conn.handler(msg("first question", user="local"))
    await until(lambda: daemon.gateway.model.prompts)
    await asyncio.sleep(0.1)  # the reply is stored, its send hangs
    await daemon.stop(drain_timeout=0.2)
    store = await Store.open(config(tmp_path).store.url)
    try:
        assert await store.tokens_today() > 0  # counted with the stored reply, not after the send
        # a voice note stored but not answered before the stop: recovered after the older reply
        await store.record_inbound("terminal", "m-voice", "terminal:local", "local", "",
                                   payload={"notice": "NOTICE: no voice notes yet"})
    finally:
        await store.close()
    conn2 = FlakyConnector()
    daemon = await start(tmp_path, conn2)
    try:
        await until(lambda: len(conn2.texts("local")) >= 2)
        assert conn2.texts("local") == ["reply to: first question", "NOTICE: no voice notes yet"]
    finally:
        await daemon.stop()


async def test_after_close_a_send_in_flight_starts_no_retry(tmp_path):
    conn = SlowConnector()
    daemon = await start(tmp_path, conn)
    outbox = daemon.gateway.outbox
    sending = asyncio.create_task(outbox.send("terminal", "local", ["hi"], conversation_id=None,
                                              answers=None))
    await asyncio.sleep(0.05)
    await outbox.close()
    sending.cancel()  # shutdown cuts the send
    await asyncio.gather(sending, return_exceptions=True)
    assert outbox.backlog == 0
    await daemon.stop()


async def test_a_send_cut_by_stop_is_retried_not_stranded(tmp_path):
    conn = SlowConnector()
    daemon = await start(tmp_path, conn)
    outbox = daemon.gateway.outbox
    try:
        sending = asyncio.create_task(outbox.send("terminal", "local", ["prompt"], conversation_id=None,
                                                  answers=None))
        await asyncio.sleep(0.05)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        assert outbox.backlog == 1
        conn.release.set()
        await outbox.wait_delivered()
        assert conn.texts("local") == ["prompt"]
    finally:
        await daemon.stop()


async def test_a_blank_answer_still_gets_a_reply(tmp_path):
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn, reply=lambda m: " \n\n ")
    try:
        await conn.handler(msg("hello", user="local"))
        await daemon.gateway.wait_idle()
        assert conn.texts("local") == ["(no answer)"]
    finally:
        await daemon.stop()


async def test_new_replies_behind_a_waiting_one_do_not_hurry_its_retry(tmp_path):
    # A service that refuses for a while (a flood wait): each new reply must not be one more try.
    conn = FlakyConnector()
    daemon = await start(tmp_path, conn)
    outbox = daemon.gateway.outbox
    outbox.first_delay_s = 30
    try:
        conn.down = True
        for n in range(5):
            await outbox.send("terminal", "local", [f"r{n}"], conversation_id=None, answers=None)
        await asyncio.sleep(0.2)
        assert conn.attempts == 1  # the first send; the others wait behind it, untried
        conn.down = False
        outbox.retry_now("terminal", "local")  # reachable again (a console attached): all go now
        await asyncio.wait_for(outbox.settled("terminal", "local"), 5)
        assert conn.texts("local") == [f"r{n}" for n in range(5)]
        outbox.retry_now("terminal", "local")  # nothing waits: no effect on the next outage
        conn.down, conn.attempts = True, 0
        await outbox.send("terminal", "local", ["later"], conversation_id=None, answers=None)
        await asyncio.sleep(0.2)
        assert conn.attempts == 1
    finally:
        await daemon.stop()


async def test_chats_done_with_leave_no_lock_behind(tmp_path):
    conn, strangers = FlakyConnector(), RecordingConnector("telegram")
    daemon = Daemon(config(tmp_path), model=ScriptedModel(lambda m: "hi"), connectors=[conn, strangers])
    await daemon.start()
    outbox = daemon.gateway.outbox
    try:
        await asyncio.gather(*(outbox.send("terminal", f"chat-{n}", [f"hello {n}"], conversation_id=None,
                                           answers=None) for n in range(30)))
        for n in range(10):  # strangers, each answered once (a pairing code, or "try later")
            await strangers.handler(msg("hi", user=str(5000 + n), channel="telegram"))
        await outbox.settled("terminal", "local")  # the console owner is told of each request
        assert len([c for c, _ in conn.sent if c != "local"]) == 30 and len(strangers.texts()) == 10
        assert len(outbox._locks) == 0
    finally:
        await daemon.stop()


async def test_a_sender_waiting_for_a_chat_keeps_its_lock_and_goes_in_turn(tmp_path):
    conn = SlowConnector()
    daemon = await start(tmp_path, conn)
    outbox, key = daemon.gateway.outbox, ("terminal", "local")
    try:
        first = asyncio.create_task(outbox.send(*key, ["first"], conversation_id=None, answers=None))
        await until(lambda: key in outbox._locks and outbox._locks[key].locked())
        second = asyncio.create_task(outbox.send(*key, ["second"], conversation_id=None, answers=None))
        await until(lambda: len(outbox._locks[key]._waiters or ()) == 1)
        gc.collect()  # only its holder and its waiter refer to the lock
        third = asyncio.create_task(outbox.send(*key, ["third"], conversation_id=None, answers=None))
        await until(lambda: len(outbox._locks[key]._waiters or ()) == 2)  # the same lock, kept
        conn.release.set()
        await asyncio.gather(first, second, third)
        assert conn.texts("local") == ["first", "second", "third"]
        assert len(outbox._locks) == 0
    finally:
        await daemon.stop()


ANSWERING: contextvars.ContextVar[str | None] = contextvars.ContextVar("answering", default=None)


async def test_a_retry_does_not_inherit_the_context_of_the_send_that_started_it(tmp_path):
    """A connector may keep per-message state in a context variable (Discord: the slash command
    a send answers). A retry the outbox starts during that send sends other replies later, so it
    must not see it."""

    class Contextual(FlakyConnector):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str | None] = []

        async def send_text(self, chat_id: str, text: str) -> str:
            self.seen.append(ANSWERING.get())
            return await super().send_text(chat_id, text)

    conn = Contextual()
    daemon = await start(tmp_path, conn)
    try:
        conn.down = True
        token = ANSWERING.set("/status of user 1")
        try:  # the send fails, and starts the chat's retry from within this context
            await daemon.gateway.outbox.send("terminal", "local", ["an answer"],
                                             conversation_id=None, answers=None)
        finally:
            ANSWERING.reset(token)
        assert conn.seen == ["/status of user 1"]
        conn.down = False
        await until(lambda: conn.texts("local"))
        assert conn.seen[1:] == [None]  # the retry's send answers no slash command
    finally:
        await daemon.stop()


async def test_a_rate_limit_is_waited_out_in_the_background_for_at_least_what_was_asked(tmp_path):
    """A connector that is told to wait (Telegram's 429 retry_after) raises RetryLater at once:
    the send returns with the reply kept, other chats go on, and the retry comes no sooner than
    the service asked, even though the backoff's own first delay is shorter."""

    class RateLimited(FlakyConnector):
        def __init__(self) -> None:
            super().__init__()
            self.limited = {"local"}

        async def send_text(self, chat_id: str, text: str) -> str:
            if chat_id in self.limited:
                self.limited.discard(chat_id)
                raise RetryLater("Flood control exceeded. Retry in 3 seconds", 3.0)
            return await super().send_text(chat_id, text)

    conn = RateLimited()
    daemon = await start(tmp_path, conn)  # a backoff of 0.02 s
    outbox = daemon.gateway.outbox
    try:
        await outbox.send("terminal", "local", ["first"], conversation_id=None, answers=None)
        await outbox.send("terminal", "other", ["elsewhere"], conversation_id=None, answers=None)
        assert conn.texts("other") == ["elsewhere"] and conn.texts("local") == []
        [kept] = [o for o in await daemon.store.list_outbound() if o.chat_id == "local"]
        assert kept.status is OutboundStatus.PENDING and "Flood control" in kept.error
        outbox.retry_now("terminal", "local")  # a wake (a console attached) does not hurry it
        # Past the backoff's 0.02 s (and its 0.1 s most), well within the 3 s asked: the sends
        # and the look at the store before it may be slow on a loaded machine.
        await asyncio.sleep(0.5)
        assert conn.texts("local") == []  # not retried yet
        await until(lambda: conn.texts("local"), timeout=10)
        assert conn.texts("local") == ["first"]
    finally:
        await daemon.stop()
