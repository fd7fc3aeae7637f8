"""Granted folders a command can rename: the next run must not bind (or, as root, hand over) what a
symlink it planted names, and bwrap must get no descriptor it does not bind."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox.grants import Grants, UnsafeGrant
from sandbox.runner import SandboxUnavailable, Scope, run_command
from tests.sandbox.test_runner import LIMITS

pytestmark = pytest.mark.usefixtures("bwrap_installed")  # see conftest.py

USER_UID = 1_500_000_123  # a per-user sandbox uid (sandbox.policy), as root


@pytest.fixture
def base():
    # Under /tmp, walkable: the sandbox uid must reach the workspace.
    path = Path(tempfile.mkdtemp(prefix="openclaw-grants-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def daemon_secret(base: Path) -> Path:
    """A world-readable file in a folder only the daemon may enter, like a config under ~/.config."""
    private = base / "daemon"
    (private / "conf").mkdir(parents=True)
    (private / "conf/config.toml").write_text("bot_token = 'SECRET'\n")
    for path, mode in ((private / "conf", 0o755), (private / "conf/config.toml", 0o644), (private, 0o700)):
        path.chmod(mode)
    return private / "conf"


async def test_a_read_only_folder_in_the_workspace_cannot_be_pointed_at_the_daemons_files(base):
    secret = daemon_secret(base)
    workspace = base / "ws"
    (workspace / "docs/reference").mkdir(parents=True)
    scope = Scope(workspace, read_only=(workspace / "docs/reference",), uid=USER_UID)
    # The folder itself is a mount point, but the one above it can be renamed and rebuilt.
    planted = await run_command(f"mv docs old && mkdir docs && ln -s {secret} docs/reference && echo ok",
                                scope, LIMITS)
    assert planted.stdout == "ok\n", planted.stderr
    with pytest.raises(SandboxUnavailable, match="symlink"):
        await run_command(f"cat /workspace/docs/reference/config.toml {secret}/config.toml", scope, LIMITS)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon hands the workspace to a uid")
async def test_a_workspace_in_a_writable_share_swapped_for_a_symlink_is_not_handed_over(base):
    system = base / "system"  # stands for /etc
    system.mkdir()
    (system / "passwd").write_text("root:x:0:0\n")
    family = base / "family"
    (family / "alice").mkdir(parents=True)
    family.chmod(0o777)
    scope = Scope(family / "alice", read_write=(family,), uid=USER_UID)
    planted = await run_command(f"cd {family} && mv alice old && ln -s {system} alice && echo ok",
                                scope, LIMITS)
    assert planted.stdout == "ok\n", planted.stderr
    with pytest.raises(SandboxUnavailable, match="symlink"):
        await run_command("rm -f passwd; echo 'root::0:0' > passwd", scope, LIMITS)
    assert system.stat().st_uid == 0 and (system / "passwd").read_text() == "root:x:0:0\n"


async def test_the_admins_own_symlinks_are_followed_and_no_folder_descriptor_reaches_the_command(base):
    share = base / "data/share"
    (share / "ro").mkdir(parents=True)
    (share / "ro/keep.txt").write_text("keep\n")
    for path in (share, share / "ro", share / "ro/keep.txt"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (base / "link").symlink_to(share)
    workspace = base / "ws"
    (workspace / "ref").mkdir(parents=True)
    scope = Scope(workspace, read_only=(base / "link", workspace / "ref"), uid=USER_UID)
    # An O_PATH descriptor of a host folder left open would lead out of the sandbox (openat "..").
    result = await run_command(f"cat {share}/ro/keep.txt && ls /proc/self/fd", scope, LIMITS)
    assert result.exit_status == 0, result.stderr
    assert result.stdout.split() == ["keep", "0", "1", "2", "3"]  # 3: ls's own, of /proc/self/fd


def test_a_symlink_inside_a_writable_folder_is_refused_one_outside_followed(base):
    (base / "ws/real").mkdir(parents=True)
    (base / "ws/link").symlink_to(base / "ws/real")
    (base / "alias").symlink_to(base / "ws")
    with Grants.open(base / "alias", read_only=(base / "alias/real",)) as grants:
        assert grants.workspace.path == base / "ws"
        assert [g.path for g in grants.others] == [base / "ws/real"]
    with pytest.raises(UnsafeGrant):
        Grants.open(base / "ws", read_only=(base / "ws/link",))
