"""Finding processes in /proc, to check that nothing a sandbox started outlives it. Standard
library only: a child process the tests start imports it too."""

from __future__ import annotations

import os
from pathlib import Path

HELPERS = {"slirp4netns", "nsenter", "cat"}  # what a network Link starts (cat: the namespace holder)


def processes_running(*args: str) -> list[int]:
    """The pids whose command line is exactly `args`."""
    wanted = "\0".join(args).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                found.append(int(entry.name))
        except OSError:
            pass  # exited while we looked
    return found


def our_helpers() -> list[tuple[int, str]]:
    """Processes of the network plumbing that are children of this test process (other sessions'
    sandboxes may be running on the same machine); zombies count: someone forgot to reap them."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                comm, _, rest = (entry / "stat").read_text().partition(" (")[2].rpartition(") ")
                if comm in HELPERS and int(rest.split()[1]) == os.getpid():
                    found.append((int(entry.name), comm))
        except (OSError, ValueError, IndexError):
            pass  # exited while we looked
    return found
