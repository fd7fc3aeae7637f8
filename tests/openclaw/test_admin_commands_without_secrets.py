"""The admin's commands against a service's config whose connector tokens only the service can
read (`env:` set in the unit, `file:` a credential only it may open): they never connect, so they
must work without them, while `run` and `doctor`, which connect, still refuse naming the key."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from openclaw.store import Store
from tests.helpers.cli_forks import forked_run


def openclaw(args: list[str], home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TELEGRAM_BOT_TOKEN", "DISCORD_BOT_TOKEN", "NOTIFY_SOCKET")}
    return forked_run(args, {**env, "HOME": str(home)}, stdin="", timeout=120)


@pytest.fixture
def service_config(tmp_path: Path) -> Path:
    """Tokens as a service holds them: a variable of the unit's, a file the admin cannot read."""
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n'
                      '[admin]\nenabled = false\n'
                      '[telegram]\nenabled = true\ntoken = "env:TELEGRAM_BOT_TOKEN"\n'
                      f'[discord]\nenabled = true\ntoken = "file:{tmp_path}/creds/discord"\n')
    return config


def test_pairing_users_reminders_and_db_work_without_the_connectors_tokens(tmp_path, service_config):
    async def a_stranger_asks() -> str:
        async with await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db") as store:
            await store.ensure_user("telegram", "1001", "Ada")
            return await store.create_pairing_code("telegram:1001")

    code = asyncio.run(a_stranger_asks())
    cfg = ["--config", str(service_config)]
    listing = openclaw([*cfg, "pairing", "list"], tmp_path)
    assert listing.returncode == 0 and code in listing.stdout, listing.stderr
    approved = openclaw([*cfg, "pairing", "approve", code], tmp_path)
    assert approved.returncode == 0 and "approved telegram:1001" in approved.stdout, approved.stderr
    assert openclaw([*cfg, "users", "block", "telegram:1002"], tmp_path).returncode == 0
    users = openclaw([*cfg, "users", "list"], tmp_path)
    assert "telegram:1001" in users.stdout and "blocked" in users.stdout, users.stderr
    assert openclaw([*cfg, "reminders", "list"], tmp_path).returncode == 0
    backup = openclaw([*cfg, "db", "backup", str(tmp_path / "b.db")], tmp_path)
    assert backup.returncode == 0 and (tmp_path / "b.db").is_file(), backup.stderr
    assert openclaw([*cfg, "db", "prune", "--dry-run"], tmp_path).returncode == 0


def test_run_and_doctor_still_refuse_a_token_they_cannot_read_naming_the_key(tmp_path,
                                                                              service_config):
    cfg = ["--config", str(service_config)]
    run = openclaw([*cfg, "run"], tmp_path)
    assert run.returncode == 2
    assert "telegram.token" in run.stderr and "TELEGRAM_BOT_TOKEN is not set" in run.stderr
    assert "discord.token" in run.stderr and "cannot read secret file" in run.stderr
    doctor = openclaw([*cfg, "doctor", "--skip-model"], tmp_path)
    assert doctor.returncode == 1 and "TELEGRAM_BOT_TOKEN is not set" in doctor.stdout


def test_service_install_needs_no_store_password_only_the_service_holds(tmp_path, service_config):
    """A PostgreSQL URL (it holds a password) given to the service alone: writing its unit opens
    no store, so it does not need it; the commands that open the store still do, and say which."""
    service_config.write_text(service_config.read_text().replace(
        "[admin]", '[store]\nurl = "env:OPENCLAW_TEST_STORE_URL"\n[admin]'))
    cfg = ["--config", str(service_config)]
    installed = openclaw([*cfg, "service", "install"], tmp_path)
    assert installed.returncode == 0, installed.stderr
    unit = (tmp_path / ".config/systemd/user/openclaw.service").read_text()
    assert f"--config {service_config}" in unit
    listing = openclaw([*cfg, "pairing", "list"], tmp_path)
    assert listing.returncode == 2 and "store.url" in listing.stderr, listing.stderr
    assert "OPENCLAW_TEST_STORE_URL is not set" in listing.stderr
