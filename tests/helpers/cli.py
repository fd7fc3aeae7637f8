"""The `openclaw` command as a user runs it: a real process, with its own HOME."""

from __future__ import annotations

import os
import subprocess
import sys


def run(args: list[str], home, stdin: str = "", timeout: float = 300, **env):
    """`openclaw ARGS` run to its end with HOME=`home` and `env` added; the CompletedProcess."""
    environ = {**os.environ, "HOME": str(home), **env}
    environ.pop("NOTIFY_SOCKET", None)  # a test run under systemd: never notify its unit
    return subprocess.run([sys.executable, "-m", "openclaw.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=environ)
