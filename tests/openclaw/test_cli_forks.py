"""The CLI tests' forked `openclaw` (tests/helpers/cli_forks.py) is the command a user starts:
the same output, exit status and files as a fresh `python -m openclaw.cli`, in its own HOME."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.cli import run


def fresh(args: list[str], home) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home)}
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "openclaw.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_a_forked_command_answers_as_a_fresh_process_does(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[access]\nadmins = ["telegram:1"]\n'
                      'blocked = ["discord:9"]\n')
    for args in (["--config", str(config), "users"], ["fly"]):
        forked, real = run(args, tmp_path, timeout=120), fresh(args, tmp_path)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            real.returncode, real.stdout, real.stderr), args
    assert run(["fly"], tmp_path).returncode == 2  # argparse's SystemExit is the exit status


def test_a_forked_command_has_the_home_and_environment_it_was_given(tmp_path):
    made = run(["init"], tmp_path / "home")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "home/.config/openclaw/openclaw.toml").is_file()
    # A variable that exists only in this call's environment reaches the command.
    config = tmp_path / "c.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[telegram]\ntoken = "env:CLI_FORKS_TOKEN"\n')
    said = run(["--config", str(config), "doctor", "--skip-model"], tmp_path,
               CLI_FORKS_TOKEN="123456:" + "A" * 35)
    unset = run(["--config", str(config), "doctor", "--skip-model"], tmp_path)
    assert "environment variable CLI_FORKS_TOKEN is not set" in unset.stdout + unset.stderr
    assert "telegram: a token is set but the connector is not enabled" in said.stdout
    assert "CLI_FORKS_TOKEN" not in said.stdout + said.stderr
