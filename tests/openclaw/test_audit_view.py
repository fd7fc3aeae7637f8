"""The audit log as the admin reads it (`openclaw audit`, a real process on a real database) and as
a user reads their own (/audit in chat, through the daemon)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from openclaw.gateway.contract import without_literal_blocks
from openclaw.store import Store
from tests.helpers.cli import run
from tests.helpers.daemon import RecordingConnector, say, started
from tests.helpers.scripted_model import ScriptedModel

NOW = datetime.now(UTC).replace(microsecond=0)


async def _add_rows(url: str) -> None:
    """Three calls, an hour, a day and ten days ago."""
    rows = [
        (NOW - timedelta(days=10), "telegram:2", "files", {"action": "delete", "path": "old.txt"},
         "denied", {}),
        (NOW - timedelta(days=1), "telegram:1", "email", {"action": "send", "to": "a@example.org"},
         "timeout", {}),
        (NOW - timedelta(hours=1), "telegram:1", "shell", {"command": "ls -la\u202e\nrm x"},
         "allowed", {"exit_status": 2, "duration_ms": 1234}),
    ]
    for at, user, skill, arguments, decision, fields in rows:
        async with await Store.open(url, clock=lambda at=at: at) as store:
            await store.add_audit(user, skill, arguments, decision, **fields)


def test_audit_lists_filters_and_dumps_the_calls(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n')

    def cli(*argv):
        return run(["--config", str(config), "audit", *argv], tmp_path, timeout=60)

    fresh = cli()  # a fresh install: nothing on record, and nothing created by looking
    assert fresh.returncode == 0 and fresh.stdout.strip() == "no skill calls on record"
    assert not (tmp_path / "data").exists()

    (tmp_path / "data").mkdir()
    asyncio.run(_add_rows(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db"))
    head, *rows = cli().stdout.splitlines()
    assert head.split()[:4] == ["when", "(UTC)", "user", "skill"]
    assert [r.split()[2:4] for r in rows] == [  # newest first
        ["telegram:1", "shell"], ["telegram:1", "email"], ["telegram:2", "files"]]
    shell = rows[0]
    # One line whatever the arguments hold, the direction override shown, not obeyed.
    assert "ls -la\\u202e\\nrm x" in shell and "allowed" in shell and "1.2 s" in shell
    assert shell.split()[5] == "2"  # the exit status
    assert f"{NOW - timedelta(hours=1):%Y-%m-%d %H:%M}" in shell

    def skills(*argv):
        shown = cli(*argv)
        assert shown.returncode == 0, shown.stderr
        return [line.split()[3] for line in shown.stdout.splitlines()[1:]]

    assert skills("--user", "telegram:1") == ["shell", "email"]
    assert skills("--skill", "files") == ["files"]
    assert skills("--decision", "timeout") == ["email"]
    assert skills("--since", "2d") == ["shell", "email"]
    assert skills("--since", (NOW - timedelta(hours=3)).isoformat()) == ["shell"]
    assert skills("--limit", "1") == ["shell"]
    none = cli("--since", "2h", "--skill", "files")
    assert none.returncode == 0 and none.stdout.strip() == "no skill call on record matches"

    dumped = json.loads(cli("--json", "--user", "telegram:1").stdout)
    assert [d["skill"] for d in dumped] == ["shell", "email"]
    assert dumped[0]["arguments"] == {"command": "ls -la\u202e\nrm x"}  # whole, as stored
    assert dumped[0]["exit_status"] == 2 and dumped[0]["duration_ms"] == 1234
    assert datetime.fromisoformat(dumped[1]["at"]) == NOW - timedelta(days=1)

    for argv in (["--since", "yesterday"], ["--user", "ada"], ["--limit", "0"]):
        bad = cli(*argv)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
        assert bad.stderr.startswith("openclaw audit: ")
    assert cli("--decision", "maybe").returncode == 2  # argparse names the choices


async def test_a_user_sees_their_own_last_calls_and_only_in_private(tmp_path):
    tg = RecordingConnector("telegram")
    model = ScriptedModel(lambda m: "hello")
    daemon, _ = await started(tmp_path, model, also=(tg,))
    for user in ("1", "2", "4"):
        await daemon.store.set_user_status("telegram", user, "allowed")
    await daemon.store.add_audit("telegram:1", "shell", {"command": "echo **bold**\u200fx"}, "allowed",
                                 exit_status=0, duration_ms=40)
    await daemon.store.add_audit("telegram:2", "files", {"action": "read", "path": "secret.txt"},
                                 "allowed", exit_status=0)
    mine = await say(daemon, tg, "/audit", user="1")
    lines = without_literal_blocks(mine).splitlines()  # sent as a block shown literally
    assert mine.count("```") == 2
    assert lines[0] == "Your last tool calls, newest first:" and len(lines) == 2
    assert "shell" in lines[1] and "echo **bold**\\u200fx" in lines[1] and "allowed exit 0 40 ms" in lines[1]
    assert "secret.txt" not in mine  # another user's call
    stranger = await say(daemon, tg, "/audit", user="3")  # is asked to pair, shown nothing
    assert "shell" not in stranger and "secret.txt" not in stranger
    in_group = await say(daemon, tg, "/audit", user="1", chat="-100", is_group=True)
    assert in_group.startswith("Your tool calls are shown in a private chat") and "echo" not in in_group
    assert await say(daemon, tg, "/audit", user="4") == "No tool calls of yours are on record."
    assert model.prompts == []  # commands, not turns
    await daemon.stop()
