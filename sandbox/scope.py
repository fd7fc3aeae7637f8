"""What a caller hands the runner (a principal's Scope and Limits) and what it gets back (a
Result), or SandboxUnavailable when the command cannot run as the admin configured."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# nobody/nogroup: the default uid of commands when the daemon is root. The policy gives each user a
# uid of their own (sandbox.policy.sandbox_uid): RLIMIT_NPROC counts per uid, system-wide, so a
# shared uid would let one user's processes use up everyone's limit.
SANDBOX_UID = 65534
# Where commands see their workspace (and their working directory); the files skill takes paths
# under it as the workspace's, since the model reuses what the shell showed it.
WORKSPACE_MOUNT = "/workspace"


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 30
    memory_bytes: int = 1 << 30
    wall_seconds: float = 60
    output_bytes: int = 64 * 1024
    file_size_bytes: int = 64 << 20
    processes: int = 64
    open_files: int = 256
    disk_bytes: int = 1 << 30  # what the workspace may hold in all (sandbox.disk_budget); 0: no quota
    ptys: int = 16  # open at once, in the sandbox's own devpts (sandbox.bwrap; a root daemon's only)


@dataclass(frozen=True)
class Scope:
    workspace: Path
    read_only: tuple[Path, ...] = ()
    read_write: tuple[Path, ...] = ()
    network: bool = False
    uid: int = SANDBOX_UID  # what commands run as when the daemon is root (gid the same number)
    # Folders other principals' commands may write: other users' workspaces (the folder holding
    # them), every role's read_write. A symlink there is never followed to a grant (sandbox.grants).
    others_writable: tuple[Path, ...] = ()


@dataclass
class Result:
    exit_status: int | None  # None when we killed it (the wall-clock limit, the disk budget)
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool
    duration_s: float
    isolation: str  # "bubblewrap" | "none"
    # How it went over its disk budget (CommandWatch.check): killed for it when exit_status is
    # None, else found when it had exited (quicker than the watch's first look).
    disk_exceeded: str | None = None
    # The kernel killed one of its processes for the memory of all of them together (the role's
    # memory_mb, through its cgroup; sandbox.cgroups).
    memory_exceeded: bool = False
    # Granted folders it ran without, and why (sandbox.grants refused them: a symlink, or nothing,
    # where a folder commands may write leads to them).
    left_out: tuple[str, ...] = ()


class SandboxUnavailable(Exception):
    """The command cannot run as configured: bubblewrap is missing or cannot create namespaces
    here, a granted folder cannot be opened, or the process's limits could not be set."""
