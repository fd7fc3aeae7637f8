"""The whole daemon with `[engine] backend = "openai"`, against a fake OpenAI-compatible server on
the real wire protocol: conversations with tool calls (structured, or as text in content), /stop,
the server going away and coming back, timeouts and retries, token counts and the context."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from engine.chat import ChatFormatter
from engine.tokenizer import Tokenizer
from openclaw.agent.loop import APOLOGY
from openclaw.backends import http
from openclaw.config import ConfigError
from openclaw.gateway import turn
from openclaw.gateway.turn import MODEL_AWAY
from tests.fakes.openai_api import MODEL, FakeOpenAI, Reply, count_tokens, replies
from tests.helpers.daemon import RecordingConnector, msg, say, started
from tests.helpers.llama3_tokenizer import tokenizer_folder
from tests.helpers.replies import answer
from tests.helpers.waiting import until

CLOCK_CALL = ("clock", {"timezone": "UTC"})


@pytest.fixture(autouse=True)
def quick_turn_retries(monkeypatch):
    monkeypatch.setattr(turn, "MODEL_RETRY_S", 0.05)


def on(fake: FakeOpenAI, engine: str = "", agent: str = "") -> str:
    """The config's lines for a daemon whose model is on `fake` (`agent`: more [agent] keys)."""
    return (f'{agent}\n[engine]\nbackend = "openai"\nurl = "{fake.url}"\nmodel = "{MODEL}"\n'
            f"{engine}")


def last_user(body: dict) -> str:
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


async def conversation(daemon, user: str = "terminal:local", chat: str = "local"):
    conv = await daemon.store.active_conversation(user, chat)
    return await daemon.store.list_messages(conv.id)


async def test_a_two_turn_conversation_with_a_tool_call(tmp_path, fake):
    fake.reply = replies(Reply("Let me look.", tool_calls=[CLOCK_CALL]), "It is noon in UTC.",
                         then=lambda body: f"You asked: {last_user(body)}")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert answer(await say(daemon, conn, "what time is it?")) == "It is noon in UTC."
    assert await say(daemon, conn, "and tomorrow?") == "You asked: and tomorrow?"
    first, after_tool, second = fake.chats
    # The agent's tools, offered as the server takes them; the call came back structured.
    assert "clock" in [t["function"]["name"] for t in first["tools"]]
    assert first["tool_choice"] == "auto"
    call, result = after_tool["messages"][-2:]
    assert call["role"] == "assistant" and call["content"] == "Let me look."
    [stored_call] = call["tool_calls"]
    assert stored_call["function"]["name"] == "clock"
    assert json.loads(stored_call["function"]["arguments"]) == {"timezone": "UTC"}
    assert result["role"] == "tool" and result["tool_call_id"] == stored_call["id"]
    assert "UTC" in result["content"] and not result["content"].startswith("error")
    # The second turn sees the first, its tool exchange included.
    assert second["messages"][:4] == after_tool["messages"]
    assert second["messages"][4:] == [{"role": "assistant", "content": "It is noon in UTC."},
                                      {"role": "user", "content": "and tomorrow?"}]
    # Every request carries the user, so a shared server keeps each one's cached prefixes apart.
    assert {(c["user"], c["cache_salt"]) for c in fake.chats} == {("terminal:local",) * 2}
    # Counted by the server: the stored message has the server's count.
    messages = await conversation(daemon)
    assert fake.counts
    assert messages[0].token_count == count_tokens([{"role": "user", "content": "what time is it?"}])
    await daemon.stop()


async def test_a_call_the_server_returns_as_text_in_content_is_recovered_and_run(tmp_path, fake):
    fake.reply = replies('{"name": "clock", "arguments": {"timezone": "UTC"}}', "Noon.")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert answer(await say(daemon, conn, "time?")) == "Noon."
    tool = fake.chats[1]["messages"][-1]
    assert tool["role"] == "tool" and "UTC" in tool["content"] and "error" not in tool["content"]
    await daemon.stop()


async def test_stop_mid_stream_closes_the_request_on_the_server(tmp_path, fake):
    fake.reply = replies(Reply("a long answer " * 100, delay=0.02), "fresh answer")
    daemon, conn = await started(tmp_path, None, on(fake))
    await conn.handler(msg("tell me everything"))
    await until(lambda: fake.tokens_sent and fake.tokens_sent[0] >= 2)
    await conn.handler(msg("/stop"))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts() == ["Stopped."]
    await until(lambda: fake.disconnects == [0])  # the server heard the request end
    assert await daemon.store.pending_inbound() == []
    assert await say(daemon, conn, "again") == "fresh answer"
    await daemon.stop()


async def test_the_server_down_mid_conversation_and_back_answers_each_message_once(tmp_path, fake):
    fake.reply = lambda body: f"re: {last_user(body)}"
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, None, on(fake), also=(tg,))
    await daemon.store.set_user_status("telegram", "4242", "allowed")
    assert await say(daemon, conn, "first") == "re: first"
    await fake.stop()
    await conn.handler(msg("second"))
    await tg.handler(msg("hi", user="4242", channel="telegram"))
    await until(lambda: len(conn.texts()) == 2 and tg.texts())
    away = conn.texts()[1]
    # The owner hears why; another user only that the message waits.
    assert away.startswith(MODEL_AWAY) and "cannot connect" in away
    assert tg.texts() == [MODEL_AWAY]
    await conn.handler(msg("/status"))  # commands still answer meanwhile
    await until(lambda: len(conn.texts()) == 3 and conn.texts()[2].startswith("Model: fake-model"))
    await asyncio.sleep(0.3)  # tries go on with backoff, and tell no one again
    assert len(conn.texts()) == 3 and len(tg.texts()) == 1
    await fake.start()
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts()[3:] == ["re: second"] and tg.texts()[1:] == ["re: hi"]
    assert [m.content for m in await conversation(daemon) if m.role == "user"] == ["first", "second"]
    assert await daemon.store.pending_inbound() == []
    await daemon.stop()


async def test_a_stop_while_a_turn_waits_for_the_server_leaves_it_for_the_next_start(tmp_path, fake):
    fake.reply = lambda body: f"re: {last_user(body)}"
    daemon, conn = await started(tmp_path, None, on(fake))
    assert await say(daemon, conn, "first") == "re: first"
    await fake.stop()
    await conn.handler(msg("second"))
    await until(lambda: len(conn.texts()) == 2)
    await asyncio.wait_for(daemon.stop(), 5)  # not the whole drain: the server may stay away
    await fake.start()
    daemon, conn = await started(tmp_path, None, on(fake))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts() == ["re: second"]
    assert [m.content for m in await conversation(daemon) if m.role == "user"] == ["first", "second"]
    await daemon.stop()


async def test_no_first_token_in_time_keeps_the_turn_for_another_try(tmp_path, fake):
    fake.reply = replies(Reply("late", first_delay=3), "on time")
    daemon, conn = await started(tmp_path, None, on(fake, "first_token_timeout = 0.3"))
    await conn.handler(msg("hello"))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts()[0].startswith(MODEL_AWAY) and "no first token in 0.3 s" in conn.texts()[0]
    assert conn.texts()[1:] == ["on time"]
    await daemon.stop()


async def test_a_server_silent_mid_answer_keeps_the_turn_but_a_long_answer_is_fine(tmp_path, fake):
    # The idle limit is far above a chunk's delay, so a loaded machine's pauses do not reach it.
    fake.reply = replies(Reply("x" * 40, chunk=1, delay=0.05),
                         Reply("half an answ", chunk=1, silent_after=4), "whole")
    daemon, conn = await started(tmp_path, None, on(fake, "idle_timeout = 1.5"))
    assert await say(daemon, conn, "long one") == "x" * 40  # 2 s in all, never 1.5 s idle
    await conn.handler(msg("next"))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 20)
    assert "sent nothing for 1.5 s" in conn.texts()[1] and conn.texts()[2:] == ["whole"]
    await daemon.stop()


async def test_retries_before_the_first_token_are_not_the_users_concern(tmp_path, fake):
    fake.reply = replies(Reply(status=503), Reply(status=429, retry_after="0"), "fine")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert await say(daemon, conn, "hi") == "fine"
    assert conn.texts() == ["fine"] and len(fake.chats) == 3
    await daemon.stop()


async def test_a_request_the_server_refuses_gets_the_apology_and_is_not_tried_again(tmp_path, fake):
    fake.reply = replies(Reply(status=400, error="bad request"), "later")
    daemon, conn = await started(tmp_path, None, on(fake))
    assert await say(daemon, conn, "hi") == APOLOGY
    assert len(fake.chats) == 1
    assert await say(daemon, conn, "again") == "later"
    await daemon.stop()


async def test_the_context_is_the_servers_and_long_history_is_compacted(tmp_path, fake):
    fake.max_model_len = 300
    fake.reply = lambda body: ("SUMMARY of it" if "You write the memory" in body["messages"][0]["content"]
                               else f"noted {last_user(body)}")
    daemon, conn = await started(tmp_path, None, on(
        fake, agent="reply_max_tokens = 40\ncompaction_keep_messages = 2"))
    assert daemon.model.max_model_len == 300
    for i in range(12):
        await say(daemon, conn, f"number {i} " + "word " * 8)
    conv = await daemon.store.active_conversation("terminal:local", "local")
    assert (await daemon.store.latest_summary(conv.id)) is not None
    last = fake.chats[-1]
    assert count_tokens(last["messages"], last.get("tools")) <= 300 - 40
    assert all(c["cache_salt"] == "terminal:local" for c in fake.chats)  # summaries too
    await daemon.stop()


async def test_a_context_length_set_in_the_config_wins(tmp_path, fake):
    daemon, _ = await started(tmp_path, None, on(fake, "context_length = 2048"))
    assert daemon.model.max_model_len == 2048
    await daemon.stop()


async def test_a_server_that_states_no_context_length_stops_the_start_naming_the_key(tmp_path, fake):
    fake.max_model_len = None
    with pytest.raises(ConfigError, match="context_length"):
        await started(tmp_path, None, on(fake))


async def test_without_tokenize_the_local_tokenizer_counts(tmp_path, fake):
    fake.tokenize = False
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tokenizer_folder(folder)
    daemon, conn = await started(tmp_path, None, on(fake, f'tokenizer = "{folder}"'))
    assert await say(daemon, conn, "count me") == "hello from the fake"
    [user, _] = await conversation(daemon)
    exact = ChatFormatter(Tokenizer.from_hf_folder(folder)).encode(
        [{"role": "user", "content": "count me"}])
    assert user.token_count == len(exact)
    await daemon.stop()


async def test_the_daemon_works_against_a_strict_server(tmp_path, fake, caplog):
    """OpenAI's own API: no /tokenize, no max_model_len, and a 400 for vLLM's cache_salt."""
    fake.strict, fake.tokenize, fake.max_model_len = "openai", False, None
    fake.reply = lambda body: f"re: {last_user(body)}"
    caplog.set_level(logging.WARNING, "openclaw.backends.openai")
    daemon, conn = await started(tmp_path, None, on(fake, "context_length = 4096"))
    assert await say(daemon, conn, "first") == "re: first"
    assert await say(daemon, conn, "second") == "re: second"
    assert conn.texts() == ["re: first", "re: second"]
    assert len(fake.refused) == 1 and "cache_salt" in fake.refused[0]
    assert all("cache_salt" not in c and c["user"] == "terminal:local" for c in fake.chats)
    assert len([r for r in caplog.records if "refuses the request field cache_salt"
                in r.getMessage()]) == 1
    await daemon.stop()


async def test_a_daemon_stopping_while_a_request_waits_between_tries_stops_at_once(
        tmp_path, fake, monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", 30.0)  # the client's own retries, before the turn's
    fake.reply = lambda body: f"re: {last_user(body)}"
    daemon, conn = await started(tmp_path, None, on(fake, "retries = 3"))
    assert await say(daemon, conn, "first") == "re: first"
    await fake.stop()
    await conn.handler(msg("second"))
    await asyncio.sleep(0.5)  # refused once; now waiting 30 s before the next try
    daemon.request_stop()  # as SIGTERM does
    await asyncio.wait_for(daemon.stop(), 5)
    # The user heard the message waits; it does, for the next start.
    assert len(conn.texts()) == 2 and conn.texts()[1].startswith(MODEL_AWAY)
    await fake.start()
    daemon, conn = await started(tmp_path, None, on(fake))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts() == ["re: second"]
    await daemon.stop()
