"""Fixtures the daemon's tests share: the session's throwaway PostgreSQL cluster."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator

import pytest


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """The URL of a database in a PostgreSQL cluster started for this test session, where this
    machine can run one (skipped, saying why, where it cannot)."""
    pytest.importorskip("asyncpg", reason="PostgreSQL cases need asyncpg: pip install -e '.[postgres]'")
    initdb, pg_ctl, createdb = _pg_bin("initdb"), _pg_bin("pg_ctl"), _pg_bin("createdb")
    if not initdb or not pg_ctl or not createdb:
        pytest.skip("PostgreSQL cases need the server binaries (initdb, pg_ctl, createdb)")
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the server as")
        as_user = ["runuser", "-u", "postgres", "--"]
    # Not under pytest's tmp_path: as root that is mode 0700, which the postgres user cannot enter.
    workdir = tempfile.mkdtemp(prefix="openclaw-pg-")
    if as_user:
        os.chown(workdir, account.pw_uid, account.pw_gid)
    data, port = os.path.join(workdir, "data"), _free_port()
    server = f"-h 127.0.0.1 -p {port} -k {workdir} -F"  # -F: no fsync, a throwaway cluster
    try:
        for cmd in ([*as_user, initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
                    [*as_user, pg_ctl, "-D", data, "-w", "-l", f"{workdir}/log", "-o", server, "start"],
                    [createdb, "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "openclaw"]):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"could not start PostgreSQL ({cmd[len(as_user)]}): {done.stderr.strip()[-300:]}")
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/openclaw"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", data, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
