"""The `openclaw` command as users and systemd run it: real processes, real files, the real
embedded model where the reply matters."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from openclaw.cli.doctor import cmd_doctor
from openclaw.store import Store, head_revision, migrate
from sandbox.policy import sandbox_uid
from tests.helpers.cli import run


def test_piped_chat_answers_each_line_and_exits_at_end_of_input(tmp_path):
    proc = run(["chat"], tmp_path,
               stdin="What is the capital of France?\n\n/new\nWhat is the capital of France?\n")
    assert proc.returncode == 0, proc.stderr
    before, marker, after = proc.stdout.partition("Started a new conversation.")
    assert marker, proc.stdout
    assert "Paris" in before  # the blank line was skipped, the question answered
    # What the embedded model is for, said once at the start, where to go for a real one.
    assert proc.stderr.count("model: the embedded SmolLM2-135M-Instruct") == 1
    assert "docs/models.md" in proc.stderr
    assert after.strip()  # and the question after /new answered too
    # everything was kept in SQLite under the default data dir
    assert (tmp_path / ".local/share/openclaw/openclaw.db").exists()


def test_chat_remembers_the_conversation_across_runs(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[agent]\ntemperature = 0.0\n'
                      "reply_max_tokens = 48\n[admin]\nenabled = false\n")
    run(["--config", str(config), "chat"], tmp_path, stdin="My name is Ada.\n")
    # A token set, the switch forgotten: the start says so, with the line to add, and goes on.
    config.write_text(config.read_text() + '[telegram]\ntoken = "env:OPENCLAW_TEST_TOKEN"\n')
    second = run(["--config", str(config), "chat"], tmp_path, stdin="/status\n",
                 OPENCLAW_TEST_TOKEN="123456:" + "A" * 35)
    assert "Tokens used today" in second.stdout
    assert ("telegram: a token is set but the connector is not enabled: add `enabled = true` "
            f"under [telegram] in {config}") in second.stderr

    async def messages():
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db")
        conv = await store.active_conversation("terminal:local", "local")
        rows = await store.list_messages(conv.id)
        await store.close()
        return [(m.role, m.content) for m in rows]

    rows = asyncio.run(messages())
    assert rows[0] == ("user", "My name is Ada.")
    assert rows[1][0] == "assistant" and rows[1][1]


def test_a_malformed_config_names_the_key_and_refuses_to_start(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[access]\ndm_policy = "everyone"\n')
    proc = run(["--config", str(config), "run"], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "access.dm_policy" in proc.stderr and "everyone" in proc.stderr


def test_a_model_that_is_not_there_is_a_config_error_the_unit_does_not_restart(tmp_path):
    # Exit status 2 is the unit's RestartPreventExitStatus: restarting every 5 s cannot fix it.
    (tmp_path / "folder").mkdir()  # a folder without config.json is no model either
    for name, config_json in [("keyless", '{"architectures": ["LlamaForCausalLM"]}'),
                              ("garbled", "{not json")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config_json)
    for model in (tmp_path / "missing.gguf", tmp_path / "folder", tmp_path / "keyless",
                  tmp_path / "garbled"):
        config = tmp_path / "c.toml"
        config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                          f'[engine]\nmodel = "{model}"\n')
        proc = run(["--config", str(config), "run"], tmp_path, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.splitlines()[-1].startswith(f"{config}: [engine]: "), proc.stderr
        assert str(model) in proc.stderr and "Traceback" not in proc.stderr


def test_init_writes_a_starter_config_that_doctor_accepts(tmp_path):
    config = tmp_path / "openclaw.toml"
    assert run(["--config", str(config), "init"], tmp_path, timeout=60).returncode == 0
    assert config.stat().st_mode & 0o777 == 0o600
    again = run(["--config", str(config), "init"], tmp_path, timeout=60)
    assert again.returncode == 1  # never overwrites silently, and says so in one line
    assert again.stderr.strip().splitlines() == [
        f"openclaw init: {config} already exists; keep it, or replace it with `openclaw init --force`"]
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
    assert "✓ config" in doctor.stdout and "✓ database" in doctor.stdout, doctor.stdout


def test_doctor_names_users_whose_sandbox_uids_coincide(tmp_path):
    config = tmp_path / "c.toml"
    # Found by search: crc32 puts these two names on the same uid; one is only in the store.
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nallow = ["telegram:4655"]\n')
    assert sandbox_uid("telegram:4655") == sandbox_uid("telegram:7573")
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
    assert "✓ sandbox uids: 1 user(s), each on a uid of its own" in doctor.stdout, doctor.stdout

    async def admit():
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db") as store:
            await store.ensure_user("telegram", "7573", "Bo")

    asyncio.run(admit())
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
    assert doctor.returncode == 1
    assert (f"✗ sandbox uids shared by users ({sandbox_uid('telegram:4655')}: telegram:4655, "
            "telegram:7573)") in doctor.stdout, doctor.stdout


def test_pairing_approve_and_deny_show_a_strangers_name_escaped(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n')
    name = "\x1b[2J\x1b[Happroved telegram:1 (Admin)\n"  # clears the screen, fakes a line

    async def request_codes():
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db") as store:
            codes = []
            for user in ("1002", "1003"):
                await store.ensure_user("telegram", user, name)
                codes.append(await store.create_pairing_code(f"telegram:{user}"))
            return codes

    for code, answer in zip(asyncio.run(request_codes()), ("approve", "deny"), strict=True):
        said = run(["--config", str(config), "pairing", answer, code], tmp_path, timeout=60)
        assert said.returncode == 0, said.stderr
        assert "\x1b" not in said.stdout and said.stdout.count("\n") == 1, said.stdout
        assert "\\u001b[2J" in said.stdout


def test_pairing_list_and_approve_admit_a_user(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n')

    async def request_code():
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db")
        await store.ensure_user("telegram", "1001", "Ada")
        code = await store.create_pairing_code("telegram:1001")
        await store.close()
        return code

    code = asyncio.run(request_code())
    listing = run(["--config", str(config), "pairing", "list"], tmp_path, timeout=60)
    assert code in listing.stdout and "telegram:1001" in listing.stdout
    approved = run(["--config", str(config), "pairing", "approve", code.lower()], tmp_path, timeout=60)
    assert approved.returncode == 0, approved.stderr
    users = run(["--config", str(config), "users"], tmp_path, timeout=60)
    assert "telegram:1001" in users.stdout and "allowed" in users.stdout
    assert run(["--config", str(config), "pairing", "approve", code], tmp_path,
               timeout=60).returncode == 1  # one use only


def test_doctor_names_a_granted_folder_that_is_missing_or_not_writable_for_users(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[roles.fam]\nskills = ["clock"]\n'
                      f'read_only = ["{tmp_path}/gone"]\nread_write = ["{shared}"]\n')
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
    assert doctor.returncode == 1
    assert f"✗ roles.fam.read_only[0] {tmp_path}/gone: no such folder" in doctor.stdout
    assert (f"✗ roles.fam.read_write[0] {shared}: users cannot write there" in doctor.stdout) \
        is (os.geteuid() == 0), doctor.stdout
    shared.chmod(0o1777)
    (tmp_path / "gone").mkdir()
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
    assert "roles.fam" not in doctor.stdout, doctor.stdout


def test_doctor_names_a_folder_granted_above_a_roles_workspaces(tmp_path, capsys):
    homes = tmp_path / "homes"
    (homes / "shared").mkdir(parents=True)
    (homes / "shared").chmod(0o1777)
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                      f'[roles.fam]\nskills = ["clock"]\nworkspace = "{homes}/{{user}}/oc"\n'
                      f'[roles.helper]\nskills = ["clock"]\nread_only = ["{homes}"]\n'
                      f'read_write = ["{homes}/shared"]\n')

    def doctor() -> tuple[int, str]:
        code = cmd_doctor(argparse.Namespace(config=config, skip_model=True))
        return code, capsys.readouterr().out

    code, out = doctor()
    assert code == 1
    assert (f"✗ roles.helper.read_only[0] {homes} holds the workspace of every user of role fam "
            f"({homes}/{{user}}/oc): users of role helper can read them all") in out, out
    assert "read_write[0]" not in out, out  # beside the workspaces, not above them
    config.write_text(config.read_text().replace(f'read_only = ["{homes}"]', "read_only = []"))
    assert "holds the workspace" not in doctor()[1]


def test_doctor_says_what_run_would_refuse_in_a_connector(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[telegram]\nenabled = true\n'
                      'token = "env:OPENCLAW_TEST_TOKEN"\nwebhook_url = "https://example.org/hook"\n')
    config.chmod(0o600)
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60,
                 OPENCLAW_TEST_TOKEN="123456:" + "A" * 35)
    assert doctor.returncode == 1
    assert "✗ connectors: telegram.webhook_url" in doctor.stdout, doctor.stdout
    assert "A" * 35 not in doctor.stdout + doctor.stderr  # and the token is never shown


def test_run_and_doctor_report_every_config_problem_in_one_round(tmp_path):
    """A key of the wrong type, an unknown skill, an approval entry for a skill not enabled and a
    model that is not there: all said at once, not one kind per attempt."""
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                      '[agent]\ntemperature = "hot"\n[skills]\nenabled = ["clock", "nope"]\n'
                      '[roles.user]\napproval = ["email"]\n'
                      f'[engine]\nmodel = "{tmp_path}/absent.gguf"\n')
    expected = ['agent.temperature = "hot": expected a number',
                "skills.enabled[1] ('nope'): no such skill",
                "roles.user.approval: unknown skill(s) ['email']",
                f"[engine]: model '{tmp_path}/absent.gguf': expected"]
    started = run(["--config", str(config), "run"], tmp_path, timeout=120)
    assert started.returncode == 2, started.stderr
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=120)
    assert doctor.returncode == 1
    for said in (started.stderr, doctor.stdout):
        lines = said.splitlines()[1:]
        assert all(f"{config}: {e}" in line for e, line in zip(expected, lines, strict=True)), said
    # The type fixed: the start's own checks still come together.
    config.write_text(config.read_text().replace('"hot"', "0.2"))
    again = run(["--config", str(config), "run"], tmp_path, timeout=120)
    reported = again.stderr.split("config error:\n", 1)[1].splitlines()
    assert again.returncode == 2, again.stderr
    assert all(e in line for e, line in zip(expected[1:], reported, strict=True))


def test_doctor_warns_of_a_connector_with_a_token_that_is_not_enabled(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                      '[telegram]\ntoken = "env:OPENCLAW_TEST_TOKEN"\n'
                      '[discord]\nenabled = false\ntoken = "env:OPENCLAW_TEST_TOKEN"\n')
    config.chmod(0o600)
    doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60,
                 OPENCLAW_TEST_TOKEN="123456:" + "A" * 35)
    for name in ("telegram", "discord"):
        assert (f"⚠ {name}: a token is set but the connector is not enabled\n"
                f"    fix: add `enabled = true` under [{name}] in {config}") in doctor.stdout, doctor.stdout
    assert doctor.returncode == 0, doctor.stdout  # a warning: `run` would start


def test_users_block_allow_revoke_and_pairing_deny(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nadmins = ["telegram:1"]\n'
                      'blocked = ["discord:9"]\n')

    def cli(*argv):
        return run(["--config", str(config), *argv], tmp_path, timeout=60)

    async def ask_for_codes():
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db") as store:
            for user in ("1001", "1002"):  # a name may try to forge a line of the listing
                await store.ensure_user("telegram", user, f"user {user}\nABCD1234  telegram:1")
            return [await store.create_pairing_code(f"telegram:{u}") for u in ("1001", "1002")]

    assert [line.split()[0] for line in cli("users").stdout.splitlines()] == [
        "discord:9", "telegram:1", "terminal:local"]  # the config's users, and no database made
    assert not (tmp_path / "data").exists()
    first, second = asyncio.run(ask_for_codes())
    # Made by the store, private from the start, though no daemon made it (every conversation
    # will be in there)
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "data/openclaw.db").stat().st_mode & 0o777 == 0o600
    denied = cli("pairing", "deny", second.lower())
    assert denied.returncode == 0 and "denied telegram:1002" in denied.stdout, denied.stderr
    assert second not in cli("pairing", "list").stdout and first in cli("pairing", "list").stdout

    blocked = cli("users", "block", "telegram:1001")  # waiting for approval: refused before it
    assert blocked.returncode == 0, blocked.stderr
    assert cli("pairing", "list").stdout.strip() == "no pending pairing codes"  # its code withdrawn
    assert cli("pairing", "approve", first).returncode == 1
    assert cli("users", "allow", "telegram:1001").returncode == 0
    assert cli("users", "revoke", "telegram:1002").returncode == 0
    lines = cli("users", "list").stdout.splitlines()
    assert {line.split()[0]: line.split()[1] for line in lines} == {
        "discord:9": "blocked", "telegram:1": "allowed", "telegram:1001": "allowed",
        "telegram:1002": "pending", "terminal:local": "allowed"}
    assert f"uid={sandbox_uid('telegram:1001')}" in lines[2] and "\\u000a" in lines[2]

    # The config decides for the users it names: the command says where to change it instead.
    for argv, where in ((["block", "telegram:1"], "access.admins"),
                        (["allow", "discord:9"], "access.blocked"),
                        (["revoke", "terminal:local"], "console")):
        refused = cli("users", *argv)
        assert refused.returncode == 1 and where in refused.stderr, refused.stderr
    bad = cli("users", "block", "telegram:@ada")
    assert bad.returncode == 2 and "numeric id" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_commands_refuse_a_terminal_user_other_than_the_console(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n')

    def cli(*argv):
        return run(["--config", str(config), *argv], tmp_path, timeout=60)

    for argv in (["users", "allow", "terminal:other"], ["users", "block", "terminal:2"],
                 ["users", "revoke", "terminal:x"], ["reminders", "--user", "terminal:other"],
                 ["reminders", "cancel", "terminal:other", "1"],
                 ["skills", "run", "clock", "--as", "terminal:other"]):
        refused = cli(*argv)
        assert refused.returncode == 2, (argv, refused.stdout)
        assert 'the terminal has one user, "terminal:local"' in refused.stderr, argv
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
    # The console's owner cannot be shut out of their own terminal.
    for action in ("block", "revoke"):
        refused = cli("users", action, "terminal:local")
        assert refused.returncode == 1 and "not shut out of their own terminal" in refused.stderr
    assert not (tmp_path / "data").exists()  # each refused before the store was opened


@pytest.mark.skipif(os.geteuid() != 0, reason="what root may do in another user's data_dir")
def test_root_is_sent_to_the_data_dirs_owner_before_anything_is_written(tmp_path):
    # A system service runs as its User=; `sudo openclaw users allow ...` would leave root-owned
    # files (the lock, a new database) the service cannot open at its next start.
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    os.chown(data_dir, 65534, 65534)
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{data_dir}"\n[admin]\nenabled = false\n')

    def cli(*argv):
        return run(["--config", str(config), *argv], tmp_path, timeout=60)

    for argv in (["users", "allow", "telegram:5"], ["db", "upgrade"], ["pairing", "list"],
                 ["reminders"], ["skills", "run", "clock", "--as", "terminal:local"], ["run"],
                 ["chat"]):
        refused = cli(*argv)
        assert refused.returncode == 1, (argv, refused.stderr)
        owner = __import__("pwd").getpwuid(65534).pw_name
        assert f"belongs to {owner}, the daemon's user" in refused.stderr, argv
        assert f"sudo -u {owner} " in refused.stderr and " ".join(argv) in refused.stderr, argv
    assert list(data_dir.iterdir()) == []
    # Read-only checks are root's to run; and a data_dir of root's own is root's to write.
    assert "✓ config: " in cli("doctor", "--skip-model").stdout
    os.chown(data_dir, 0, 0)
    assert cli("users", "allow", "telegram:5").returncode == 0
    assert (data_dir / "openclaw.db").stat().st_uid == 0


def test_users_lists_the_configs_users_and_the_console_once_each_in_order(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nadmins = ["telegram:1"]\n'
                      'allow = ["telegram:5", "telegram:1"]\nblocked = ["discord:9"]\n'
                      'roles = { "telegram:5" = "dev" }\n[roles.dev]\nskills = ["clock"]\n')

    async def meet():
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db") as store:
            await store.ensure_user("terminal", "local", "console")  # as the console stores itself
            await store.ensure_user("telegram", "5", "Eve")  # in the config and the store
            await store.ensure_user("telegram", "2", "Bo")  # only in the store

    asyncio.run(meet())
    listing = run(["--config", str(config), "users"], tmp_path, timeout=60)
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert rows == [
        ["discord:9", "blocked", "(config)", "role=user", f"uid={sandbox_uid('discord:9')}"],
        ["telegram:1", "allowed", "(config)", "role=admin", f"uid={sandbox_uid('telegram:1')}"],
        ["telegram:2", "pending", "role=user", f"uid={sandbox_uid('telegram:2')}", "Bo"],
        ["telegram:5", "allowed", "(config)", "role=dev", f"uid={sandbox_uid('telegram:5')}", "Eve"],
        ["terminal:local", "allowed", "(console)", "role=admin",
         f"uid={sandbox_uid('terminal:local')}"]]


def test_the_admin_lists_and_cancels_anyones_reminders(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n')
    url = f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db"

    def cli(*argv):
        return run(["--config", str(config), *argv], tmp_path, timeout=60)

    async def add(*reminders):
        async with await Store.open(url) as store:
            for user, chat, text in reminders:
                await store.add_reminder(user, chat, text, store.now() + timedelta(hours=1),
                                         timezone="Europe/Paris")

    async def active():
        async with await Store.open(url) as store:
            return sorted((r.user, r.number) for r in await store.active_reminders())

    asyncio.run(add(("telegram:1", "-100555", "standup\nin the group"), ("telegram:1", "1", "tea"),
                    ("telegram:2", "-100555", "lunch"), ("telegram:2", "2", "call mum")))
    lines = cli("reminders").stdout.splitlines()
    assert len(lines) == 4 and "\\u000a" in lines[0]  # one line each, whatever the text holds
    assert lines[0].split()[:2] == ["telegram:1", "#1"] and "Europe/Paris" in lines[0]
    group = cli("reminders", "list", "--chat", "telegram:-100555").stdout.splitlines()
    assert [line.split()[:2] for line in group] == [["telegram:1", "#1"], ["telegram:2", "#1"]]
    # `[list]` is optional, filters included, on either side of it
    for argv in (["list", "--user", "telegram:2"], ["--user", "telegram:2"],
                 ["--user", "telegram:2", "list"]):
        shown = cli("reminders", *argv)
        assert shown.returncode == 0, shown.stderr
        assert [(line.split()[0], line.split()[1]) for line in shown.stdout.splitlines()] == [
            ("telegram:2", "#1"), ("telegram:2", "#2")]
    assert cli("reminders", "--chat", "telegram:-100555").stdout.splitlines() == group
    assert "--user USER" in cli("reminders", "--help").stdout

    done = cli("reminders", "cancel", "telegram:2", "2")
    assert done.returncode == 0 and "call mum" in done.stdout, done.stderr
    again = cli("reminders", "cancel", "telegram:2", "2")
    assert again.returncode == 1 and "no active reminder #2" in again.stderr
    gone = cli("reminders", "cancel", "--chat", "telegram:-100555")  # the group's, whoever set them
    assert gone.returncode == 0 and "cancelled 2 reminder(s)" in gone.stdout
    assert asyncio.run(active()) == [("telegram:1", 2)]
    for argv in (["cancel", "telegram:1"], ["cancel", "--chat", "-100555"], ["list", "--user", "ada"]):
        bad = cli("reminders", *argv)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr


def test_run_notifies_systemd_and_drains_on_sigterm(tmp_path):
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(120)
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nport = 0\n[engine]\nkv_cache_gib = 0.1\n')
    env = {**os.environ, "HOME": str(tmp_path), "NOTIFY_SOCKET": str(sock_path)}
    proc = subprocess.Popen([sys.executable, "-m", "openclaw.cli", "--config", str(config), "run"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            ready = sock.recv(4096)
        except TimeoutError:
            proc.kill()
            raise AssertionError("no READY=1; daemon said:\n" + proc.stderr.read()[-3000:]) from None
        assert ready == b"READY=1"
        # `openclaw chat` attaches to the running daemon instead of starting another one
        chat = run(["--config", str(config), "chat"], tmp_path,
                   stdin="What is the capital of France?\n", timeout=120)
        assert chat.returncode == 0, chat.stderr
        assert "Paris" in chat.stdout
        assert "loading the model" not in chat.stderr
        proc.send_signal(signal.SIGTERM)
        assert sock.recv(4096) == b"STOPPING=1"
        started = time.monotonic()
        assert proc.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()
    assert "openclaw stopped" in proc.stderr.read()


def test_an_admin_port_in_use_is_said_in_one_line_before_the_model_loads(tmp_path):
    with a_port_in_use() as port:
        # A model that does not exist: had it been loaded first, that would be the error.
        config = missing_model_config(tmp_path, port)
        proc = run(["--config", str(config), "run"], tmp_path, timeout=60)
    assert proc.returncode != 0
    line = proc.stderr.strip().splitlines()[-1]
    assert line == (f"openclaw run: [admin] port {port} on 127.0.0.1 is in use (another openclaw? "
                    "see `ss -ltnp`); set [admin] port or [admin] enabled = false")
    assert "missing.gguf" not in proc.stderr and "loading the model" not in proc.stderr, proc.stderr


def test_python_dash_m_openclaw_is_the_same_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "openclaw", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("openclaw "), proc.stderr


@pytest.mark.parametrize("argv", [["fly"], ["pairing"]])
def test_bad_usage_is_a_usage_error(tmp_path, argv):
    proc = run(argv, tmp_path, timeout=60)
    assert proc.returncode == 2


def test_ctrl_c_ends_a_chat_waiting_for_input(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([sys.executable, "-m", "openclaw.cli", "chat"], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write("Hello!\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip()  # started and answered; now waiting for a line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()


@contextlib.contextmanager
def a_port_in_use():
    """A loopback port something else listens on, while the block runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def missing_model_config(tmp_path, port: int):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nport = {port}\n'
                      f'[engine]\nmodel = "{tmp_path}/missing.gguf"\n')
    return config


def test_a_chat_warns_once_of_an_admin_port_in_use_and_goes_on_to_load_the_model(tmp_path):
    with a_port_in_use() as port:
        # A model that does not exist: its error shows that the chat went on past the port.
        config = missing_model_config(tmp_path, port)
        proc = run(["--config", str(config), "chat"], tmp_path, stdin="hi\n", timeout=120)
    warnings = [line for line in proc.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and f"[admin] port {port} on 127.0.0.1 is in use" in warnings[0], \
        proc.stderr
    assert "[admin] port = N" in warnings[0] and "[admin] enabled = false" in warnings[0]
    assert "missing.gguf" in proc.stderr and "address already in use" not in proc.stderr


def test_doctor_says_when_the_admin_port_is_in_use(tmp_path):
    with a_port_in_use() as port:
        config = tmp_path / "c.toml"
        config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nport = {port}\n')
        doctor = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
        assert doctor.returncode == 1
        assert (f"✗ admin port: {port} on 127.0.0.1 is in use (another daemon? see `ss -ltnp`)\n"
                "    fix: stop what holds it, or set [admin] port = N (a free one) or [admin] "
                "enabled = false") in doctor.stdout, doctor.stdout
    freed = run(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=60)
    assert f"✓ admin port: {port} on 127.0.0.1 is free" in freed.stdout, freed.stdout


async def test_doctor_beside_the_running_daemon_finds_its_admin_port_served_not_taken(tmp_path):
    from openclaw.config import load_config
    from openclaw.daemon import Daemon
    from tests.helpers.scripted_model import ScriptedModel

    with a_port_in_use() as port:  # a free port number: released as the block ends
        pass
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nport = {port}\n'
                      '[skills]\nenabled = ["shell"]\n')
    daemon = Daemon(load_config(config), model=ScriptedModel(lambda m: "ok"))
    await daemon.start()
    try:
        doctor = await asyncio.to_thread(run, ["--config", str(config), "doctor", "--skip-model"],
                                         tmp_path, timeout=60)
        assert f"✓ admin port: {port} on 127.0.0.1 is served by the daemon running here" \
            in doctor.stdout, doctor.stdout
        # How commands' memory is bounded is the running daemon's to say (its cgroup, not ours).
        line = next(line for line in doctor.stdout.splitlines() if "sandbox memory" in line)
        assert "sandbox memory (the running daemon): " in line, doctor.stdout
        assert line.endswith(daemon.health()["command_memory"]), doctor.stdout
    finally:
        await daemon.stop()


# ---- doctor tries the tokens, against the fake services the connector tests use ----------------

async def a_fake(service: str):
    from tests.fakes.discord_api import FakeDiscord
    from tests.fakes.telegram_api import FakeTelegram

    fake = FakeTelegram() if service == "telegram" else FakeDiscord()
    await fake.start()
    return fake


def service_config(tmp_path, service: str, fake, token: str) -> Path:
    endpoints = (f'base_url = "{fake.base_url}"\nbase_file_url = "{fake.base_file_url}"'
                 if service == "telegram" else
                 f'api_base = "{fake.api_base}"\ngateway_url = "{fake.gateway_url}"')
    config = tmp_path / "c.toml"
    config.touch(mode=0o600)  # it holds a token
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                      f'[{service}]\nenabled = true\ntoken = "{token}"\n{endpoints}\n')
    return config


async def doctor_in_process(config: Path, capsys) -> tuple[int, str]:
    """`openclaw doctor --skip-model`, in a thread of its own (it runs its own event loop) while
    the fake serves on this one."""
    status = await asyncio.to_thread(cmd_doctor, argparse.Namespace(config=config, skip_model=True))
    out, err = capsys.readouterr()
    return status, out + err


@pytest.mark.parametrize("service", ["telegram", "discord"])
async def test_doctor_tries_the_token_and_names_the_bot(tmp_path, capsys, service):
    fake = await a_fake(service)
    try:
        _, out = await doctor_in_process(service_config(tmp_path, service, fake, fake.token), capsys)
    finally:
        await fake.stop()
    bot = fake.username if service == "telegram" else fake.bot["username"]
    assert f"✓ {service}: token works (bot @{bot})" in out, out
    assert fake.token not in out


@pytest.mark.parametrize("service", ["telegram", "discord"])
async def test_doctor_says_a_refused_token_is_refused_without_showing_it(tmp_path, capsys, caplog,
                                                                      service):
    wrong = "424242:WRONG-token-value-xyz-0123456789"
    fake = await a_fake(service)
    try:
        status, out = await doctor_in_process(service_config(tmp_path, service, fake, wrong), capsys)
    finally:
        await fake.stop()
    where = ("check telegram.token (from @BotFather)" if service == "telegram" else
             "check discord.token (Bot > Token in the Discord developer portal)")
    assert status == 1
    assert f"✗ {service}: the token was refused (Unauthorized)\n    fix: {where}" in out, out
    assert "WRONG-token" not in out + caplog.text


@pytest.mark.parametrize("wrong", ["/nope", ":1"])  # no Bot API at that path; nothing at that port
async def test_doctor_points_at_a_wrong_telegram_base_url(tmp_path, capsys, wrong):
    fake = await a_fake("telegram")
    try:
        config = service_config(tmp_path, "telegram", fake, fake.token)
        bad = fake.base_url.replace("/bot", "/nope/bot") if wrong == "/nope" else "http://127.0.0.1:1/bot"
        config.write_text(config.read_text().replace(f'base_url = "{fake.base_url}"',
                                                     f'base_url = "{bad}"'))
        status, out = await doctor_in_process(config, capsys)
    finally:
        await fake.stop()
    assert status == 1
    assert f"    fix: check telegram.base_url ({bad}): a self-hosted Bot API server's URL" in out, out
    assert "HTTPS_PROXY" not in out


@pytest.mark.parametrize("service", ["telegram", "discord"])
async def test_doctor_says_the_service_is_not_reachable(tmp_path, capsys, service):
    fake = await a_fake(service)
    await fake.stop()  # nothing listens on its port now
    status, out = await doctor_in_process(service_config(tmp_path, service, fake, fake.token), capsys)
    assert status == 1
    assert f"✗ {service}: 127.0.0.1:{fake.port} not reachable: " in out, out
    # Telegram's is a self-hosted server (base_url), whose URL may be what is wrong.
    assert ("    fix: check telegram.base_url" if service == "telegram" else
            "    fix: check this machine's network, DNS and firewall") in out
    assert "check this machine's network, DNS and firewall" in out
    assert fake.token not in out


def test_doctor_creates_no_database_and_upgrades_none(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n')
    database = tmp_path / "data/openclaw.db"
    url = f"sqlite+aiosqlite:///{database}"

    def doctor() -> str:
        assert cmd_doctor(argparse.Namespace(config=config, skip_model=True)) == 0
        return capsys.readouterr().out

    assert f"✓ database: {database} does not exist yet; will be created at first start\n" in doctor()
    assert not (tmp_path / "data").exists()

    async def schema(upgrade_to: str | None = None) -> str | None:
        """The database's schema revision, after an upgrade to `upgrade_to` if given."""
        async with await Store.open(url, migrate_schema=False) as store:
            if upgrade_to is not None:
                await migrate(store.engine, upgrade_to)
            return await store.schema_revision()

    asyncio.run(schema("0002"))
    assert f"✓ database: schema 0002; upgraded to {head_revision()} at the next start\n" in doctor()
    assert asyncio.run(schema()) == "0002"  # left for `run` to upgrade
    asyncio.run(schema(head_revision()))
    assert f"✓ database: schema {head_revision()}\n" in doctor()
    with contextlib.closing(sqlite3.connect(database)) as db, db:  # as a newer openclaw leaves it
        db.execute("UPDATE alembic_version SET version_num = 'f00d'")
    assert cmd_doctor(argparse.Namespace(config=config, skip_model=True)) == 1
    assert "✗ database: schema f00d, which this openclaw does not know" in capsys.readouterr().out


def test_doctor_fails_a_config_others_can_read_that_holds_a_secret(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPENCLAW_TEST_DISCORD", "from-the-environment")
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                      '[telegram]\ntoken = "123456:LITERAL-secret-value"\n'
                      '[discord]\ntoken = "env:OPENCLAW_TEST_DISCORD"\n')  # a reference: not a secret
    config.chmod(0o644)
    status = cmd_doctor(argparse.Namespace(config=config, skip_model=True))
    out = capsys.readouterr().out
    assert status == 1
    assert (f"✗ config: other users can read it, and it holds secrets (telegram.token)\n"
            f"    fix: chmod 600 {config}") in out, out
    assert "LITERAL-secret" not in out
    config.chmod(0o600)
    cmd_doctor(argparse.Namespace(config=config, skip_model=True))
    assert "other users can read it" not in capsys.readouterr().out


def test_looking_at_a_fresh_install_creates_no_data_folder_and_no_database(tmp_path, capsys):
    from openclaw.cli import main

    data = tmp_path / "data"
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{data}"\n[access]\nallow = ["telegram:5"]\n')
    cfg = ["--config", str(config)]
    assert main([*cfg, "pairing", "list"]) == 0
    assert capsys.readouterr().out == "no pending pairing codes\n"
    assert main([*cfg, "users"]) == 0  # the config's users still listed
    assert capsys.readouterr().out.split()[:2] == ["telegram:5", "allowed"]
    assert main([*cfg, "reminders"]) == 0
    assert capsys.readouterr().out == "no active reminders\n"
    assert main([*cfg, "pairing", "approve", "ABCD2345"]) == 1
    assert "no pending pairing code" in capsys.readouterr().err
    assert main([*cfg, "reminders", "cancel", "telegram:5", "1"]) == 1
    assert "telegram:5 has no active reminder #1" in capsys.readouterr().err
    assert not data.exists()  # a root's look would have made the service's folder root's

    async def request_code():  # the daemon made it since
        async with await Store.open(f"sqlite+aiosqlite:///{data}/openclaw.db") as store:
            await store.ensure_user("telegram", "1001", "Ada")
            return await store.create_pairing_code("telegram:1001")

    code = asyncio.run(request_code())
    assert main([*cfg, "pairing", "list"]) == 0
    assert code in capsys.readouterr().out
