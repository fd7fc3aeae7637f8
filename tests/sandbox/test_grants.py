"""Granted folders a command can rename: the next run must not bind (or, as root, hand over) what a
symlink it planted names, and bwrap must get no descriptor it does not bind."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from sandbox.disk import free_bytes
from sandbox.grants import Grants, UnsafeGrant
from sandbox.runner import run_command
from sandbox.scope import SandboxUnavailable, Scope
from tests.helpers.sandbox import LIMITS, swap_for_link

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
    await swap_for_link(family / "alice", system, scope)
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


async def test_a_share_given_by_its_real_path_still_guards_a_workspace_given_through_a_link(base):
    # Writable folders were checked shallower-first by the path as configured: a workspace given
    # through the admin's short link was opened before the (longer) share it lies in was known.
    share = base / "mnt/disk1/exports/family"
    (share / "alice").mkdir(parents=True)
    for path in share.parents:
        if path.is_relative_to(base):
            path.chmod(0o755)
    share.chmod(0o777)
    (base / "fam").symlink_to(share)
    system = base / "system"  # stands for /etc
    system.mkdir()
    scope = Scope(base / "fam/alice", read_write=(share,), uid=USER_UID)
    await swap_for_link(share / "alice", system, scope)
    with pytest.raises(SandboxUnavailable, match="symlink"):
        await run_command("touch mine", scope, LIMITS)
    assert system.stat().st_uid == os.geteuid() and not (system / "mine").exists()


def swapping_bwrap(base: Path, folder: Path, target: str) -> Path:
    """A bwrap that, for a command run in `folder`'s scope, first swaps `folder` for a link to
    `target`: what a command of the user's running meanwhile can do between the daemon's check and
    bwrap's mounts (a race it wins now and then; here every time)."""
    wrapper = base / "bwrap"
    wrapper.write_text(f"""#!/bin/sh
case "$*" in *{folder}*) mv {folder} {folder}.old && ln -s {target} {folder} ;; esac
exec {shutil.which("bwrap")} "$@"
""")
    wrapper.chmod(0o755)
    return wrapper


async def test_a_folder_bound_twice_is_bound_by_descriptor_both_times(base):
    # By path (its second bind, under /workspace), bwrap resolved the source long before it
    # mounted: a link put there meanwhile had it mount the daemon's folder next to the workspace.
    (base / "tmp/reference").mkdir(parents=True)  # the daemon's, beside the workspaces
    (base / "tmp/reference/config.toml").write_text("bot_token = 'SECRET'\n")
    for path in (base / "tmp", base / "tmp/reference"):
        path.chmod(0o755)
    workspace = base / "ws"
    (workspace / "docs/reference").mkdir(parents=True)
    (workspace / "docs/reference/keep.txt").write_text("keep\n")
    scope = Scope(workspace, read_only=(workspace / "docs/reference",), uid=USER_UID)
    bwrap = swapping_bwrap(base, workspace / "docs", "../tmp")
    result = await run_command("cat /tmp/reference/*", scope, LIMITS, bwrap_path=str(bwrap))
    assert "SECRET" not in result.stdout
    assert result.stdout == "keep\n", result.stderr  # the granted folder, where the link led it


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon's bwrap runs setpriv as root")
async def test_a_bind_led_over_usr_bin_does_not_replace_the_setpriv_bwrap_runs_as_root(base):
    family = base / "family"
    (family / "alice/tools/bin").mkdir(parents=True)
    family.chmod(0o777)
    fake = family / "usr/bin"  # the share's, so any command of the family's may write it
    fake.mkdir(parents=True)
    for name in ("sh", "id"):
        shutil.copy2(os.path.realpath(shutil.which("dash" if name == "sh" else name)), fake / name)
    (fake / "setpriv").write_text("#!/bin/sh\nid -u > /workspace/ran-as\n")
    (fake / "setpriv").chmod(0o755)
    scope = Scope(family / "alice", read_write=(family,), read_only=(family / "alice/tools/bin",),
                  uid=USER_UID)
    bwrap = swapping_bwrap(base, family / "alice/tools", "../usr")
    result = await run_command("id -u", scope, LIMITS, bwrap_path=str(bwrap))
    assert not (family / "alice/ran-as").exists()
    assert result.stdout == f"{USER_UID}\n", result.stderr


async def test_no_descriptor_is_left_open_in_the_daemon(base):
    workspace = base / "ws"
    (workspace / "ref").mkdir(parents=True)
    (workspace / "link").symlink_to(workspace / "ref")
    before = sorted(os.listdir("/proc/self/fd"))
    ok = Scope(workspace, read_only=(workspace / "ref",), uid=USER_UID)
    for _ in range(3):
        assert (await run_command("true", ok, LIMITS)).exit_status == 0
    with pytest.raises(SandboxUnavailable):
        await run_command("true", Scope(workspace, read_only=(workspace / "link",), uid=USER_UID), LIMITS)
    assert sorted(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon hands the workspace to a uid")
async def test_a_workspace_another_roles_command_can_swap_is_not_handed_over(base):
    # A "parents" role may write the family share; a kid's workspace is a folder in it. The kid's
    # own scope has nothing writable there but its workspace: the policy knows who else writes it.
    from sandbox.policy import Policy, Role

    system = base / "system"  # stands for /etc
    system.mkdir()
    family = base / "family"
    family.mkdir()
    family.chmod(0o777)
    roles = {"parents": Role("parents", skills=frozenset({"shell"}), read_write=(family,)),
             "kids": Role("kids", skills=frozenset({"shell"}), workspace=f"{family}/{{user}}")}
    policy = Policy(roles, base / "data", lambda user: "kids" if user == "kid" else "parents")
    kid = policy.principal("kid")
    await run_command("echo mine > f", kid.scope, LIMITS)  # the kid's workspace works
    parent = policy.principal("mum")
    await swap_for_link(family / "kid", system, parent.scope)
    with pytest.raises(SandboxUnavailable, match="symlink"):
        await run_command("echo 'root::0:0' > passwd", kid.scope, LIMITS)
    assert system.stat().st_uid == 0 and not (system / "passwd").exists()


async def test_a_granted_path_that_is_a_file_refuses_the_command_saying_so_and_leaves_no_descriptor(base):
    # The workspace's hand-over opened every granted folder, and took a read-only grant that is a file
    # for the workspace: a ValueError ("create it first") escaped run_command, not SandboxUnavailable.
    workspace = base / "ws"
    workspace.mkdir()
    granted = base / "notes.txt"
    granted.write_text("a file, not a folder\n")
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(SandboxUnavailable, match="notes.txt"):
        await run_command("true", Scope(workspace, read_only=(granted,), uid=USER_UID), LIMITS)
    assert sorted(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ValueError, match="create it first"):  # the workspace's own problem: as before
        await run_command("true", Scope(granted, uid=USER_UID), LIMITS)


def nested_share(base: Path) -> tuple[Path, Path, Scope]:
    """(share, workspace, scope): a share everyone may write, and a folder deep in it
    (albums/photos) granted too, read-write: renaming albums takes the inner grant's path away."""
    share = base / "share"
    (share / "albums/photos").mkdir(parents=True)
    for folder in (share, share / "albums", share / "albums/photos"):
        folder.chmod(0o777)
    workspace = base / "ws"
    workspace.mkdir()
    return share, workspace, Scope(workspace, read_write=(share, share / "albums/photos"), uid=USER_UID)


async def test_a_nested_writable_folder_renamed_away_is_left_out_and_can_be_put_back(base):
    # A share, and a folder deep in it granted too. Renaming the folder between them takes the
    # inner grant's path away: the next command runs without that bind (it is writable through
    # the share anyway), says so, and can rename it back; a link put there is not followed.
    share, workspace, scope = nested_share(base)
    moved = await run_command(f"cd {share} && mv albums albums2 && ln -s {base} albums && echo ok",
                              scope, LIMITS)
    assert moved.stdout == "ok\n" and moved.left_out == (), moved.stderr
    back = await run_command(f"cd {share} && rm albums && mv albums2 albums && echo back", scope, LIMITS)
    assert back.stdout == "back\n", back.stderr
    [why] = back.left_out
    assert "albums/photos" in why and "symlink" in why
    again = await run_command("echo ok", scope, LIMITS)
    assert again.stdout == "ok\n" and again.left_out == ()


async def test_a_read_only_folder_renamed_away_still_refuses_the_command(base):
    # Left out, the read-only folder moved away would be writable where it now lies.
    workspace = base / "ws"
    (workspace / "docs/reference").mkdir(parents=True)
    scope = Scope(workspace, read_only=(workspace / "docs/reference",), uid=USER_UID)
    moved = await run_command("mv docs docs2 && echo ok", scope, LIMITS)
    assert moved.stdout == "ok\n", moved.stderr
    with pytest.raises(SandboxUnavailable, match="does not exist"):
        await run_command("touch docs2/reference/changed", scope, LIMITS)
    assert not (workspace / "docs2/reference/changed").exists()


async def test_a_nested_writable_folder_a_file_took_the_place_of_is_left_out_too(base):
    # A file put where a folder on the way was (`mv albums albums2; touch albums`) is a command's
    # doing as much as a link: the inner grant is left out, not every command refused until an
    # admin steps in; a read-only folder below it still refuses.
    share, workspace, scope = nested_share(base)
    moved = await run_command(f"cd {share} && mv albums albums2 && touch albums && echo ok", scope, LIMITS)
    assert moved.stdout == "ok\n" and moved.left_out == (), moved.stderr
    back = await run_command(f"cd {share} && rm albums && mv albums2 albums && echo back", scope, LIMITS)
    assert back.stdout == "back\n", back.stderr
    [why] = back.left_out
    assert "albums/photos is not a folder" in why
    assert (await run_command("true", scope, LIMITS)).left_out == ()
    (share / "albums").rename(share / "albums2")
    (share / "albums").write_text("")
    with pytest.raises(SandboxUnavailable, match="not a folder"):
        await run_command("true", Scope(workspace, read_write=(share,),
                                        read_only=(share / "albums/photos",), uid=USER_UID), LIMITS)


async def test_a_link_where_a_left_out_folder_was_does_not_steer_the_disk_budget(base):
    # The disk budget watches the filesystems of the folders the command has, not of paths a
    # link now leads from: one to a nearly full filesystem would refuse the command in the
    # left-out folder's name. Here the link leads to /dev/shm, with less free than the reserve.
    shm_free = free_bytes(Path("/dev/shm"))
    if shm_free >= free_bytes(base):
        pytest.skip("/dev/shm has as much free space as /tmp here")
    share, workspace, scope = nested_share(base)
    planted = await run_command(f"cd {share} && mv albums a2 && mkdir albums && "
                                "ln -s /dev/shm albums/photos && echo ok", scope, LIMITS)
    assert planted.stdout == "ok\n", planted.stderr
    reserve = (shm_free + free_bytes(base)) // 2  # above /dev/shm's free space, below the disk's
    result = await run_command("echo ran", scope, LIMITS, min_free_bytes=reserve)
    assert result.stdout == "ran\n" and len(result.left_out) == 1, result.stderr
