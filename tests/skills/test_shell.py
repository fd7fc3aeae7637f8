"""The shell skill as the daemon runs it: a config with roles, the policy, the executor, the real
bubblewrap sandbox and a real SQLite audit log. Every hostile command is contained, reported to the
model, and audited."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from openclaw.config import load_config
from openclaw.skillset import configured_skills, executor_for
from openclaw.store import Store
from sandbox import cgroups
from sandbox.bwrap import isolation_available

ROLES = """
[skills]
enabled = ["clock", "shell"]
[access.roles]
"telegram:1" = "dev"
"telegram:2" = "netdev"
"telegram:3" = "careful"
"telegram:4" = "tiny"
"telegram:5" = "spinner"
[roles.dev]
skills = ["shell"]
cpu_seconds = 2
memory_mb = 256
wall_seconds = 4
output_bytes = 4096
processes = 32
[roles.netdev]
skills = ["shell"]
network = true
wall_seconds = 10
[roles.careful]
skills = ["shell"]
approval = ["shell"]
approval_timeout_s = 0.3
[roles.tiny]
skills = ["shell"]
disk_mb = 1
wall_seconds = 30
# A CPU limit the wall limit cannot beat: with half a core (a loaded machine) dev's 2 s of CPU
# could take over its 4 s of wall clock.
[roles.spinner]
skills = ["shell"]
cpu_seconds = 1
wall_seconds = 30
"""


@pytest.fixture(autouse=True)
def bwrap_installed():
    if shutil.which("bwrap") is None or not isolation_available()[0]:
        pytest.fail("bubblewrap is missing or cannot create namespaces: run `make setup`")


@pytest.fixture
async def daemon_parts():
    # Not tmp_path: pytest's /tmp/pytest-of-root is 0700, which the sandbox uid cannot walk through.
    root = Path(tempfile.mkdtemp(prefix="openclaw-skills-", dir="/tmp"))
    config_file = root / "openclaw.toml"
    config_file.write_text(f'data_dir = "{root}/data"\n' + ROLES)
    config = load_config(config_file)
    config.data_dir.mkdir(mode=0o700)
    store = await Store.open(config.store.url)
    executor = executor_for(config, configured_skills(config), store.add_audit)
    policy = config.policy()

    async def shell(user: str, command: str, approver=None):
        kwargs = {"approver": approver} if approver else {}
        return await executor.call("shell", {"command": command}, policy.principal(user), **kwargs)

    yield shell, store, config
    await store.close()
    shutil.rmtree(root, ignore_errors=True)


async def test_a_command_runs_in_the_users_own_workspace_and_is_audited(daemon_parts):
    shell, store, config = daemon_parts
    out = await shell("telegram:1", "echo made > note.txt; pwd; id -u")
    assert out.ok and out.decision == "allowed"
    assert "exit status 0" in out.text and "/workspace" in out.text
    assert (config.data_dir / "workspaces/telegram-1/note.txt").read_text() == "made\n"
    [row] = await store.list_audit()
    assert (row.user, row.skill, row.decision, row.exit_status) == ("telegram:1", "shell", "allowed", 0)
    assert row.arguments == {"command": "echo made > note.txt; pwd; id -u"}
    assert row.duration_ms is not None and row.output_bytes == len(out.text.encode())


async def test_secrets_of_the_host_and_of_the_daemon_are_out_of_reach(daemon_parts):
    shell, store, config = daemon_parts
    (config.data_dir / "openclaw.db").exists() or pytest.fail("the store should have made its file")
    other = config.data_dir / "workspaces/telegram-9"
    other.mkdir(parents=True)
    (other / "diary.txt").write_text("TOPSECRET-DIARY")
    out = await shell("telegram:1", f"cat /etc/shadow; cat {config.source}; "
                      f"cat {config.data_dir}/openclaw.db; ls {Path.home()}/.ssh; cat {other}/diary.txt; "
                      "echo LISTING; ls -a /workspace/..; "
                      "echo END")
    assert "/etc/shadow: No such file" in out.text and "END" in out.text
    assert "TOPSECRET-DIARY" not in out.text and "[roles." not in out.text and "SQLite" not in out.text
    listing = out.text.split("LISTING", 1)[1].split("END")[0]
    assert "telegram-9" not in listing and "workspace" in listing  # the sandbox root, not the host's


async def test_writes_outside_the_workspace_do_not_reach_the_host(daemon_parts):
    shell, _, _ = daemon_parts
    marker = f"openclaw-escape-{os.getpid()}"
    out = await shell("telegram:1", f"touch /usr/{marker}; echo x > /tmp/{marker}; echo x > /{marker}; true")
    assert "Read-only file system" in out.text
    assert not Path(f"/usr/{marker}").exists() and not Path(f"/tmp/{marker}").exists()
    assert not Path(f"/{marker}").exists()


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    yield server.getsockname()[1]
    server.close()


def _connect_command(port: int) -> str:
    return (f"grep -c tap0 /proc/net/route; python3 -c \"import socket; "
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\"")


async def test_a_role_without_network_has_none(daemon_parts, listener):
    shell, _, _ = daemon_parts
    denied = await shell("telegram:1", _connect_command(listener))
    assert "CONNECTED" not in denied.text and not denied.ok
    assert "stdout:\n0\n" in denied.text, denied.text  # no interface but lo


@pytest.mark.usefixtures("slirp4netns_works")
async def test_a_role_granted_network_never_reaches_the_hosts_loopback(daemon_parts, listener):
    shell, _, _ = daemon_parts
    # Its own namespace with a default route out (user-mode NAT, sandbox/network.py), but the
    # host's 127.0.0.1 stays the host's.
    granted = await shell("telegram:2", _connect_command(listener))
    assert "CONNECTED" not in granted.text and not granted.ok
    assert "stdout:\n2\n" in granted.text, granted.text  # tap0's route, and the default one


@pytest.mark.parametrize("user, command, expect", [
    ("telegram:1", ":(){ :|:& };:", "exit status"),  # fork bomb: contained by the process limit, call returns
    # CPU loop: killed by the CPU limit, and says so (spinner: its wall limit cannot come first)
    ("telegram:5", "while :; do :; done", "CPU-time limit of 1 s"),
    # An allocation refused, not a kill: the program's own words, and the limit that refused it.
    ("telegram:1", "python3 -c 'x = bytearray(1 << 30)'", "(out of memory: each of its processes may use "
                                                          "256 MB, the role's memory_mb)"),
    ("telegram:1", "yes | head -c 1000000000", "[output cut at 4096 bytes]"),
    ("telegram:1", "sleep 30", "killed after 4 s"),
])
async def test_resource_abuse_is_stopped_and_reported(daemon_parts, user, command, expect):
    shell, store, _ = daemon_parts
    out = await shell(user, command)
    assert expect in out.text, out.text
    assert not out.ok or "cut" in out.text
    assert out.text.count("[output cut at") <= 1, out.text
    [row] = await store.list_audit()
    assert row.decision == "allowed" and row.duration_ms < 8000


async def test_a_background_process_does_not_outlive_the_call(daemon_parts):
    shell, _, _ = daemon_parts
    tag = f"openclaw-bg-{os.getpid()}"
    out = await shell("telegram:1", f"(exec -a {tag} sleep 300 &) ; echo started")
    assert "started" in out.text
    await asyncio.sleep(0.2)
    leftovers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).startswith(tag)]
    assert leftovers == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def test_the_daemons_environment_does_not_leak(daemon_parts, monkeypatch):
    shell, _, _ = daemon_parts
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:very-secret")
    out = await shell("telegram:1", "env")
    assert "very-secret" not in out.text and "PATH=" in out.text


async def test_a_role_without_shell_is_denied_and_told_why(daemon_parts):
    shell, store, _ = daemon_parts
    out = await shell("telegram:77", "echo hi")  # unlisted user: the built-in "user" role
    assert out.decision == "denied" and not out.ok
    assert "role 'user'" in out.text and "may not use 'shell'" in out.text
    assert out.text.endswith("the owner can add it to [roles.user] skills")  # where to change it
    [row] = await store.list_audit()
    assert row.decision == "denied" and row.exit_status is None


async def test_approval_timeout_counts_as_deny_and_nothing_runs(daemon_parts):
    shell, store, config = daemon_parts
    asked = []

    async def silent_user(principal, skill, summary):
        asked.append(summary)
        await asyncio.sleep(60)

    out = await shell("telegram:3", "echo ran > ran.txt", approver=silent_user)
    assert out.decision == "timeout" and "did not run" in out.text
    assert asked == ["run the shell command: echo ran > ran.txt"]
    assert not (config.data_dir / "workspaces/telegram-3/ran.txt").exists()
    [row] = await store.list_audit()
    assert row.decision == "timeout"


async def test_approval_star_means_every_skill(daemon_parts):
    _, _, config = daemon_parts
    config.roles["careful"].approval = ["*"]
    principal = config.policy().principal("telegram:3")
    assert principal.needs_approval("shell") and principal.needs_approval("clock")


async def test_approval_granted_or_refused(daemon_parts):
    shell, store, config = daemon_parts

    async def yes(principal, skill, summary):
        return True

    async def no(principal, skill, summary):
        return False

    assert (await shell("telegram:3", "echo ok", approver=yes)).ok
    refused = await shell("telegram:3", "echo ok", approver=no)
    assert refused.decision == "rejected" and "denied this shell call" in refused.text
    assert [r.decision for r in await store.list_audit()] == ["rejected", "allowed"]


async def test_without_bubblewrap_the_skill_refuses_with_the_fix(daemon_parts, tmp_path):
    _, store, config = daemon_parts
    config.sandbox.bwrap_path = tmp_path / "no-bwrap"
    executor = executor_for(config, configured_skills(config), store.add_audit)
    out = await executor.call("shell", {"command": "echo hi"}, config.policy().principal("telegram:1"))
    assert not out.ok and "apt-get install bubblewrap" in out.text and "allow_unsandboxed" in out.text


async def test_a_command_in_a_full_workspace_is_refused_does_not_run_and_is_audited(daemon_parts):
    shell, store, config = daemon_parts
    workspace = config.data_dir / "workspaces/telegram-4"
    workspace.mkdir(parents=True)
    (workspace / "big").write_bytes(os.urandom(2 << 20))
    out = await shell("telegram:4", "touch ran")
    assert out.decision == "denied" and not out.ok
    assert out.text.startswith("error: denied: the command was not run: the workspace is full: "
                               "2.0 MB used of its 1 MB quota"), out.text
    assert "delete files to make room" in out.text
    assert not (workspace / "ran").exists()
    [row] = await store.list_audit()
    assert row.decision == "denied" and row.exit_status is None and "workspace is full" in row.detail


async def test_a_command_that_writes_past_the_quota_is_killed_and_the_model_is_told(daemon_parts):
    shell, store, config = daemon_parts
    out = await shell("telegram:4", "i=0; while [ $i -lt 40 ]; do head -c 524288 /dev/urandom > f$i; "
                                    "i=$((i+1)); sleep 0.05; done; echo finished")
    assert not out.ok and "finished" not in out.text
    assert out.text.startswith("killed: the workspace went over its 1 MB disk quota ("), out.text
    assert "delete files to make room" in out.text
    [row] = await store.list_audit()
    assert row.decision == "allowed" and row.exit_status is None
    assert row.detail.startswith("killed: the workspace went over its 1 MB disk quota")


@pytest.mark.skipif(cgroups.default.available()[0] is None,
                    reason=f"no memory cgroups here: {cgroups.default.available()[1]}")
async def test_processes_together_over_the_memory_limit_are_killed_and_the_model_is_told(daemon_parts):
    # Four of 100 MB: each under the 256 MB a process may map (RLIMIT_AS), together over it.
    shell, store, _ = daemon_parts
    out = await shell("telegram:1", "for i in 1 2 3 4; do python3 -c 'import time; "
                                    "b = bytearray(100 << 20); time.sleep(2)' & done; wait")
    assert "out of memory: its processes together went over the 256 MB" in out.text, out.text
    [row] = await store.list_audit()
    assert "out of memory (256 MB)" in row.detail and not out.ok


def test_the_approval_prompt_shows_hidden_characters():
    from skills.builtin.shell import ShellSkill

    shown = ShellSkill().describe({"command": "echo safe\u202e;rm -rf ~ #\nls"})
    assert shown == "run the shell command: echo safe\\u202e;rm -rf ~ #\\u000als"


async def test_a_granted_folder_the_command_runs_without_is_said_to_the_model(daemon_parts):
    # A share, and a folder deep in it granted too; renaming the folder between them takes the
    # inner grant's path away (sandbox.grants): the next command runs without it, and says so.
    from sandbox.policy import Role

    _, store, config = daemon_parts
    share = config.data_dir.parent / "share"
    (share / "albums/photos").mkdir(parents=True)
    for folder in (share, share / "albums", share / "albums/photos"):
        folder.chmod(0o777)
    policy = config.policy()
    policy.roles["sharer"] = Role("sharer", skills=frozenset({"shell"}),
                                  read_write=(share, share / "albums/photos"))
    principal = policy.principal("telegram:9", "sharer")
    executor = executor_for(config, configured_skills(config), store.add_audit)
    moved = await executor.call("shell", {"command": f"mv {share}/albums {share}/albums2"}, principal)
    assert moved.ok and "note:" not in moved.text, moved.text
    out = await executor.call("shell", {"command": "echo hi"}, principal)
    assert out.ok and "stdout:\nhi" in out.text, out.text
    assert f"note: run without a granted folder: {share}/albums/photos does not exist" in out.text
    # And the audit log, where the admin looks: the command ran, without that folder.
    [row] = [row for row in await store.list_audit() if row.arguments == {"command": "echo hi"}]
    assert row.decision == "allowed" and row.exit_status == 0
    assert f"run without a granted folder: {share}/albums/photos does not exist" in (row.detail or "")
