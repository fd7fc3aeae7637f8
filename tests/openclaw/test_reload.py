"""Reloading the config under a running daemon: roles, skills and access change at the next message;
a config that does not load changes nothing; what needs a restart is said and not applied; SIGHUP
and `openclaw reload` (the real signal, the real command) reach the daemon and report back. Real
daemon and SQLite; a scripted model that records which tools it is offered."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from openclaw import cli, reload
from openclaw.cli.common import data_dir_held
from openclaw.cli.reload import cmd_reload
from openclaw.config import Config, ConfigError, data_dir_of, load_config
from openclaw.daemon import Daemon
from openclaw.datadir import Holder, lock_holder
from openclaw.gateway.contract import InboundMessage
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.replies import answer
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

ANN = "1001"  # a Telegram user: "telegram:1001" in the file (the terminal's one user is the console)

BASE = """
data_dir = "{data}"
[admin]
enabled = false
[engine]
max_num_seqs = 8
[access]
admins = ["terminal:local"]
allow = ["telegram:1001"]
[skills]
enabled = ["clock", "shell"]
[roles.user]
skills = {user_skills}
"""


class OfferedTools(ScriptedModel):
    """Answers "ok"; remembers, per message text, the tools the model was offered with it."""

    def __init__(self) -> None:
        super().__init__(lambda messages: "ok")
        self.offered: dict[str, list[str]] = {}

    async def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                       cache_salt=None):
        self.offered[prompt[-1]["content"]] = sorted(t["function"]["name"] for t in tools or [])
        async for out in super().generate(prompt, params, request_id, tools=tools):
            yield out


def write(path: Path, user_skills: str = '["clock"]', extra: str = "") -> None:
    path.write_text(BASE.format(data=path.parent / "data", user_skills=user_skills) + extra)


@asynccontextmanager
async def running(tmp_path: Path, **kw) -> AsyncIterator[tuple[Daemon, RecordingConnector,
                                                                OfferedTools, Path]]:
    path = tmp_path / "openclaw.toml"
    write(path)
    conn, model = RecordingConnector("telegram"), OfferedTools()
    daemon = Daemon(load_config(path), model=model, connectors=[conn], **kw)
    await daemon.start()
    try:
        yield daemon, conn, model, path
    finally:
        await daemon.stop()


def from_ann(text: str) -> InboundMessage:
    return msg(text, user=ANN, channel="telegram")


async def ask(daemon: Daemon, conn: RecordingConnector, text: str) -> None:
    await conn.handler(from_ann(text))
    await daemon.gateway.wait_idle()


async def test_a_role_granted_a_skill_is_offered_it_at_the_next_message(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        await ask(daemon, conn, "before")
        write(path, user_skills='["clock", "shell"]')
        outcome = await daemon.reload()
        assert (outcome.ok, outcome.applied, outcome.waiting) == (True, ["roles"], [])
        await ask(daemon, conn, "after")
        assert model.offered == {"before": ["clock"], "after": ["clock", "shell"]}
        assert outcome.summary() == f"config reloaded from {path}: [roles] in effect now"


async def test_access_lists_follow_the_reload_for_users_already_admitted(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        await ask(daemon, conn, "hello")  # ann is let in by the config, and remembered as such
        assert conn.texts(ANN) == ["ok"]
        path.write_text(path.read_text().replace('allow = ["telegram:1001"]',
                                                 'allow = []\nblocked = ["telegram:1001"]'))
        assert (await daemon.reload()).applied == ["access"]
        await ask(daemon, conn, "still there?")
        assert conn.texts(ANN) == ["ok"]  # no answer, not even a pairing code: blocked
        assert "still there?" not in model.offered
        path.write_text(path.read_text().replace('blocked = ["telegram:1001"]', ""))
        await daemon.reload()
        await ask(daemon, conn, "and now?")  # neither listed nor paired: a pairing code
        assert "pairing code" in conn.texts(ANN)[-1] and "and now?" not in model.offered


async def test_a_config_that_does_not_load_changes_nothing_and_names_the_key(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        write(path, user_skills='["clock", "shel"]')  # a typo in a role's list
        outcome = await daemon.reload()
        assert not outcome.ok and outcome.applied == []
        assert any("roles.user.skills: unknown skill(s) ['shel']" in p for p in outcome.problems)
        assert outcome.summary().startswith(f"config not reloaded from {path}; the daemon goes on")
        logged = outcome.summary(one_line=True)  # one journal entry
        assert "\n" not in logged and ":;" not in logged and "has: roles.user.skills: unknown" in logged
        path.write_text("[agent\n")  # not even TOML
        outcome = await daemon.reload()
        assert not outcome.ok and "invalid TOML" in outcome.problems[0]
        await ask(daemon, conn, "served as before")
        assert model.offered["served as before"] == ["clock"] and conn.texts(ANN) == ["ok"]
        write(path)  # as it was
        assert (await daemon.reload()).ok
        # What an alert on /metrics watches: a reload that failed.
        assert daemon.metrics.value("openclaw_config_reloads_total", result="failed") == 2
        assert 'openclaw_config_reloads_total{result="ok"} 1' in daemon.metrics.render()


async def test_a_change_that_needs_a_restart_is_reported_and_waits_for_it(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        old_data_dir = daemon.config.data_dir
        path.write_text(path.read_text().replace("max_num_seqs = 8", "max_num_seqs = 16")
                        .replace("/data", "/elsewhere") + '\n[agent]\nreply_max_tokens = 300\n')
        outcome = await daemon.reload()
        # The default database lives in data_dir: it would move too.
        assert (outcome.ok, outcome.applied, outcome.waiting) == (True, ["agent"],
                                                                  ["data_dir", "engine", "store"])
        assert "only after a restart of the daemon: data_dir, [engine], [store]" in outcome.summary()
        assert daemon.config.engine.max_num_seqs == 8 and daemon.config.data_dir == old_data_dir
        assert daemon.config.agent.reply_max_tokens == 300
        assert daemon.gateway.agent.settings.reply_max_tokens == 300


async def test_a_model_that_is_not_there_is_refused_now_not_at_the_next_start(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        gone = tmp_path / "models" / "nothere"
        path.write_text(path.read_text().replace("max_num_seqs = 8", f'max_num_seqs = 8\nmodel = "{gone}"')
                        .replace('skills = ["clock"]', 'skills = ["clock", "shell"]'))
        outcome = await daemon.reload()
        assert not outcome.ok and outcome.problems == [
            f"[engine]: model '{gone}': expected a Hugging Face model folder (config.json + "
            "*.safetensors) or a .gguf file; the daemon would not start with it"]
        await ask(daemon, conn, "still")  # and nothing else in that file took effect either
        assert model.offered["still"] == ["clock"]


async def test_a_grant_over_the_data_dir_in_use_is_refused_even_when_data_dir_moves(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        used = daemon.config.data_dir
        path.write_text(path.read_text().replace("/data", "/elsewhere")
                        + f'read_only = ["{used}"]\n')  # fine for the new data_dir, not the one in use
        outcome = await daemon.reload()
        assert not outcome.ok and "roles.user.read_only[0]" in outcome.problems[0]


def test_every_section_is_either_reloadable_or_restart_only():
    # A new section must be placed on one side: otherwise a reload would silently ignore it.
    assert sorted(reload.RELOADABLE + reload.AT_RESTART) == sorted(Config.model_fields)


async def test_sighup_and_openclaw_reload_reach_the_daemon_and_report_back(tmp_path, monkeypatch,
                                                                           capsys):
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    with notify:
        await sighup_and_reload(tmp_path, notify, capsys)


async def sighup_and_reload(tmp_path: Path, notify: socket.socket, capsys) -> None:
    async with running(tmp_path) as (daemon, conn, model, path):
        assert lock_holder(daemon.config.data_dir) == Holder(os.getpid(), reloads=True)
        write(path, user_skills='["clock", "shell"]')
        reload_command = ["--config", str(path), "reload"]
        status = await asyncio.to_thread(cli.main, reload_command)  # it signals this process
        assert status == 0
        await ask(daemon, conn, "after the signal")
        assert model.offered["after the signal"] == ["clock", "shell"]
        datagrams = []
        while True:
            try:
                datagrams.append(notify.recv(4096).decode())
            except BlockingIOError:
                break
        reloading = [i for i, d in enumerate(datagrams) if d.startswith("RELOADING=1\nMONOTONIC_USEC=")]
        assert reloading and datagrams[reloading[-1] + 1] == "READY=1"
        path.write_text("[agent\n")
        assert await asyncio.to_thread(cli.main, reload_command) == 1  # not even its data_dir
        assert "nothing reloaded, no daemon was asked" in capsys.readouterr().err


async def test_openclaw_reload_reports_a_refused_config_with_a_failing_status(tmp_path, capsys):
    async with running(tmp_path) as (daemon, conn, model, path):
        write(path, user_skills='["clock", "shel"]')  # loads, but the daemon refuses it
        args = argparse.Namespace(config=path)
        assert await asyncio.to_thread(cmd_reload, args) == 1
        assert "unknown skill(s) ['shel']" in capsys.readouterr().err


def test_openclaw_reload_without_a_daemon_says_so(tmp_path, capsys):
    path = tmp_path / "openclaw.toml"
    write(path)
    data = tmp_path / "data"
    data.mkdir()
    # A lock file naming a live process that does not hold the lock (a pid reused since): no
    # signal may go to it.
    (data / "daemon.lock").write_text(f"{os.getppid()}\n")
    assert lock_holder(data) is None
    assert cmd_reload(argparse.Namespace(config=path)) == 1
    assert "no daemon is running with data_dir" in capsys.readouterr().err


def test_lock_holder_is_the_files_pid_only_while_that_process_holds_the_lock(tmp_path):
    lock = tmp_path / "daemon.lock"
    lock.write_text("1\n")
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert lock_holder(tmp_path) is None  # the file names a process that does not hold it
        lock.write_text(f"{os.getpid()} reloads\n")
        assert lock_holder(tmp_path) == Holder(os.getpid(), reloads=True)
    assert lock_holder(tmp_path) is None  # released


def test_openclaw_reload_needs_only_the_data_dir_not_the_services_secrets(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text('data_dir = "state"\n[telegram]\nenabled = true\n'
                    'token = "env:OPENCLAW_TEST_UNSET_TOKEN"\n')
    assert data_dir_of(path) == tmp_path / "state"  # relative to the file, as load_config does
    with pytest.raises(ConfigError, match="OPENCLAW_TEST_UNSET_TOKEN is not set"):
        load_config(path)


async def test_openclaw_reload_never_signals_a_process_that_would_stop_or_die(tmp_path, capsys):
    # A chat's daemon stops on SIGHUP; `users forget` or `db restore` holding the data_dir would
    # die of it. Were either signalled, this test's process would stop or die.
    async with running(tmp_path, hangup_reloads=False) as (daemon, conn, model, path):
        command = ["--config", str(path), "reload"]
        assert await asyncio.to_thread(cli.main, command) == 1
        assert "does not reload its config: an `openclaw chat`" in capsys.readouterr().err
        assert not daemon._stop.is_set()
    with data_dir_held(load_config(path)) as running_one:
        assert running_one is None  # this process holds it, as `users forget` does
        assert await asyncio.to_thread(cli.main, command) == 1


async def test_a_reload_while_the_store_is_asked_leaves_no_blocked_user_listed(tmp_path):
    async with running(tmp_path) as (daemon, conn, model, path):
        asked, go_on = asyncio.Event(), asyncio.Event()
        ensure_user = daemon.store.ensure_user

        async def slow_ensure_user(*args, **kw):
            asked.set()
            await go_on.wait()
            return await ensure_user(*args, **kw)

        daemon.store.ensure_user = slow_ensure_user
        first = asyncio.create_task(conn.handler(from_ann("hello")))  # admitted by the config
        await asyncio.wait_for(asked.wait(), 10)
        path.write_text(path.read_text().replace('allow = ["telegram:1001"]',
                                                 'blocked = ["telegram:1001"]'))
        await daemon.reload()  # while her admission waits on the store
        go_on.set()
        await first
        await daemon.gateway.wait_idle()
        await ask(daemon, conn, "/status")  # blocked now: no answer, not even to a command
        assert "/status" not in " ".join(conn.texts(ANN))
        assert "telegram:1001" not in daemon.gateway.access.listed


def shell_then_echo(messages: list[dict]) -> str:
    if messages[-1]["role"] == "user":
        return '<tool_call>{"name": "shell", "arguments": {"command": "echo ran > ran.txt"}}</tool_call>'
    return "after: " + messages[-1]["content"]


@asynccontextmanager
async def shell_call_waiting_for_approval(path: Path, paired: bool = False) -> AsyncIterator[
        tuple[Daemon, RecordingConnector, str]]:
    """A daemon where ann's shell call waits for her /approve, and the number she would answer."""
    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=ScriptedModel(shell_then_echo), connectors=[conn])
    await daemon.start()
    try:
        if paired:
            await daemon.store.set_user_status("telegram", ANN, "allowed")
        await conn.handler(from_ann("run it"))
        await until(lambda: any("/approve" in t for t in conn.texts(ANN)))
        yield daemon, conn, conn.texts(ANN)[-1].split("/approve ")[1].split()[0]
    finally:
        await daemon.stop()


async def test_a_reload_denies_a_waiting_approval_the_new_role_no_longer_grants(tmp_path):
    path = tmp_path / "openclaw.toml"
    write(path, user_skills='["shell"]', extra='approval = ["shell"]\n')
    async with shell_call_waiting_for_approval(path) as (daemon, conn, number):
        write(path, user_skills='["clock"]')  # shell taken away
        await daemon.reload()
        await asyncio.wait_for(daemon.gateway.wait_idle(), 10)  # the turn ends at once
        assert "denied" in conn.texts(ANN)[-1]
        await conn.handler(from_ann(f"/approve {number}"))
        await daemon.gateway.wait_idle()
        assert conn.texts(ANN)[-1].startswith(f"There is no request {number}")
        assert not (daemon.config.data_dir / f"workspaces/telegram-{ANN}/ran.txt").exists()


class GatedConnector(RecordingConnector):
    """Its start and stop wait for `gate`: a daemon caught in the middle of either."""

    def __init__(self) -> None:
        super().__init__("telegram")
        self.gate, self.waiting = asyncio.Event(), asyncio.Event()

    async def start(self, handler) -> None:
        await super().start(handler)
        self.waiting.set()
        await self.gate.wait()

    async def stop(self) -> None:
        self.waiting.set()
        await self.gate.wait()


async def test_a_sighup_during_start_reloads_once_started_and_ready_comes_after(
        tmp_path, monkeypatch):
    path = tmp_path / "openclaw.toml"
    write(path)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    conn, model = GatedConnector(), OfferedTools()
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    with notify:
        notify.setblocking(False)
        starting = asyncio.create_task(daemon.start())
        try:
            await asyncio.wait_for(conn.waiting.wait(), 10)  # connectors starting: not ready yet
            write(path, user_skills='["clock", "shell"]')
            os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.05)
            with pytest.raises(BlockingIOError):
                notify.recv(4096)  # neither RELOADING=1 nor READY=1 before the start is done
            conn.gate.set()
            await starting
            assert notify.recv(4096) == b"READY=1"
            await ask(daemon, conn, "after the start")
            assert model.offered["after the start"] == ["clock", "shell"]
        finally:
            conn.gate.set()
            await daemon.stop()


async def test_a_sighup_before_the_daemon_has_its_handler_is_kept_for_once_started(tmp_path):
    # `openclaw run` reads its file and imports the daemon (a second or so) before the loop's
    # handler is in; a reload asked for then must neither end the process nor be lost.
    path = tmp_path / "openclaw.toml"
    write(path)
    config = load_config(path)
    reload.keep_early_reloads()
    write(path, user_skills='["clock", "shell"]')  # edited after the file was read
    os.kill(os.getpid(), signal.SIGHUP)  # with the default action this process would end here
    conn, model = RecordingConnector("telegram"), OfferedTools()
    daemon = Daemon(config, model=model, connectors=[conn])
    await daemon.start()
    try:
        await ask(daemon, conn, "after the start")
        assert model.offered["after the start"] == ["clock", "shell"]
        assert reload.read_outcome(config.data_dir).applied == ["roles"]
        assert not reload.asked_early()  # honoured once, not again at the next start
    finally:
        await daemon.stop()


async def test_a_sighup_while_stopping_is_ignored_not_fatal(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="openclaw.daemon")
    path = tmp_path / "openclaw.toml"
    write(path)
    conn = GatedConnector()
    conn.gate.set()
    daemon = Daemon(load_config(path), model=OfferedTools(), connectors=[conn])
    await daemon.start()
    conn.gate.clear()
    conn.waiting.clear()
    stopping = asyncio.create_task(daemon.stop())
    await asyncio.wait_for(conn.waiting.wait(), 10)  # mid-stop: its connectors are stopping
    os.kill(os.getpid(), signal.SIGHUP)  # without a handler now, this process would end here
    await asyncio.sleep(0.05)
    conn.gate.set()
    await stopping
    assert "SIGHUP while stopping: ignored" in caplog.text


async def test_a_chats_sighup_stops_it_instead(tmp_path):
    async with running(tmp_path, hangup_reloads=False) as (daemon, conn, model, path):
        os.kill(os.getpid(), signal.SIGHUP)  # its terminal closed
        await asyncio.wait_for(daemon.wait_stop_requested(), 10)


@pytest.mark.parametrize("blocked_by", ["store", "reload"])
async def test_a_user_blocked_while_an_approval_waits_stops_at_once(tmp_path, blocked_by):
    path = tmp_path / "openclaw.toml"
    write(path, user_skills='["shell"]', extra="approval = [\"shell\"]\napproval_timeout_s = 60\n")
    path.write_text(path.read_text().replace('allow = ["telegram:1001"]', "allow = []"))
    async with shell_call_waiting_for_approval(path, paired=True) as (daemon, conn, number):
        if blocked_by == "store":  # `openclaw users block`
            await daemon.store.set_user_status("telegram", ANN, "blocked")
        else:
            path.write_text(path.read_text().replace("allow = []", 'blocked = ["telegram:1001"]'))
            await daemon.reload()
        sent = len(conn.texts(ANN))
        await conn.handler(from_ann(f"/approve {number}"))  # no longer heard...
        await asyncio.wait_for(daemon.gateway.wait_idle(), 10)  # ...and the turn ends now, not in 60 s
        assert len(conn.texts(ANN)) == sent  # nothing more is sent to them
        assert not (daemon.config.data_dir / f"workspaces/telegram-{ANN}/ran.txt").exists()
        assert [a.decision for a in await daemon.store.list_audit()] == ["rejected"]


async def test_a_secret_missing_from_the_daemons_environment_says_where_it_must_be_set(
        tmp_path, monkeypatch):
    async with running(tmp_path) as (daemon, conn, model, path):
        monkeypatch.delenv("OPENCLAW_TEST_TOKEN", raising=False)
        path.write_text(path.read_text() + '[telegram]\ntoken = "env:OPENCLAW_TEST_TOKEN"\n')
        outcome = await daemon.reload()
        assert not outcome.ok
        assert "OPENCLAW_TEST_TOKEN is not set" in outcome.summary()
        assert "the daemon's own environment, the one it started with" in outcome.summary()


async def test_openclaw_reload_of_another_file_says_the_daemon_read_its_own(tmp_path, capsys):
    async with running(tmp_path) as (daemon, conn, model, path):
        other = tmp_path / "other.toml"
        other.write_text(f'data_dir = "{daemon.config.data_dir}"\n')
        assert await asyncio.to_thread(cli.main, ["--config", str(other), "reload"]) == 0
        captured = capsys.readouterr()
        assert f"the daemon re-read the file it started from, {path}, not {other}" in captured.err
        assert f"config reloaded from {path}" in captured.out
        linked = tmp_path / "linked.toml"  # the same file by another name: nothing to point out
        linked.symlink_to(path)
        assert await asyncio.to_thread(cli.main, ["--config", str(linked), "reload"]) == 0
        assert "re-read the file it started from" not in capsys.readouterr().err


@asynccontextmanager
async def a_reload_between_two_tool_calls(path: Path, change) -> AsyncIterator[
        tuple[Daemon, RecordingConnector, asyncio.Task]]:
    """ann asks; the model calls clock twice in that one turn, and between the two calls the file
    is changed (`change()`) and the daemon reloads it. Yields once the turn is over."""
    clock = '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
    reloads = []

    def reply(messages: list[dict]) -> str:
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        results = [m["content"] for m in messages[last_user:] if m["role"] == "tool"]
        if len(results) == 1:
            change()
            reloads.append(asyncio.get_running_loop().create_task(daemon.reload()))
        return clock if len(results) < 2 else "done: " + " | ".join(results)

    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=ScriptedModel(reply, delay=0.01), connectors=[conn])
    await daemon.start()
    try:
        await ask(daemon, conn, "what time is it, twice?")
        yield daemon, conn, reloads[0]
    finally:
        await daemon.stop()


async def test_a_running_turns_next_tool_call_follows_a_reload_that_takes_the_skill_away(tmp_path):
    path = tmp_path / "openclaw.toml"
    write(path)  # ann's role: clock
    async with a_reload_between_two_tool_calls(
            path, lambda: write(path, user_skills="[]")) as (daemon, conn, reloaded):
        assert (await reloaded).applied == ["roles"]
        assert [(a.skill, a.decision) for a in reversed(await daemon.store.list_audit())] == [
            ("clock", "allowed"), ("clock", "denied")]
        assert "may not use 'clock'" in conn.texts(ANN)[-1]


async def test_a_reload_that_breaks_the_workspace_mid_turn_is_a_tool_error_not_an_apology(
        tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="openclaw.agent.loop")
    path = tmp_path / "openclaw.toml"
    write(path)
    blocker = tmp_path / "a-file"
    blocker.write_text("where the workspaces would go")
    async with a_reload_between_two_tool_calls(
            path, lambda: write(path, extra=f'workspace = "{blocker}/{{user}}"\n')) as (
            daemon, conn, reloaded):
        assert (await reloaded).ok
        reply = answer(conn.texts(ANN)[-1])
        assert reply.startswith("done: ") and "workspace is not usable" in reply
        assert "cannot prepare the workspace of telegram:1001" in caplog.text


async def test_a_skill_md_added_or_removed_in_the_skills_folders_is_said_to_be_in_effect(tmp_path):
    from tests.helpers.skill_md import SKILL_MD

    folder = tmp_path / "skills"
    folder.mkdir()
    async with running(tmp_path) as (daemon, conn, model, path):
        path.write_text(path.read_text().replace('enabled = ["clock", "shell"]',
                                                 f'enabled = ["clock", "shell"]\ndirs = ["{folder}"]'))
        assert (await daemon.reload()).applied == ["skills"]
        (folder / "recipes").mkdir()
        (folder / "recipes" / "SKILL.md").write_text(SKILL_MD)
        # The same [skills] section, and yet another skill: "no change in effect now" was false.
        outcome = await daemon.reload()
        assert (outcome.ok, outcome.applied) == (True, ["skills"])
        assert "recipes" in daemon.gateway.agent.executor.registry.names
        assert (await daemon.reload()).applied == []  # nothing since
        (folder / "recipes" / "SKILL.md").write_text(SKILL_MD.replace("cooking", "baking"))
        assert (await daemon.reload()).applied == ["skills"]  # what the model is told changed
        shutil.rmtree(folder / "recipes")
        assert (await daemon.reload()).applied == ["skills"]
        assert "recipes" not in daemon.gateway.agent.executor.registry.names
