"""Fixtures for the tests that run commands under the real bubblewrap sandbox."""

import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox.runner import isolation_available


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
