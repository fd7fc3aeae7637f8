"""Pseudo-terminals against real bubblewrap: the kernel's pool of ptys (kernel.pty.max less its
reserve) is shared by every sandbox, so one command holding ptys must not leave the others none."""

import asyncio
import os
import time
from dataclasses import replace

import pytest

from sandbox.scope import Limits
from tests.helpers.sandbox import LIMITS, run
from tests.sandbox.test_runner import run_as_unprivileged_daemon

pytestmark = pytest.mark.usefixtures("bwrap_installed")  # see conftest.py

# Opens ptys until the kernel refuses one, says how many and why (in "held", renamed into place
# whole), then holds them until the test opens the "release" fifo.
HOLD_PTYS = r"""
import errno, os
held = []
try:
    while True:
        held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError as exc:
    why = errno.errorcode[exc.errno]
with open("held.part", "w") as out:
    out.write(f"{len(held)} {why}")
os.rename("held.part", "held")
os.close(os.open("release", os.O_RDONLY))
print(len(held), why)
"""
OPEN_ONE = "python3 -c 'import os, pty; os.close(pty.openpty()[0]); print(\"pty-ok\")'"


async def until_written(path, task: asyncio.Task) -> str:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert not task.done(), task.result()
        assert time.monotonic() < deadline, "the command never said how many ptys it holds"
        await asyncio.sleep(0.005)
    return path.read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root daemon's sandboxes get ptys")
async def test_one_command_holding_every_pty_it_can_leaves_other_sandboxes_theirs(workspace, tmp_path):
    # Enough descriptors to take the kernel's whole pool (3072 ptys outside the host's reserve, by
    # default) without the sandbox's own bound.
    greedy, other = workspace / "greedy", workspace / "other"
    greedy.mkdir(mode=0o777)
    other.mkdir(mode=0o777)
    os.mkfifo(greedy / "release")
    os.chmod(greedy / "release", 0o666)
    holder = asyncio.create_task(run("python3 -c \"$HOLD\"", greedy, replace(LIMITS, open_files=8192),
                                     env={"HOLD": HOLD_PTYS}))
    try:
        written = await until_written(greedy / "held", holder)
        meanwhile = await run(OPEN_ONE, other)
    finally:
        if (greedy / "held").exists():
            os.close(os.open(greedy / "release", os.O_WRONLY | os.O_NONBLOCK))
        held = await holder
    # Checked once both ran: without the bound, the first takes them all and the second gets none.
    assert meanwhile.stdout == "pty-ok\n", meanwhile.stderr
    assert (written, held.stdout) == (f"{Limits().ptys} ENOSPC", f"{written}\n"), held.stderr


def test_an_unprivileged_daemons_commands_get_no_ptys(workspace, unprivileged_daemon):
    # Its command keeps no capability to bound its devpts with: none rather than the whole pool.
    status, stdout, stderr, isolation = run_as_unprivileged_daemon(
        f"{OPEN_ONE}; ls -A /dev/pts; touch /dev/pts/ptmx", workspace, unprivileged_daemon)
    assert isolation == "bubblewrap"
    assert stdout == "" and "out of pty devices" in stderr and "Read-only file system" in stderr
