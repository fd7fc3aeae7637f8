"""`openclaw doctor`'s marks for what works with a gap: ⚠ with the fix, and an exit status of 0
(`run` would start), next to ✓ and ✗."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from openclaw.cli.doctor import cmd_doctor
from sandbox import cgroups
from sandbox.disk import free_bytes
from tests.helpers.sandbox import OLD_BWRAP

BASE = '[admin]\nenabled = false\n'


def doctor(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n' + BASE + text)
    code = cmd_doctor(argparse.Namespace(config=config, skip_model=True))
    return code, capsys.readouterr().out


@pytest.fixture
def old_bwrap(tmp_path) -> Path:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap (bwrap) is not installed: run `apt-get install bubblewrap` or `make setup`")
    old = tmp_path / "bwrap-0.6"
    old.write_text(OLD_BWRAP.format(bwrap=shutil.which("bwrap")))
    old.chmod(0o755)
    return old


def test_a_bubblewrap_too_old_to_size_tmp_is_a_warning_not_a_pass(tmp_path, capsys, old_bwrap):
    code, out = doctor(tmp_path, f'[sandbox]\nbwrap_path = "{old_bwrap}"\n', capsys)
    line = next(line for line in out.splitlines() if "sandbox isolation" in line)
    assert line.startswith("⚠ sandbox isolation: bubblewrap") and "WITHOUT a size limit" in line, out
    assert code == 0, out  # commands still run
    code, out = doctor(tmp_path, "", capsys)  # the real one sizes them
    assert "✓ sandbox isolation: bubblewrap" in out and code == 0, out


def test_unsandboxed_commands_are_a_warning_with_the_fix(tmp_path, capsys):
    code, out = doctor(tmp_path, f'[sandbox]\nbwrap_path = "{tmp_path}/none"\nallow_unsandboxed = true\n',
                       capsys)
    assert "⚠ sandbox isolation: NONE: commands run unsandboxed" in out, out
    assert "fix: Install bubblewrap" in out and code == 0


def test_data_dirs_free_space_is_shown_against_the_reserve(tmp_path, capsys):
    code, out = doctor(tmp_path, "", capsys)
    assert "✓ disk: " in out and f"free on data_dir's filesystem ({tmp_path}); the reserve is 1,024 MB" \
        in out, out
    above = (free_bytes(tmp_path) >> 20) + 100  # more than is free
    code, out = doctor(tmp_path, f"[sandbox]\nmin_free_disk_mb = {above}\n", capsys)
    assert f"under the {above:,} MB reserve: every user's commands are refused, and file writes to " \
        "that disk" in out, out
    assert next(line for line in out.splitlines() if "disk:" in line).startswith("⚠ disk: ")
    assert "fix: free space on that disk, or lower [sandbox] min_free_disk_mb" in out
    assert code == 0, out
    code, out = doctor(tmp_path, "[sandbox]\nmin_free_disk_mb = 0\n", capsys)
    assert "no reserve ([sandbox] min_free_disk_mb = 0)" in out, out


def test_how_commands_memory_is_bounded_is_shown_where_a_role_may_run_commands(tmp_path, capsys):
    _, out = doctor(tmp_path, "", capsys)  # clock only: nobody runs commands
    assert "sandbox memory" not in out, out
    _, out = doctor(tmp_path, '[skills]\nenabled = ["shell"]\n', capsys)  # admin gets shell
    line = next(line for line in out.splitlines() if "sandbox memory" in line)
    place, why = cgroups.probe()
    if place is not None:
        assert line == f"✓ sandbox memory (a daemon started here): all of a command's processes " \
                       f"together, by a memory cgroup ({why})", out
    else:
        assert line.startswith("⚠ sandbox memory (a daemon started here): per process only"), out
        assert "openclaw service install" in out


NO_BIND_FD = """#!/bin/sh
# bubblewrap 0.7: --size, but no --bind-fd. Everything else is the real one's.
if [ "$1" = --help ]; then
    {bwrap} --help 2>&1 | grep -v -e --bind-fd -e --ro-bind-fd
    exit 0
fi
exec {bwrap} "$@"
"""


def test_a_bubblewrap_that_binds_granted_folders_by_path_is_a_warning(tmp_path, capsys):
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap (bwrap) is not installed: run `apt-get install bubblewrap` or `make setup`")
    old = tmp_path / "bwrap-0.7"
    old.write_text(NO_BIND_FD.format(bwrap=shutil.which("bwrap")))
    old.chmod(0o755)
    code, out = doctor(tmp_path, f'[sandbox]\nbwrap_path = "{old}"\n', capsys)
    line = next(line for line in out.splitlines() if "sandbox isolation" in line)
    assert line.startswith("⚠ sandbox isolation: bubblewrap"), out
    assert "granted folders bound BY PATH" in line and "upgrade bubblewrap" in line, out
    assert code == 0, out  # commands still run
