"""/sh and /run: a skill called by the user without the model, through the same policy, approval,
sandbox and audit as the model's calls; the answer is the skill's output, literal, or why it did
not run."""

from __future__ import annotations

import re
from pathlib import Path

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.gateway.direct import NOT_REPEATED
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

# Telegram users: one whose shell calls wait for approval, one of the built-in role "user" (no
# shell), and a developer whose shell runs unasked.
CAREFUL, PLAIN, DEV = "101", "102", "103"

CONFIG = """
[skills]
enabled = ["clock", "shell"]
[admin]
enabled = false
[access]
admins = ["terminal:local"]
allow = ["telegram:101", "telegram:102", "telegram:103"]
roles = { "telegram:101" = "careful", "telegram:103" = "dev" }
[roles.careful]
skills = ["shell"]
approval = ["shell"]
[roles.dev]
skills = ["shell", "clock"]
[roles.user]
skills = ["clock"]
"""


def never_called(messages: list[dict]) -> str:
    raise AssertionError(f"the model was asked: {messages[-1]}")


async def start(tmp_path: Path) -> tuple[Daemon, RecordingConnector, ScriptedModel]:
    path = tmp_path / "openclaw.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n' + CONFIG)
    conn, model = RecordingConnector("telegram"), ScriptedModel(never_called)
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    await daemon.start()
    return daemon, conn, model


async def ask(daemon: Daemon, conn: RecordingConnector, text: str, user: str, **kw) -> str:
    before = len(conn.texts(user))
    await conn.handler(msg(text, user=user, channel="telegram", **kw))
    await daemon.gateway.wait_idle()
    assert len(conn.texts(user)) == before + 1, conn.texts(user)[before:]
    return conn.texts(user)[-1]


def workspace(daemon: Daemon, user: str) -> Path:
    return daemon.config.data_dir / f"workspaces/telegram-{user}"


async def test_sh_runs_in_the_sandbox_is_audited_and_the_model_is_never_asked(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        reply = await ask(daemon, conn, "/sh echo *bold* > made.txt; cat made.txt; pwd", DEV)
        # Literal: the output as printed, in a block no app's Markdown changes.
        assert "exit status 0" in reply and "*bold*" in reply and "/workspace" in reply
        assert reply.startswith("```")
        assert (workspace(daemon, DEV) / "made.txt").read_text() == "*bold*\n"
        [row] = await daemon.store.list_audit()
        assert (row.user, row.skill, row.decision, row.exit_status) == (
            f"telegram:{DEV}", "shell", "allowed", 0)
        assert row.arguments == {"command": "echo *bold* > made.txt; cat made.txt; pwd"}
        assert model.prompts == []
        # Not part of what the model reads later: no conversation holds the command or its output.
        conv = await daemon.store.active_conversation(f"telegram:{DEV}", DEV, "telegram")
        assert await daemon.store.list_messages(conv.id) == []
    finally:
        await daemon.stop()


async def test_a_role_without_shell_is_denied_and_told_what_it_may_use(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        reply = await ask(daemon, conn, "/sh touch nope.txt", PLAIN)
        assert reply.startswith(f"denied: the role 'user' of telegram:{PLAIN} may not use 'shell'")
        assert "it may use: clock" in reply
        assert not (workspace(daemon, PLAIN) / "nope.txt").exists()
        [row] = await daemon.store.list_audit()
        assert (row.skill, row.decision) == ("shell", "denied")
        assert model.prompts == []
    finally:
        await daemon.stop()


async def test_sh_that_needs_approval_asks_and_runs_only_after_approve(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        await conn.handler(msg("/sh echo yes > approved.txt; echo done", user=CAREFUL,
                               channel="telegram"))
        await until(lambda: any("/approve" in t for t in conn.texts(CAREFUL)))
        request = conn.texts(CAREFUL)[-1]
        assert "run the shell command: echo yes > approved.txt; echo done" in request
        proof = workspace(daemon, CAREFUL) / "approved.txt"
        assert not proof.exists()
        number = int(re.search(r"/approve (\d+)", request)[1])
        # The lane waits for the answer; the gateway does not: the /approve gets through.
        await conn.handler(msg(f"/approve {number}", user=CAREFUL, channel="telegram"))
        await daemon.gateway.wait_idle()
        assert proof.read_text() == "yes\n"
        assert conn.texts(CAREFUL)[-2] == f"Approved: shell #{number} runs now."
        assert "exit status 0" in conn.texts(CAREFUL)[-1] and "done" in conn.texts(CAREFUL)[-1]
        # Denied: it never runs, and says so.
        await conn.handler(msg("/sh echo no > denied.txt", user=CAREFUL, channel="telegram"))
        await until(lambda: "/approve" in conn.texts(CAREFUL)[-1])
        number = int(re.search(r"/approve (\d+)", conn.texts(CAREFUL)[-1])[1])
        await conn.handler(msg(f"/deny {number}", user=CAREFUL, channel="telegram"))
        await daemon.gateway.wait_idle()
        assert conn.texts(CAREFUL)[-1] == "the user denied this shell call; it did not run"
        assert not (workspace(daemon, CAREFUL) / "denied.txt").exists()
        assert [r.decision for r in await daemon.store.list_audit()] == ["rejected", "allowed"]
        assert model.prompts == []
    finally:
        await daemon.stop()


async def test_run_takes_json_or_key_value_arguments(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        reply = await ask(daemon, conn, '/run clock {"timezone": "Asia/Tokyo"}', DEV)
        assert "Asia/Tokyo" in reply and "+09:00" in reply
        reply = await ask(daemon, conn, "/run clock timezone=Europe/Paris", DEV)
        assert "Europe/Paris" in reply
        reply = await ask(daemon, conn, "/run shell command='echo two words'", DEV)
        assert "two words" in reply and "exit status 0" in reply
        reply = await ask(daemon, conn, "/run clock", DEV)  # no arguments: {}
        assert "(" in reply
        calls = [(r.skill, r.arguments, r.decision) for r in reversed(await daemon.store.list_audit())]
        assert calls == [("clock", {"timezone": "Asia/Tokyo"}, "allowed"),
                         ("clock", {"timezone": "Europe/Paris"}, "allowed"),
                         ("shell", {"command": "echo two words"}, "allowed"),
                         ("clock", {}, "allowed")]
        assert model.prompts == []
    finally:
        await daemon.stop()


async def test_bad_json_unknown_skills_and_bad_arguments_get_clear_errors(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        reply = await ask(daemon, conn, '/run clock {"timezone": ', DEV)
        assert reply.startswith("The arguments are not valid JSON") and "/run SKILL" in reply
        reply = await ask(daemon, conn, "/run clock Europe/Paris", DEV)
        assert reply.startswith("'Europe/Paris' is not key=value.")
        reply = await ask(daemon, conn, "/run shell command='unclosed", DEV)
        assert reply.startswith("The arguments cannot be read")
        assert (await ask(daemon, conn, "/run", DEV)).startswith("Use /run SKILL")
        assert await ask(daemon, conn, "/sh", DEV) == "Use /sh COMMAND, e.g. /sh ls -la"
        reply = await ask(daemon, conn, "/run weather city=Paris", DEV)
        assert reply == "there is no tool named 'weather'; available tools: clock, shell"
        reply = await ask(daemon, conn, '/run shell {"cmd": "ls"}', DEV)
        assert reply.startswith("bad arguments for shell:") and "command" in reply
        assert '"required"' in reply  # the schema, to write it right
        # Only the calls reached the executor (and its audit), as a model's would.
        assert [(r.skill, r.decision) for r in reversed(await daemon.store.list_audit())] == [
            ("weather", "unknown"), ("shell", "invalid")]
        assert model.prompts == []
    finally:
        await daemon.stop()


async def test_sh_in_a_group_is_the_senders_own_call(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        group = "-500"
        await conn.handler(msg("/sh echo hello group", user=DEV, chat=group, channel="telegram",
                               is_group=True))
        await daemon.gateway.wait_idle()
        assert "hello group" in conn.texts(group)[-1]
        [row] = await daemon.store.list_audit()
        assert row.user == f"telegram:{DEV}"
    finally:
        await daemon.stop()


async def test_a_direct_command_left_by_a_stop_is_not_run_again(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        await daemon.store.record_inbound("telegram", "m-left", f"telegram:{DEV}", DEV,
                                          "/sh echo again >> twice.txt", payload={})
    finally:
        await daemon.stop()
    daemon, conn, model = await start(tmp_path)
    try:
        await daemon.gateway.wait_idle()
        await until(lambda: conn.texts(DEV))
        assert conn.texts(DEV)[-1] == NOT_REPEATED.format(command="/sh")
        assert not (workspace(daemon, DEV) / "twice.txt").exists()
    finally:
        await daemon.stop()


async def test_stop_withdraws_a_direct_command_waiting_for_approval(tmp_path):
    daemon, conn, model = await start(tmp_path)
    try:
        await conn.handler(msg("/sh echo late > late.txt", user=CAREFUL, channel="telegram"))
        await until(lambda: any("/approve" in t for t in conn.texts(CAREFUL)))
        number = int(re.search(r"/approve (\d+)", conn.texts(CAREFUL)[-1])[1])
        assert await ask(daemon, conn, "/stop", CAREFUL) == "Stopped."
        assert await ask(daemon, conn, f"/approve {number}", CAREFUL) == (
            f"There is no request {number} waiting for you.")
        assert not (workspace(daemon, CAREFUL) / "late.txt").exists()
    finally:
        await daemon.stop()
