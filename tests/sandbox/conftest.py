"""Fixtures for the tests that run commands under the real bubblewrap sandbox."""

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandbox
from sandbox.bwrap import isolation_available

NOBODY = 65534


@pytest.fixture
def bwrap_installed():
    # `make test` installs bubblewrap; a missing one is a broken setup, not a reason to skip.
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap (bwrap) is not installed: run `apt-get install bubblewrap` or `make setup`")
    ok, why = isolation_available()
    if not ok:
        pytest.fail(f"bubblewrap cannot create namespaces here: {why}")


@pytest.fixture
def workspace(bwrap_installed):
    # Not tmp_path: pytest's /tmp/pytest-of-root is 0700, which the unprivileged sandbox uid cannot reach.
    path = Path(tempfile.mkdtemp(prefix="openclaw-sbx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Daemon:
    """How to start a Python child as an unprivileged daemon's uid (nobody, when the tests are
    root): `python`, with `path` (for PYTHONPATH) holding a copy of the sandbox package."""

    python: str
    path: Path
    uid: int | None  # None: ours (the tests are not root)


def python_for(uid: int | None) -> str | None:
    """An interpreter `uid` can run: the one our venv was made from, else the system's. Not the
    venv's own: it may lie in the checkout, which another uid may not enter."""
    for python in (os.path.realpath(sys.executable), shutil.which("python3", path="/usr/bin:/bin")):
        if python and (uid is None or _runs(python, uid)):
            return python
    return None


def _runs(python: str, uid: int) -> bool:
    try:
        return subprocess.run([python, "-I", "-c", ""], user=uid, group=uid, cwd="/",
                              capture_output=True, timeout=30).returncode == 0
    except OSError:  # not allowed to run it (a folder on its way closed to uid)
        return False


@pytest.fixture
def unprivileged_daemon():
    """The checkout may lie where only its owner can enter (a home of mode 0700, `mktemp -d`), so
    the child gets a copy of the sandbox package (standard library only) in a folder anyone can
    read; the checkout's own modes are never loosened."""
    uid = NOBODY if os.geteuid() == 0 else None
    python = python_for(uid)
    if python is None:
        pytest.skip(f"no Python interpreter uid {uid} may run")
    top = Path(tempfile.mkdtemp(prefix="openclaw-pkg-", dir="/tmp"))
    try:
        shutil.copytree(Path(sandbox.__file__).parent, top / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path in (top, *top.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield Daemon(python, top, uid)
    finally:
        shutil.rmtree(top, ignore_errors=True)
