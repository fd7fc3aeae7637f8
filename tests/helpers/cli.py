"""The `openclaw` command as a user runs it: a process of its own, with its own HOME."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.cli_forks import forked_run


def run(args: list[str], home, stdin: str = "", timeout: float = 300, **env):
    """`openclaw ARGS` run to its end with HOME=`home` and `env` added; the CompletedProcess.
    Forked from a process that imported the command already (tests/helpers/cli_forks.py), unless
    `env` sets what a process reads at its start (PYTHON*, the locale, the time zone): then a
    fresh interpreter."""
    environ = {**os.environ, "HOME": str(home), **env}
    environ.pop("NOTIFY_SOCKET", None)  # a test run under systemd: never notify its unit
    if any(key.startswith(("PYTHON", "LC_")) or key in ("LANG", "LANGUAGE", "TZ") for key in env):
        return subprocess.run([sys.executable, "-m", "openclaw.cli", *args], input=stdin,
                              capture_output=True, text=True, timeout=timeout, env=environ)
    return forked_run(args, environ, stdin, timeout)
