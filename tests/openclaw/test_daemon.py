"""The daemon end to end (real SQLite file, real gateway and agent) with a scripted model and a
recording connector: memory across restarts, dedupe, compaction, ordering and concurrency,
/stop, pairing, tool calls good and bad, drain."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json

import pytest

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.gateway import lanes as lanes_module
from openclaw.store import InboundStatus, Store
from tests.helpers.daemon import RecordingConnector, config, msg, say, started
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel, history_echo, last_user
from tests.helpers.waiting import until


async def test_two_turns_are_remembered_across_a_restart(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(history_echo))
    assert await say(daemon, conn, "my name is Ada") == "you said 1 things: my name is Ada"
    await daemon.stop()
    daemon, conn = await started(tmp_path, ScriptedModel(history_echo))
    reply = await say(daemon, conn, "what is my name?")
    assert reply == "you said 2 things: my name is Ada | what is my name?"
    await daemon.stop()


async def test_the_service_takes_what_its_start_made_out_of_the_collectors_reach(tmp_path):
    # `openclaw run` asks for it: a full collection would walk the model's and libraries' objects
    # (0.2 s, every chat stalled). At the stop they are given back, to be collected at exit.
    gc.unfreeze()  # what this test process froze before, if anything
    before = gc.get_freeze_count()
    conn = RecordingConnector()
    daemon = Daemon(config(tmp_path), model=ScriptedModel(history_echo), connectors=[conn],
                    freeze_heap=True)
    await daemon.start()
    try:
        assert gc.get_freeze_count() > before
        assert not any(o is daemon.gateway for o in gc.get_objects())  # no collection walks it
        assert await say(daemon, conn, "still here?") == "you said 1 things: still here?"
    finally:
        await daemon.stop()
        assert gc.get_freeze_count() == 0
        gc.freeze()  # as the test process had it (tests/conftest.py)


async def test_a_redelivered_message_is_answered_once(tmp_path):
    model = ScriptedModel(lambda m: "ok " + last_user(m))
    daemon, conn = await started(tmp_path, model)
    same = msg("hello", mid="tg-77")
    await conn.handler(same)
    await conn.handler(same)
    await daemon.gateway.wait_idle()
    assert conn.texts() == ["ok hello"]
    assert len(model.prompts) == 1
    await daemon.stop()


async def test_history_over_budget_is_compacted_into_a_summary_and_kept_in_the_store(tmp_path):
    def reply(messages):
        if "You write the memory" in messages[0]["content"]:
            return "SUMMARY: the user counted numbers"
        return "noted " + last_user(messages)

    model = ScriptedModel(reply, max_model_len=200)
    daemon, conn = await started(tmp_path, model,
                                 "reply_max_tokens = 40\ncompaction_keep_messages = 2")
    for i in range(12):
        await say(daemon, conn, f"number {i} " + "word " * 8)
    store: Store = daemon.store
    conv = await store.active_conversation("terminal:local", "local")
    summary = await store.latest_summary(conv.id)
    assert summary is not None and summary.content.startswith("SUMMARY")
    assert len(await store.list_messages(conv.id)) == 24  # nothing deleted
    last_prompt = model.prompts[-1]
    assert "SUMMARY" in last_prompt[0]["content"]  # the summary stands in for old turns
    assert "number 0 " not in json.dumps(last_prompt)
    assert model.encode_chat(last_prompt).__len__() <= 200 - 40
    # The summarising calls too share cached prefixes only with the user's own prompts.
    assert any("You write the memory" in p[0]["content"] for p in model.prompts)
    assert set(model.cache_salts) == {"terminal:local"}
    # Every model call counts against the user's tokens, the summarising ones too.
    assert await store.tokens_today("terminal:local") == sum(p + o for p, o in model.spent)
    await daemon.stop()


async def test_conversations_run_in_parallel_and_each_stays_ordered(tmp_path):
    model = ScriptedModel(lambda m: "re: " + last_user(m), chunk=2, delay=0.01)
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, model, "[access.roles]\n", also=(tg,))
    await daemon.store.set_user_status("telegram", "4242", "allowed")
    slow = asyncio.Event()
    model.gate = slow  # every stream waits at its first chunk until released
    await conn.handler(msg("a1 a1 a1 a1 a1"))
    await conn.handler(msg("a2"))
    await tg.handler(msg("b1", user="4242", channel="telegram"))
    await until(lambda: len(model.prompts) >= 2)
    await asyncio.sleep(0.05)
    # both conversations are generating at once; a2 waits behind a1
    assert len(model.prompts) == 2
    assert {last_user(p) for p in model.prompts} == {"a1 a1 a1 a1 a1", "b1"}
    slow.set()
    await daemon.gateway.wait_idle()
    assert conn.texts("local") == ["re: a1 a1 a1 a1 a1", "re: a2"]
    assert tg.texts("4242") == ["re: b1"]
    # Each user's prompts go to the engine under their own prefix-cache salt.
    assert {last_user(p): salt for p, salt in zip(model.prompts, model.cache_salts, strict=True)} == {
        "a1 a1 a1 a1 a1": "terminal:local", "a2": "terminal:local", "b1": "telegram:4242"}
    await daemon.stop()


async def test_stop_aborts_generation_and_the_conversation_stays_usable(tmp_path):
    model = ScriptedModel(lambda m: "a long answer " * 20)
    daemon, conn = await started(tmp_path, model)
    model.gate = asyncio.Event()  # the stream stalls after its first chunk
    await conn.handler(msg("tell me everything"))
    await conn.handler(msg("and then some more"))  # queued behind the first
    await until(lambda: model.prompts)
    await conn.handler(msg("/stop"))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts() == ["Stopped."]
    assert model.aborted  # the engine request was aborted
    assert len(model.prompts) == 1  # the queued message was dropped too, not started
    assert await daemon.store.pending_inbound() == []  # and not left to replay after restart
    model.gate = None
    model.reply = lambda m: "fresh answer"
    assert await say(daemon, conn, "again") == "fresh answer"
    await daemon.stop()



async def test_stops_that_come_together_end_the_turn_once_and_the_lane_goes_on(tmp_path):
    # The turn runs in its lane's worker, which /stop cancels (Lane.stop_current): two /stops
    # before the worker wakes are two cancels, both taken back as the turn ends, so neither
    # cancels the next message's turn; then /new cancels one while its model streams.
    model = ScriptedModel(lambda m: "a long answer " * 20)
    daemon, conn = await started(tmp_path, model)
    try:
        model.gate = asyncio.Event()
        await conn.handler(msg("tell me everything"))
        await until(lambda: model.prompts)
        await conn.handler(msg("/stop"))
        await conn.handler(msg("/stop"))
        await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
        assert conn.texts() == ["Stopped.", "Stopped."]
        model.gate = None
        model.reply = lambda m: "fresh answer"
        assert await say(daemon, conn, "again") == "fresh answer"
        assert await say(daemon, conn, "and again") == "fresh answer"
        model.gate = asyncio.Event()
        await conn.handler(msg("one more"))
        await until(lambda: len(model.prompts) == 4)
        await conn.handler(msg("/new"))
        await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
        model.gate = None
        assert await say(daemon, conn, "after new") == "fresh answer"
        assert [last_user(p) for p in model.prompts][-1] == "after new"
        assert len(model.prompts[-1]) == 2  # a fresh conversation: the system prompt and it
    finally:
        await daemon.stop()


async def test_unknown_user_gets_pairing_code_and_no_reply_until_approved(tmp_path):
    model = ScriptedModel(lambda m: "hello friend")
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, model, also=(tg,))
    await tg.handler(msg("hi", user="4242", channel="telegram"))
    await daemon.gateway.wait_idle()
    assert len(tg.texts("4242")) == 1
    assert "pairing code" in tg.texts("4242")[0]
    assert model.prompts == []  # nothing reached the model
    codes = await daemon.store.list_pairing_codes()
    assert [c.user for c in codes] == ["telegram:4242"]
    assert codes[0].code in tg.texts("4242")[0]
    assert await daemon.store.approve_pairing(codes[0].code) is not None
    assert await say(daemon, tg, "hi again", user="4242") == "hello friend"
    await daemon.stop()


async def test_the_owner_answers_pairing_requests_from_the_chat(tmp_path):
    model = ScriptedModel(lambda m: "hello friend")
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, model, also=(tg,))
    for user in ("4242", "5353"):
        await tg.handler(msg("hi", user=user, channel="telegram"))
    await daemon.gateway.wait_idle()
    codes = {c.user: c.code for c in await daemon.store.list_pairing_codes()}
    listing = await say(daemon, conn, "/pairing")  # the console's owner is an admin
    assert all(code in listing for code in codes.values()) and "telegram:5353" in listing
    assert await say(daemon, conn, f"/pairing approve {codes['telegram:4242'].lower()}") == \
        "Approved telegram:4242 (no name): they are told, and their first message is answered."
    await until(lambda: len(tg.texts("4242")) >= 3)  # the code, the welcome, the answer to "hi"
    await daemon.gateway.wait_idle()
    assert await say(daemon, tg, "hi again", user="4242") == "hello friend"
    # A paired user may not let others in, nor see who asked.
    refused = await say(daemon, tg, f"/pairing approve {codes['telegram:5353']}", user="4242")
    assert refused.startswith("Only the owner") and codes["telegram:5353"] not in refused
    assert "Denied telegram:5353" in await say(daemon, conn, f"/pairing deny {codes['telegram:5353']}")
    assert (await daemon.store.get_user("telegram", "5353")).status == "blocked"
    assert "No pending pairing code" in await say(daemon, conn, "/pairing approve NOPE1234")
    await tg.handler(msg("hi", user="6464", channel="telegram"))
    await daemon.gateway.wait_idle()
    code = next(c.code for c in await daemon.store.list_pairing_codes() if c.user == "telegram:6464")
    # In a group even the owner's /pairing shows nobody's code and answers none.
    for text in ("/pairing", f"/pairing approve {code}"):
        in_group = await say(daemon, conn, text, chat="group-1", is_group=True)
        assert in_group.startswith("Pairing requests are answered in a private chat")
        assert code not in in_group and "6464" not in in_group
    assert (await daemon.store.get_user("telegram", "6464")).status == "pending"
    assert len(model.prompts) == 2  # commands, not turns: 4242's "hi" kept, and "hi again"
    await daemon.stop()


async def test_a_running_daemon_follows_block_revoke_and_deny_made_in_the_store(tmp_path):
    """What `openclaw users block|revoke` and `openclaw pairing deny` write, from another process,
    applies to the next message: no restart, no stale cache of who was allowed."""
    model = ScriptedModel(lambda m: "hello friend")
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, model, also=(tg,))
    await tg.handler(msg("hi", user="4242", channel="telegram"))
    await daemon.gateway.wait_idle()
    [code] = await daemon.store.list_pairing_codes()
    await daemon.store.approve_pairing(code.code)
    assert await say(daemon, tg, "hi again", user="4242") == "hello friend"

    await daemon.store.set_user_status("telegram", "4242", "blocked")
    before = len(tg.texts("4242"))
    await tg.handler(msg("still there?", user="4242", channel="telegram"))
    await daemon.gateway.wait_idle()
    assert len(tg.texts("4242")) == before and len(model.prompts) == 1  # nothing, not even a code

    await daemon.store.set_user_status("telegram", "4242", "pending")  # revoked: pair again
    await tg.handler(msg("let me in", user="4242", channel="telegram"))
    await daemon.gateway.wait_idle()
    assert "pairing code" in tg.texts("4242")[-1] and len(model.prompts) == 1
    [again] = await daemon.store.list_pairing_codes()
    assert again.code != code.code  # the used one is not live again
    denied = await daemon.store.deny_pairing(again.code)
    assert denied.status == "blocked"
    assert await daemon.store.list_pairing_codes() == []
    await tg.handler(msg("please", user="4242", channel="telegram"))
    await daemon.gateway.wait_idle()
    assert len(tg.texts("4242")) == before + 1 and len(model.prompts) == 1
    await daemon.stop()


async def test_messages_of_a_user_blocked_meanwhile_are_not_answered(tmp_path):
    model = ScriptedModel(lambda m: "answer to " + m[-1]["content"])
    model.gate = asyncio.Event()  # the first answer waits: the next message queues behind it
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, model, also=(tg,))
    await daemon.store.set_user_status("telegram", "4242", "allowed")
    await tg.handler(msg("first", user="4242", channel="telegram"))
    await until(lambda: model.prompts)
    await tg.handler(msg("second (queued)", user="4242", channel="telegram"))
    await daemon.store.set_user_status("telegram", "4242", "blocked")  # openclaw users block
    model.gate.set()  # the first answer is written after the block: it is not sent either
    await daemon.gateway.wait_idle()
    assert tg.texts("4242") == [] and len(model.prompts) == 1
    assert await daemon.store.pending_inbound() == []  # marked failed: not answered after a restart
    await daemon.stop()


async def test_a_data_dir_open_to_others_is_made_private_at_start(tmp_path, caplog):
    (tmp_path / "data").mkdir(mode=0o755)  # as an older version, or an admin, left it
    (tmp_path / "data").chmod(0o755)
    daemon, _ = await started(tmp_path, ScriptedModel(lambda m: "x"))
    await daemon.stop()
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
    assert "open to other users (mode 755)" in caplog.text


async def test_a_user_taken_out_of_access_allow_is_no_longer_let_in(tmp_path):
    """The config's lists decide each time and are not copied into the store, so a restart
    with a user removed from `allow` takes their access away (they are asked to pair)."""
    model = ScriptedModel(lambda m: "hello friend")
    path = tmp_path / "openclaw.toml"
    config(tmp_path)  # writes the file
    listed = path.read_text().replace('dm_policy = "pairing"', 'allow = ["telegram:77"]\n'
                                      'dm_policy = "pairing"')
    for allowed in (True, False):
        path.write_text(listed if allowed else listed.replace('allow = ["telegram:77"]', ""))
        conn = RecordingConnector("telegram")
        daemon = Daemon(load_config(path), model=model, connectors=[conn])
        await daemon.start()
        try:
            await conn.handler(msg("hi", user="77", channel="telegram"))
            await daemon.gateway.wait_idle()
            [answer] = conn.texts("77")
            assert (answer == "hello friend") is allowed and ("pairing code" in answer) is not allowed
        finally:
            await daemon.stop()
    assert len(model.prompts) == 1


async def test_tool_calls_good_malformed_and_unknown_go_back_to_the_model(tmp_path):
    script = iter([
        '<tool_call>{"name": "clock", "arguments": {"timezone": "UTC"}}</tool_call>',
        '<tool_call>{"name": "clock", "arguments": {oops}</tool_call>',
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        "It is late.",
    ])
    model = ScriptedModel(lambda m: next(script))
    daemon, conn = await started(tmp_path, model)
    assert answer(await say(daemon, conn, "what time is it?")) == "It is late."
    final_prompt = model.prompts[-1]
    tool_results = [m["content"] for m in final_prompt if m["role"] == "tool"]
    assert "UTC" in tool_results[0] and not tool_results[0].startswith("error")
    assert tool_results[1].startswith("error:") and "JSON" in tool_results[1]
    assert tool_results[2].startswith("error: there is no tool named 'rm_rf'")
    assert "clock" in tool_results[2]
    await daemon.stop()


async def test_the_step_limit_ends_with_a_clear_message(tmp_path):
    model = ScriptedModel(lambda m: '<tool_call>{"name": "clock", "arguments": {}}</tool_call>')
    daemon, conn = await started(tmp_path, model, "max_steps = 3")
    reply = await say(daemon, conn, "loop forever")
    assert "stopped after 3 tool steps" in reply
    assert len(model.prompts) == 3
    await daemon.stop()


async def test_an_engine_error_becomes_an_apology_and_the_conversation_goes_on(tmp_path):
    def broken(messages):
        raise RuntimeError("CUDA fell over")

    model = ScriptedModel(broken)
    daemon, conn = await started(tmp_path, model)
    assert "Sorry" in await say(daemon, conn, "hello")
    model.reply = lambda m: "working again"
    assert await say(daemon, conn, "hello?") == "working again"
    await daemon.stop()


async def test_drain_finishes_the_running_reply_and_keeps_queued_messages_for_restart(tmp_path):
    model = ScriptedModel(lambda m: "answer to " + last_user(m), chunk=1, delay=0.01)
    daemon, conn = await started(tmp_path, model)
    await conn.handler(msg("first"))
    await conn.handler(msg("second"))
    await until(lambda: model.prompts)
    await daemon.stop(drain_timeout=10)
    assert conn.texts() == ["answer to first"]  # the in-flight reply finished
    store = await Store.open(config(tmp_path).store.url)
    pending = await store.pending_inbound()
    assert [e.text for e in pending] == ["second"]  # not lost, not half-answered
    await store.close()
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "answer to " + last_user(m)))
    await daemon.gateway.wait_idle()
    assert conn.texts() == ["answer to second"]  # answered after the restart
    await daemon.stop()


async def test_drain_timeout_aborts_a_stuck_reply_and_it_is_answered_after_restart(tmp_path):
    model = ScriptedModel(lambda m: "never finishes")
    daemon, conn = await started(tmp_path, model)
    model.gate = asyncio.Event()
    await conn.handler(msg("stuck question"))
    await until(lambda: model.prompts)
    await daemon.stop(drain_timeout=0.2)
    assert conn.texts() == []
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "done: " + last_user(m)))
    await daemon.gateway.wait_idle()
    assert conn.texts() == ["done: stuck question"]
    conv = await daemon.store.active_conversation("terminal:local", "local")
    users = [m for m in await daemon.store.list_messages(conv.id) if m.role == "user"]
    assert len(users) == 1  # the re-run did not store the question twice
    await daemon.stop()


async def test_status_and_help_commands_answer_without_the_model(tmp_path):
    model = ScriptedModel(lambda m: "x")
    tg = RecordingConnector("telegram")
    daemon, conn = await started(tmp_path, model, also=(tg,))
    status = await say(daemon, conn, "/status")
    assert "Tokens used today" in status and "scripted" in status
    assert "/new" in await say(daemon, conn, "/help")
    assert model.prompts == []
    await daemon.store.add_usage("terminal:local", 1000, 234)
    await daemon.store.set_user_status("telegram", "99", "allowed")  # an ordinary user
    assert status.endswith("Tokens used today: you 0, everyone 0")  # the owner sees everyone's
    theirs = await say(daemon, tg, "/status", user="99")
    assert theirs.endswith("Tokens used today: you 0"), theirs  # others' use is not theirs to see
    assert (await say(daemon, conn, "/status")).endswith("you 1234, everyone 1234")
    in_group = await say(daemon, conn, "/status", chat="group-1", is_group=True)
    assert in_group.endswith("Tokens used today: you 1234"), in_group  # not for the group's eyes
    events = await daemon.store.pending_inbound()
    assert events == []
    await daemon.stop()


async def test_new_starts_a_fresh_conversation(tmp_path):
    daemon, conn = await started(tmp_path, ScriptedModel(history_echo))
    await say(daemon, conn, "one")
    assert await say(daemon, conn, "/new") == "Started a new conversation."
    assert await say(daemon, conn, "two") == "you said 1 things: two"
    await daemon.stop()


@pytest.mark.parametrize("status", [InboundStatus.PROCESSED])
async def test_every_answered_message_is_marked_processed(tmp_path, status):
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "fine"))
    await say(daemon, conn, "hello")
    assert await daemon.store.pending_inbound() == []
    await daemon.stop()


class EngineLikeModel(ScriptedModel):
    """Refuses a prompt that does not fit, as engine.add_request does."""

    async def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                       cache_salt=None):
        if len(self.encode_chat(prompt, tools)) >= self.max_model_len:
            raise ValueError("the prompt has too many tokens")
        async for out in super().generate(prompt, params, request_id, tools=tools):
            yield out


async def test_a_message_too_long_for_the_context_is_refused_and_the_chat_goes_on(tmp_path):
    def reply(messages):
        if "You write the memory" in messages[0]["content"]:
            return "SUMMARY"
        return "ok " + last_user(messages)[:10]

    model = EngineLikeModel(reply, max_model_len=200)
    daemon, conn = await started(tmp_path, model, "reply_max_tokens = 40\ncompaction_keep_messages = 2")
    assert "too long" in await say(daemon, conn, "word " * 300)
    assert await say(daemon, conn, "hi") == "ok hi"
    assert await say(daemon, conn, "hello again") == "ok hello agai"
    conv = await daemon.store.active_conversation("terminal:local", "local")
    assert all("word word" not in m.content for m in await daemon.store.list_messages(conv.id))
    await daemon.stop()


async def test_recovery_skips_users_blocked_in_config_since(tmp_path):
    cfg = config(tmp_path)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    store = await Store.open(cfg.store.url)
    spammer = "13"  # a Telegram user
    await store.set_user_status("telegram", spammer, "allowed")
    await store.record_inbound("telegram", "x1", f"telegram:{spammer}", spammer, "spam spam")
    await store.close()
    conn = RecordingConnector("telegram")
    model = ScriptedModel(lambda m: "answered " + last_user(m))
    daemon = Daemon(config(tmp_path, "").model_copy(update={"access": cfg.access.model_copy(
        update={"blocked": [f"telegram:{spammer}"]})}), model=model, connectors=[conn])
    await daemon.start()
    await daemon.gateway.wait_idle()
    assert conn.texts(spammer) == [] and model.prompts == []
    await daemon.stop()


async def test_a_turn_cut_after_its_tool_step_is_resumed_without_a_second_user_message(tmp_path):
    calls = itertools.count()
    model = ScriptedModel(lambda m: '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
                          if next(calls) == 0 else "done")
    daemon, conn = await started(tmp_path, model)
    gate = asyncio.Event()
    generate = model.generate

    async def second_call_hangs(prompt, *args, **kwargs):
        if model.prompts:
            await gate.wait()
        async for out in generate(prompt, *args, **kwargs):
            yield out

    model.generate = second_call_hangs
    await conn.handler(msg("what time is it"))
    await until(lambda: len(model.prompts) >= 1)
    await asyncio.sleep(0.2)  # the tool ran and its result was stored; the next call hangs
    await daemon.stop(drain_timeout=0.2)
    daemon, conn = await started(tmp_path, ScriptedModel(lambda m: "final"))
    await daemon.gateway.wait_idle()
    assert conn.texts() == ["final"]
    conv = await daemon.store.active_conversation("terminal:local", "local")
    roles = [m.role for m in await daemon.store.list_messages(conv.id)]
    assert roles.count("user") == 1
    await daemon.stop()


async def test_a_context_budget_with_no_room_for_a_prompt_stops_the_start(tmp_path):
    with pytest.raises(ValueError, match="agent.context_tokens"):
        await started(tmp_path, ScriptedModel(lambda m: "x"),
                      "context_tokens = 100\nreply_max_tokens = 80")


async def test_admin_port_serves_health_and_metrics_after_a_turn(tmp_path):
    def reply(messages):  # the clock, a tool the model made up, then an answer
        return {"user": '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
                        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'}.get(
            messages[-1]["role"], "fine")

    model = ScriptedModel(reply)
    cfg = config(tmp_path)
    cfg = cfg.model_copy(update={"admin": cfg.admin.model_copy(update={"enabled": True, "port": 0})})
    conn = RecordingConnector()
    daemon = Daemon(cfg, model=model, connectors=[conn])
    await daemon.start()
    await say(daemon, conn, "hello")

    async def get(path: str) -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.admin.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        body = (await reader.read()).decode()
        writer.close()
        return body

    health = await get("/healthz")
    assert " 200 " in health.splitlines()[0] and '"status": "ok"' in health
    metrics = await get("/metrics")
    for series in ("openclaw_inbound_messages_total", "openclaw_time_to_first_token_seconds_count 2",
                   'openclaw_time_to_first_token_seconds_bucket{le="+Inf"} 2',
                   'openclaw_turn_seconds_bucket{le="+Inf"} 1',
                   'openclaw_turns_total{result="answered"} 1',
                   'openclaw_tool_calls_total{decision="allowed",skill="clock"} 1',
                   # A name the model made up is no label of its own: the set stays bounded.
                   'openclaw_tool_calls_total{decision="unknown",skill="(unknown)"} 1',
                   "openclaw_tool_seconds_count 1", "openclaw_prefix_cache_hit_ratio",
                   "openclaw_queue_length 0", "openclaw_kv_cache_usage", "openclaw_tokens_per_second",
                   'openclaw_event_loop_lag_seconds_bucket{le="0.001"}'):
        assert series in metrics, series
    await daemon.stop()


async def test_a_notice_stored_before_a_crash_is_sent_after_restart_without_the_model(tmp_path):
    from openclaw.store import Store

    store = await Store.open(config(tmp_path).store.url)
    await store.set_user_status("terminal", "local", "allowed")
    await store.record_inbound("terminal", "v1", "terminal:local", "local", "",
                               payload={"notice": "Sorry, I cannot open a voice note yet."})
    await store.close()
    model = ScriptedModel(lambda m: "model answer")
    daemon, conn = await started(tmp_path, model)
    try:
        await until(lambda: conn.texts("local"))
        await daemon.gateway.wait_idle()
        assert conn.texts("local") == ["Sorry, I cannot open a voice note yet."] and model.prompts == []
    finally:
        await daemon.stop()


async def test_a_command_stored_before_a_crash_is_answered_as_a_command(tmp_path):
    from openclaw.store import Store

    store = await Store.open(config(tmp_path).store.url)
    await store.set_user_status("terminal", "local", "allowed")
    await store.record_inbound("terminal", "c1", "terminal:local", "local", "/help")
    await store.close()
    model = ScriptedModel(lambda m: "model answer")
    daemon, conn = await started(tmp_path, model)
    try:
        await until(lambda: conn.texts("local"))
        assert conn.texts("local")[0].startswith("Commands:") and model.prompts == []
    finally:
        await daemon.stop()


async def test_a_second_daemon_on_the_same_data_dir_stops_before_touching_the_store(tmp_path):
    from openclaw.datadir import DaemonRunning

    first, _ = await started(tmp_path, ScriptedModel(history_echo))
    try:
        second_conn = RecordingConnector()
        second = Daemon(config(tmp_path), model=ScriptedModel(history_echo), connectors=[second_conn])
        with pytest.raises(DaemonRunning, match=r"another openclaw daemon \(pid \d+\) is running"):
            await second.start()
        assert second.store is None and second_conn.handler is None
    finally:
        await first.stop()
    third, _ = await started(tmp_path, ScriptedModel(history_echo))  # the claim ended with stop()
    await third.stop()


async def test_whether_data_dir_is_claimed_is_read_without_taking_it(tmp_path):
    from openclaw.datadir import data_dir_claimed

    assert not data_dir_claimed(tmp_path / "data")
    daemon, _ = await started(tmp_path, ScriptedModel(history_echo))
    try:
        assert data_dir_claimed(daemon.config.data_dir)
    finally:
        await daemon.stop()
    assert not data_dir_claimed(daemon.config.data_dir)  # stopped: the pid is gone from the file
    (daemon.config.data_dir / "daemon.lock").write_text("999999999\n")  # a holder that died
    assert not data_dir_claimed(daemon.config.data_dir)


def admin_on(tmp_path, port: int):
    cfg = config(tmp_path)
    return cfg.model_copy(update={"admin": cfg.admin.model_copy(update={"enabled": True, "port": port})})


async def test_a_chat_goes_on_without_its_admin_port_when_something_holds_it(tmp_path, caplog):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conn = RecordingConnector()
        daemon = Daemon(admin_on(tmp_path, port), model=ScriptedModel(lambda m: "fine"),
                        connectors=[conn], admin_optional=True)
        await daemon.start()
        try:
            assert daemon.admin is None
            assert await say(daemon, conn, "hello") == "fine"
            [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
            assert warning.startswith(f"[admin] port {port} on 127.0.0.1 is in use")
            assert "[admin] port = N" in warning and "[admin] enabled = false" in warning
        finally:
            await daemon.stop()


async def test_the_service_does_not_start_with_its_admin_port_taken_and_names_the_key(tmp_path):
    import socket

    from openclaw.admin import AdminPortInUse

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = Daemon(admin_on(tmp_path, port), model=ScriptedModel(lambda m: "fine"))
        try:
            with pytest.raises(AdminPortInUse) as refused:
                await daemon.start()
        finally:
            await daemon.stop(drain_timeout=0)
    assert str(refused.value) == (f"[admin] port {port} on 127.0.0.1 is in use (another openclaw? "
                                  "see `ss -ltnp`); set [admin] port or [admin] enabled = false")


async def test_a_stop_says_what_it_finishes_and_for_how_long(tmp_path, caplog):
    caplog.set_level("INFO", logger="openclaw.gateway")
    model = ScriptedModel(lambda m: "answer to " + last_user(m))
    daemon, conn = await started(tmp_path, model)
    model.gate = asyncio.Event()
    await conn.handler(msg("first"))
    await until(lambda: model.prompts)
    await conn.handler(msg("second"))
    stopping = asyncio.create_task(daemon.stop(drain_timeout=30))
    await until(lambda: "stopping:" in caplog.text)
    model.gate.set()
    await stopping
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopping:")]
    assert said == ("stopping: finishing 1 running conversation(s), up to 30 s; 1 queued "
                    "message(s) wait for the next start")
    assert conn.texts() == ["answer to first"]


def lane_workers() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("lane ")]


async def test_an_idle_lane_ends_with_its_worker_and_the_chat_goes_on_in_its_conversation(
        tmp_path, monkeypatch):
    monkeypatch.setattr(lanes_module, "LANE_IDLE_S", 0)  # a lane ends as soon as it is idle
    daemon, conn = await started(tmp_path, ScriptedModel(history_echo))
    gateway = daemon.gateway
    await conn.handler(msg("my name is Ada"))
    [worker] = [lane.worker for lane in gateway.lanes.by_key.values()]
    await gateway.wait_idle()
    await until(lambda: not gateway.lanes.by_key)
    assert worker.done() and lane_workers() == []
    assert gateway.queue_length() == 0 and "queued messages: 0" in await say(daemon, conn, "/status")
    # A new lane for the next message, which looks the conversation up again: the same one.
    assert await say(daemon, conn, "what is my name?") == \
        "you said 2 things: my name is Ada | what is my name?"
    await daemon.stop()


async def test_a_message_queued_as_its_lane_gives_up_waiting_is_answered_not_lost(tmp_path,
                                                                                  monkeypatch):
    daemon, conn = await started(tmp_path, ScriptedModel(history_echo))
    gateway = daemon.gateway
    real_next_job, idle_over = gateway.lanes.next_job, asyncio.Event()

    async def next_job(lane):  # an idle lane's wait ends when the test says, as its timeout would
        if lane.queue.empty():
            await idle_over.wait()
            idle_over.clear()
            return None
        return await real_next_job(lane)

    monkeypatch.setattr(gateway.lanes, "next_job", next_job)
    assert await say(daemon, conn, "my name is Ada") == "you said 1 things: my name is Ada"
    [lane] = gateway.lanes.by_key.values()
    await conn.handler(msg("what is my name?"))  # queued in the lane, whose wait is ending
    idle_over.set()
    await until(lambda: len(conn.texts()) == 2)
    assert conn.texts()[-1] == "you said 2 things: my name is Ada | what is my name?"
    assert list(gateway.lanes.by_key.values()) == [lane]  # it went on, the same lane
    idle_over.set()  # now idle with nothing queued: it ends
    await until(lambda: not gateway.lanes.by_key)
    assert lane.worker.done() and lane_workers() == []
    assert await say(daemon, conn, "and now?") == \
        "you said 3 things: my name is Ada | what is my name? | and now?"
    await daemon.stop()
