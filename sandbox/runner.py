"""The isolated process runner: one shell command under bubblewrap, rlimits and a wall-clock timeout.

The shell skill hands a command, the principal's scope and limits to `run_command` and gets a
`Result` back. Isolation is bubblewrap (new user, pid, ipc, uts, cgroup and net namespaces, a
read-only system, the workspace bound read-write at /workspace, all capabilities dropped, a cleared
environment) and a seccomp filter (sandbox.seccomp: no user namespaces; no keyrings, bpf, perf
events, userfaultfd or io_uring). When the daemon is root, bwrap runs as root without a user
namespace (it can then bind any granted path) and the command itself becomes a real unprivileged
uid through setpriv, with an empty capability bounding set and no_new_privs: root would ignore
RLIMIT_NPROC and keep every capability. Where bubblewrap cannot run, or cannot load the filter, we
refuse with `SandboxUnavailable`, unless the admin set `[sandbox] allow_unsandboxed = true`: the
rlimits still apply then, and as root the uid drop, but an unprivileged daemon runs the command as
its own user, able to read the daemon's config and data.

Its /tmp and /dev/shm are tmpfs, whose pages no rlimit charges: bwrap --size (0.7 and later) bounds
them, together, by the role's memory limit (`tmpfs_sizes`), and /dev, another tmpfs, is read-only.
An older bwrap cannot size them; commands still run, and `isolation_available` (so `openclaw
doctor`) and the log say so.

What a command may leave on disk is sandbox.disk_budget's: the workspace's quota and the free
space kept for everyone are checked before it starts, and watched while it runs, beside the
wall-clock limit; a command over either is killed as one past that limit is.

The sandbox never shares the host's network namespace: a role granted network gets user-mode
networking in its own (sandbox.network), so the host's loopback services and abstract sockets stay
out of reach; without slirp4netns such a role's commands are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox import cgroups, network, seccomp
from sandbox.disk_budget import CommandWatch
from sandbox.grants import Grants, UnsafeGrant
from sandbox.to_end import run_to_end

log = logging.getLogger(__name__)

# nobody/nogroup: the default uid of commands when the daemon is root. The policy gives each user a
# uid of their own (sandbox.policy.sandbox_uid), because RLIMIT_NPROC counts per uid, system-wide: a
# shared uid would let one user's processes use up everyone's limit.
SANDBOX_UID = 65534

SETPRIV = "/usr/bin/setpriv"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
WORKSPACE_MOUNT = "/workspace"
READ_CHUNK = 64 * 1024
# After the command exits (or is killed) its pipes should close at once; anything still holding them
# escaped the process group, and we stop waiting for it after this long.
DRAIN_GRACE_S = 2.0
EXIT_POLL_S = 0.01
# The OOM killer's preference for the command's processes over every other (1000: first).
OOM_SCORE_ADJ = b"1000"
# /dev/shm's share of the role's memory limit; /tmp gets the rest (see tmpfs_sizes).
SHM_SHARE = 4

# Mounted read-only at the same path, where present. On merged-/usr systems /bin, /lib*, /sbin are
# symlinks and are recreated as symlinks rather than bound.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# From /etc only what ordinary programs need: the dynamic linker's cache, Debian's alternatives
# symlinks, name-service config and the world-readable passwd/group (so `id`, `ls -l` name users),
# hosts, TLS roots, time zone. Never shadow/gshadow, ssh keys, sudoers or our own config. Not the
# host's resolv.conf either: it may name a loopback resolver (127.0.0.53), which is not at that
# address in the sandbox; a command granted network gets one naming slirp4netns's (sandbox.network),
# which forwards DNS to the host's resolver.
ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives",
    "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/hosts",
    "/etc/services", "/etc/protocols", "/etc/ssl", "/etc/ca-certificates", "/etc/localtime",
)

UNSIZED_TMPFS = ("WITHOUT a size limit on /tmp and /dev/shm: this bubblewrap has no --size (0.7 and "
                 "later), so a command can fill them with up to half of the host's RAM each; upgrade "
                 "bubblewrap")

PATH_BINDS = ("granted folders bound BY PATH: this bubblewrap has no --bind-fd (0.8 and later), so a "
              "command running beside another of its user's could swap a folder for a symlink "
              "between the check and the mount; upgrade bubblewrap")

FIX_HINT = (
    "Install bubblewrap (`apt-get install bubblewrap`) and make sure unprivileged user namespaces are "
    "enabled (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0, and no AppArmor "
    "rule denying them). To run commands WITHOUT isolation instead, set `[sandbox] allow_unsandboxed = "
    "true` in the config (not recommended)."
)


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
    """bubblewrap is missing or cannot create namespaces here."""


def _is_root() -> bool:
    return os.geteuid() == 0


def _system_args() -> list[str]:
    # Folders bwrap creates on its own root get 0700 when it runs as root: give /etc the usual mode
    # so the sandbox uid can read the few files bound into it.
    args: list[str] = ["--perms", "0755", "--dir", "/etc"]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    return args


def _namespace_args() -> list[str]:
    # Always a network namespace of our own, also for a role granted network (sandbox.network
    # connects it): the host's would expose its loopback services and abstract UNIX sockets.
    if _is_root():
        # bwrap runs as root without a user namespace (so it can bind any granted path, even under
        # a 0700 home), and setpriv (see _command_prefix) makes the command a real unprivileged uid.
        args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--unshare-net"]
    else:
        args = ["--unshare-all", "--cap-drop", "ALL"]  # user, pid, ipc, uts, net, cgroup
        if _bwrap_can_disable_userns():
            # No user namespaces inside: a nested one would hand the command a fresh set of
            # capabilities there, and much more of the kernel to attack.
            args += ["--unshare-user", "--disable-userns"]
    # die-with-parent: if we are killed (or kill bwrap at the wall limit) the sandbox's pid 1 gets
    # SIGKILL, which takes every process in the pid namespace with it. new-session: no TIOCSTI into
    # our terminal.
    return args + ["--die-with-parent", "--new-session", "--hostname", "sandbox"]


def _bwrap_can_disable_userns() -> bool:
    """bubblewrap 0.8 and later have --disable-userns."""
    bwrap = shutil.which("bwrap")
    return bwrap is not None and "--disable-userns" in _bwrap_usage(bwrap)


@functools.lru_cache(maxsize=8)
def _bwrap_usage(bwrap: str) -> str:
    """`bwrap --help`, which lists the options this bubblewrap knows ("" when it cannot run)."""
    try:
        usage = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=5,
                               env={"PATH": SANDBOX_PATH})
    except (OSError, subprocess.SubprocessError):
        return ""
    return usage.stdout + usage.stderr


@functools.lru_cache(maxsize=8)
def bwrap_sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bubblewrap can bound a tmpfs (--size, 0.7 and later). Without it the sandbox's
    /tmp and /dev/shm may each take half of the host's RAM, which no rlimit charges: said once in
    the log here, and in isolation_available's answer (`openclaw doctor`)."""
    if "--size" in _bwrap_usage(bwrap):
        return True
    log.warning("sandboxed commands run %s (%s)", UNSIZED_TMPFS, bwrap)
    return False


def tmpfs_sizes(limits: Limits) -> tuple[int, int]:
    """(/tmp, /dev/shm) sizes in bytes: together the role's memory limit, /dev/shm a quarter of it.
    Their files are in RAM, as the command's memory is, but RLIMIT_AS does not count them."""
    shm = limits.memory_bytes // SHM_SHARE
    return limits.memory_bytes - shm, shm


def _command_prefix(uid: int = SANDBOX_UID) -> list[str]:
    """As root: become `uid` inside the sandbox, with no capabilities left (bounding set included)
    and no_new_privs, so setuid binaries cannot win them back. A real unprivileged uid is also what
    makes RLIMIT_NPROC count (root ignores it)."""
    if not _is_root():
        return []
    return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]


def _binds(scope: Scope, grants: Grants | None = None, by_fd: bool = True
           ) -> list[tuple[str, str, bool, int | None]]:
    """(destination, source, read-only, descriptor to bind or None: by path) for the workspace and
    the granted paths, parents before children: a later bind over a parent would hide an earlier
    one below it, so a read-only folder inside a writable one must come after it. A read-only
    folder inside the workspace is also re-bound read-only under /workspace, where the command sees
    the workspace. Every path is resolved first (symlinks, ".."; with `grants`, none that a command
    could have made, see sandbox.grants): nesting is decided on the real folders, as the kernel
    sees them, and each granted folder is bound at its real path. With `grants` every bind goes by
    descriptor, the second one of a folder too (a dup): by path, bwrap resolves the source
    (realpath) well before it mounts, so a command running meanwhile that swaps a folder for a link
    in between has bwrap mount what the link named (the daemon's config), or its own folder over
    /usr/bin (see _inside_writable for what a descriptor leaves). Without `by_fd` (a bubblewrap
    before 0.8), by path. A folder sandbox.grants refused is left out either way."""
    if grants is None:
        workspace, workspace_fd = Path(os.path.realpath(scope.workspace)), None
        others = [(Path(os.path.realpath(p)), True, None) for p in scope.read_write]
        others += [(Path(os.path.realpath(p)), False, None) for p in scope.read_only]
    else:
        workspace, workspace_fd = grants.workspace.path, grants.workspace.fd if by_fd else None
        others = [(g.path, g.writable, g.fd if by_fd else None) for g in grants.others
                  if g.refused is None]
    binds = [(WORKSPACE_MOUNT, str(workspace), False, workspace_fd)]
    for path, writable, fd in others:
        binds.append((str(path), str(path), not writable, fd))
        if not writable and path.is_relative_to(workspace) and path != workspace:
            again = None if grants is None or fd is None else grants.dup(fd)
            binds.append((f"{WORKSPACE_MOUNT}/{path.relative_to(workspace)}", str(path), True, again))
    return sorted(binds, key=lambda b: (len(Path(b[0]).parts), b[2]))


def _inside_writable(binds: list[tuple[str, str, bool, int | None]]) -> bool:
    """Whether a bind's destination lies in an earlier writable bind. bwrap reaches it through
    folders a running command can change, after its own check, which compares only the folder
    mounted with the descriptor: the granted folder is still the one bound, but a link put on the
    way (`docs -> ../usr`) lands it over another of the sandbox's folders, such as /usr/bin,
    whose setpriv bwrap runs as root. bwrap_argv then binds the system folders again after."""
    writable: list[Path] = []
    for dest, _, read_only, _ in binds:
        if any(Path(dest).is_relative_to(folder) for folder in writable):
            return True
        if not read_only:
            writable.append(Path(dest))
    return False


def _system_binds_again(binds: list[tuple[str, str, bool, int | None]],
                        grants: Grants | None) -> list[str]:
    """The system folders bound again, over whatever a redirected bind put in them (see
    _inside_writable), then the granted folders inside them, which that hides (each by a
    descriptor of its own, their destinations lying in folders no command can write)."""
    again = [path for path in SYSTEM_DIRS if os.path.isdir(path) and not os.path.islink(path)]
    args: list[str] = []
    for path in again:
        args += ["--ro-bind", path, path]
    for dest, source, read_only, fd in binds:
        if any(Path(dest).is_relative_to(path) for path in again):
            if grants is not None and fd is not None:
                args += ["--ro-bind-fd" if read_only else "--bind-fd", str(grants.dup(fd)), dest]
            else:
                args += ["--ro-bind" if read_only else "--bind", source, dest]
    return args


def _parent_dirs(destinations: list[str]) -> list[str]:
    """Folders to create on the sandbox's root for the binds, with a usable mode: as root bwrap
    would make them 0700, which the command's uid could not walk through. Those under another bind
    or a system folder exist already."""
    covered = [*destinations, *SYSTEM_DIRS]  # /etc, /proc, /dev hold only what we put there
    wanted: set[str] = set()
    for dest in destinations:
        for parent in Path(dest).parents:
            if (str(parent) not in ("/", "/tmp", "/etc", "/proc", "/dev")
                    and not any(parent.is_relative_to(c) for c in covered)):
                wanted.add(str(parent))
    return sorted(wanted, key=lambda d: len(Path(d).parts))


def _seccomp_args(filter_fd: int | None) -> list[str]:
    """bwrap reads the filter from `filter_fd` (see seccomp.program_fd) and loads it right before it
    starts the command; if the kernel refuses it, bwrap fails and nothing runs. None: this CPU has
    no filter (see sandbox.seccomp)."""
    return [] if filter_fd is None else ["--seccomp", str(filter_fd)]


def _pass_fds(filter_fd: int | None) -> tuple[int, ...]:
    return () if filter_fd is None else (filter_fd,)


def _mount_args(bwrap: str, limits: Limits) -> list[str]:
    # /dev/shm: bwrap's --dev leaves it root's and 0755, so as root the sandbox uid could not use
    # POSIX shared memory (Python's multiprocessing locks and queues need it). Both tmpfs get a size
    # (see tmpfs_sizes) where bwrap can set one: without, each may grow to half of the host's RAM.
    tmp, shm = tmpfs_sizes(limits)
    sized = bwrap_sizes_tmpfs(bwrap)
    return ["--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", *(["--size", str(shm)] if sized else []), "--tmpfs", "/dev/shm",
            "--perms", "1777", *(["--size", str(tmp)] if sized else []), "--tmpfs", "/tmp"]


def bwrap_argv(bwrap: str, command: str, scope: Scope, env: dict[str, str],
               filter_fd: int | None, link: network.Link | None = None,
               limits: Limits = Limits(), grants: Grants | None = None) -> list[str]:
    """The full bubblewrap command line for one shell command; `link`: its network, when granted;
    `limits`: the role's, which size /tmp and /dev/shm; `grants`: the scope's folders, open (see
    sandbox.grants), bound by descriptor where bwrap can (pass `bound_fds(argv)` to it)."""
    argv = [bwrap, *_namespace_args(), *_seccomp_args(filter_fd), *_system_args()]
    argv += link.bwrap_args if link else []
    argv += _mount_args(bwrap, limits)
    # Extra binds come after /tmp's tmpfs so a granted path under /tmp is not hidden by it.
    by_fd = grants if grants and _bwrap_binds_fds(bwrap) else None
    binds = _binds(scope, grants, by_fd is not None)
    for folder in _parent_dirs([dest for dest, _, _, _ in binds]):
        argv += ["--perms", "0755", "--dir", folder]
    for dest, source, read_only, fd in binds:
        if fd is None:
            argv += ["--ro-bind" if read_only else "--bind", source, dest]
        else:
            argv += ["--ro-bind-fd" if read_only else "--bind-fd", str(fd), dest]
    if _inside_writable(binds):
        argv += _system_binds_again(binds, by_fd)
    argv += ["--chdir", WORKSPACE_MOUNT]
    # bwrap's root is a scratch tmpfs the command could otherwise fill with files of its own, and
    # so is /dev, which an unprivileged daemon's command owns. Neither has a size; both go
    # read-only (not recursively: /dev/shm, /dev/pts and the device nodes stay usable).
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    shell = link.shell(command) if link else ["/bin/sh", "-c", command]
    return [*argv, *_command_prefix(scope.uid), *shell]


def bound_fds(argv: list[str]) -> tuple[int, ...]:
    """The descriptors bwrap binds (and closes before the command runs). Only these may be passed:
    any other would stay open in the command, a way out of its root (openat(fd, ".."))."""
    return tuple(int(argv[i + 1]) for i, arg in enumerate(argv[:-1])
                 if arg in ("--bind-fd", "--ro-bind-fd"))


def _bwrap_binds_fds(bwrap: str) -> bool:
    """Whether this bubblewrap binds a descriptor (--bind-fd); an older one binds by path, after
    sandbox.grants's check, which a command running alongside could then still race."""
    return "--bind-fd" in _bwrap_usage(bwrap)


@functools.lru_cache(maxsize=8)
def isolation_available(bwrap_path: str | None = None) -> tuple[bool, str]:
    """Whether bubblewrap can really create our namespaces and load our seccomp filter here (tried
    once per path), and why not."""
    bwrap = bwrap_path or shutil.which("bwrap")
    if not bwrap or not os.access(bwrap, os.X_OK):
        return False, f"bubblewrap not found ({bwrap_path or 'bwrap on PATH'})"
    if _is_root() and not os.access(SETPRIV, os.X_OK):
        return False, f"{SETPRIV} (util-linux) is missing; it drops root to the sandbox uid"
    try:
        with seccomp.program_fd() as filter_fd:
            argv = [bwrap, *_namespace_args(), *_seccomp_args(filter_fd), *_system_args(),
                    *_mount_args(bwrap, Limits()), "--remount-ro", "/dev", *_command_prefix(),
                    "/bin/sh", "-c", "exit 0"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10,
                                  env={"PATH": SANDBOX_PATH}, pass_fds=_pass_fds(filter_fd))
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{bwrap} could not be started: {exc}"
    if done.returncode != 0:
        why = done.stderr.strip() or f"exit status {done.returncode}"
        return False, f"{bwrap} failed to create namespaces or load the seccomp filter: {why}"
    if filter_fd is None:
        what = (f"bubblewrap ({bwrap}) WITHOUT a seccomp filter: none for this CPU "
                f"({os.uname().machine}), so commands could make user namespaces")
    else:
        what = f"bubblewrap ({bwrap}) with a seccomp filter ({seccomp.SUMMARY})"
    if not bwrap_sizes_tmpfs(bwrap):
        what += f"; {UNSIZED_TMPFS}"
    if not _bwrap_binds_fds(bwrap):
        what += f"; {PATH_BINDS}"
    return True, what


def _tasks_of_uid(uid: int) -> int:
    """Processes and threads the kernel counts against `uid`'s RLIMIT_NPROC right now. The kernel
    charges a task to its real uid; /proc/<pid>'s owner is the effective one, which differs for a
    setuid program the daemon's user started (real uid ours, not counted) and for a process that only
    took our uid as its effective one (counted, though the kernel does not)."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as status:
                for line in status:  # "Uid:" (real, effective, ...) comes before "Threads:"
                    if line.startswith(b"Uid:") and int(line.split()[1]) != uid:
                        break
                    if line.startswith(b"Threads:"):
                        count += int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            pass  # it exited while we looked
    return count


def _set_rlimits(limits: Limits, nproc: int, cgroup_procs: bytes | None = None) -> None:
    """Runs in the child between fork and exec; the limits are inherited by bwrap and the command,
    and so is its cgroup (`cgroup_procs`: the command's; see sandbox.cgroups)."""
    def set_limit(kind: int, value: int) -> None:
        resource.setrlimit(kind, (value, value))

    if cgroup_procs is not None:
        cgroups.join(cgroup_procs)

    # Memory no rlimit charges (SysV shared memory, memfds, many processes each under RLIMIT_AS)
    # can still run the host out: the kernel's OOM killer is then to pick the command, never the
    # daemon and its model. Raising one's own score needs no privilege; the command inherits it.
    # First, and with bare system calls: under the limits below this child, which still holds
    # all of the daemon's descriptors and its address space, could open and allocate nothing. Best
    # effort: without /proc the command still runs, only the OOM killer's choice is the kernel's.
    with contextlib.suppress(OSError):
        score = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(score, OOM_SCORE_ADJ)
        finally:
            os.close(score)
    # SIGXCPU at the limit (the shell reports 152, which says "CPU time"), SIGKILL a second later
    # for a command that catches it.
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    set_limit(resource.RLIMIT_AS, limits.memory_bytes)
    set_limit(resource.RLIMIT_FSIZE, limits.file_size_bytes)
    set_limit(resource.RLIMIT_NPROC, nproc)
    set_limit(resource.RLIMIT_NOFILE, limits.open_files)
    set_limit(resource.RLIMIT_CORE, 0)


def hand_over(workspace_fd: int, uid: int) -> None:
    """Hand the workspace's top folder, open as `workspace_fd` (sandbox.grants: never through a
    link a command put on the way to it, such as one to /etc), to the user's sandbox uid when we are
    root, so their commands, and the files skill acting as them, can work in it. Only the top
    folder: files the admin placed inside keep their owner and mode."""
    if not _is_root():
        return
    folder = f"/proc/self/fd/{workspace_fd}"  # the folder checked is the folder changed
    if os.stat(folder).st_uid != uid:
        os.chown(folder, uid, uid)


class _OutputBudget:
    """One byte budget shared by stdout and stderr; what is over it is read and dropped."""

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.limit = limit
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader) -> str:
        kept = bytearray()
        cut = False
        while chunk := await stream.read(READ_CHUNK):
            take = min(len(chunk), self.left)
            kept += chunk[:take]
            self.left -= take
            if take < len(chunk):
                cut = self.truncated = True
        text = kept.decode("utf-8", errors="replace")
        if cut:
            text += f"\n[output cut at {self.limit} bytes]\n"
        return text


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group we started (bwrap, or the unsandboxed shell), and the children of
    its leader: bwrap's child, the sandbox's pid 1, runs in a session of its own (--new-session).
    It normally dies with bwrap (--die-with-parent), but bwrap re-arms that only after it drops
    privileges, a few milliseconds in; a kill before then (a /stop right after the start) would
    leave it, and the command, running. Killing the pid namespace's pid 1 ends all of it. The group
    is stopped first so that its leader cannot start another child while we look."""
    try:
        os.killpg(pgid, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return  # the group is already gone
    try:
        children = Path(f"/proc/{pgid}/task/{pgid}/children").read_text().split()
    except OSError:  # the leader has exited, or a kernel without CONFIG_PROC_CHILDREN
        children = []
    for child in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(child), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _exited_within(proc: asyncio.subprocess.Process, seconds: float) -> bool:
    """Whether the process exited in time. Not proc.wait(): on Python 3.11 that also waits for the pipes
    to close, so a background child holding stdout would keep it (and us) waiting to the wall limit."""
    deadline = time.monotonic() + seconds
    while proc.returncode is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(EXIT_POLL_S, left))
    return True


async def _ended_within(proc: asyncio.subprocess.Process, seconds: float,
                        watch: CommandWatch) -> tuple[bool, str | None]:
    """(exited, why it was killed for its disk use): the wall-clock wait of _exited_within, cut
    short when the disk watch finds the command over its budget."""
    if not watch.active:
        return await _exited_within(proc, seconds), None
    waiting = asyncio.create_task(_exited_within(proc, seconds))
    watching = asyncio.create_task(watch.overrun())
    try:
        await asyncio.wait({waiting, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when we are cancelled (/stop): the caller kills the group
        waiting.cancel()
        watching.cancel()
    if waiting.done() and not waiting.cancelled() and waiting.result():
        return True, None
    if watching.done() and not watching.cancelled():
        return False, watching.result()
    return False, None  # the wall-clock limit


async def run_command(command: str, scope: Scope, limits: Limits, *, bwrap_path: str | None = None,
                      allow_unsandboxed: bool = False, env: dict[str, str] | None = None,
                      slirp4netns_path: str | None = None, min_free_bytes: int = 0,
                      protected: tuple[Path, ...] = ()) -> Result:
    """Run `/bin/sh -c command` in the sandbox and return its (possibly cut) output and status.
    `min_free_bytes`: free space to keep on every filesystem it can write and on those of
    `protected` (the daemon's data folder); refused with DiskFull when the workspace is at its
    quota (limits.disk_bytes) or one of them is under that already."""
    ok, why = await asyncio.to_thread(isolation_available, bwrap_path)
    if not ok and not allow_unsandboxed:
        raise SandboxUnavailable(f"cannot run sandboxed commands: {why}. {FIX_HINT}")
    linked = ok and scope.network
    if linked and (lacking := network.missing(slirp4netns_path)):
        raise SandboxUnavailable(f"cannot run commands with network: {lacking}. {network.INSTALL_HINT}")
    # Opened once, and kept open while it runs: handed over, measured and bound as they are now
    # (sandbox.grants), whatever a command running meanwhile renames. Closed if we are cancelled
    # while the thread opens them.
    with await run_to_end(asyncio.to_thread(_open_grants, scope), Grants.close) as grants:
        await asyncio.to_thread(hand_over, grants.workspace.fd, scope.uid)
        # The read_write folders it will have, where they really are: not the configured paths,
        # which a link put where a left-out folder was would lead to another filesystem's free
        # space. Then the one walk of the workspace a command costs (none without a quota);
        # raises DiskFull.
        writable = tuple(g.path for g in grants.others if g.writable and g.fd is not None)
        watch = await asyncio.to_thread(CommandWatch, scope.workspace, writable, protected,
                                        quota=limits.disk_bytes, reserve=min_free_bytes)
        home = WORKSPACE_MOUNT if ok else str(scope.workspace)
        clean_env = {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", **(env or {})}

        # RLIMIT_NPROC counts every task of the uid. As root the command gets a uid of its own; as an
        # unprivileged daemon it shares ours, whose threads (the engine's, asyncio's) must not count. A
        # snapshot: tasks of ours that start while the command runs (Python 3.11's waitpid thread for
        # this very process, say) come out of its budget, and ones that end add to it.
        nproc = limits.processes + (0 if _is_root() else await asyncio.to_thread(_tasks_of_uid, os.getuid())
                                    # slirp4netns, started after this count, runs as our uid too
                                    + (1 if linked else 0))
        # The command's memory, all of its processes together (sandbox.cgroups); removed after it.
        async with cgroups.command_group(limits.memory_bytes) as group:
            spawn = functools.partial(
                asyncio.create_subprocess_exec, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env,
                start_new_session=True,
                preexec_fn=functools.partial(_set_rlimits, limits, nproc, group and group.procs_path))
            started = time.monotonic()
            # One deadline for all of the run: a network's setup takes its time out of wall_seconds.
            deadline = started + limits.wall_seconds
            # The link (and the slirp4netns it starts) is closed after the sandbox is killed, however the
            # run ends: normally, at the wall limit, on an error or a cancellation.
            async with (network.Link(network.locate(slirp4netns_path)) if linked
                        else contextlib.nullcontext()) as link:
                if ok:
                    proc = await _start_bwrap(bwrap_path, command, scope, limits, clean_env, spawn,
                                              link, grants)
                    left_out = grants.refused
                else:
                    proc = await _start(spawn(*_command_prefix(scope.uid), "/bin/sh", "-c", command,
                                              cwd=scope.workspace))
                    left_out = []
                # Our own readers, never communicate(): output survives a timeout, and a background child
                # that keeps the pipe open cannot make us wait forever (see NOTES.md, Sandboxing).
                budget = _OutputBudget(limits.output_bytes)
                readers = [asyncio.create_task(budget.drain(proc.stdout)),
                           asyncio.create_task(budget.drain(proc.stderr))]
                try:
                    # connect() is False when bwrap failed in its setup: its stderr is then the answer.
                    if link is not None:
                        await link.connect(lambda: proc.returncode is None, deadline - time.monotonic())
                    exited, disk_exceeded = await _ended_within(proc, deadline - time.monotonic(), watch)
                    timed_out = not exited and disk_exceeded is None
                    killed = not exited
                except network.NetworkUnavailable as exc:
                    for task in readers:
                        task.cancel()
                    raise SandboxUnavailable(f"cannot run commands with network: {exc}. {exc.hint}") from None
                finally:
                    # Also on normal exit: whatever the command left running in its group
                    # (`sleep 1000 &`) goes too.
                    _kill_group(proc.pid)
            memory_exceeded = group is not None and group.out_of_memory()
            if disk_exceeded is None and watch.active:
                # Once more, with nothing of the command left to race the measure: one quicker than the
                # watch's first look, or one that hid from its walks, is reported (the next is refused).
                disk_exceeded = await asyncio.to_thread(watch.after)
            if disk_exceeded:
                log.warning("a command in %s went over its disk budget%s: %s", scope.workspace,
                            " (killed)" if killed else "", disk_exceeded)
            done, pending = await asyncio.wait(readers, timeout=DRAIN_GRACE_S)
            for task in pending:
                task.cancel()
            stdout, stderr = (task.result() if task in done else "" for task in readers)
            return Result(exit_status=None if killed else proc.returncode, stdout=stdout,
                          stderr=stderr, timed_out=timed_out, truncated=budget.truncated,
                          duration_s=time.monotonic() - started,
                          isolation="bubblewrap" if ok else "none", disk_exceeded=disk_exceeded,
                          memory_exceeded=memory_exceeded, left_out=tuple(left_out))


async def _start_bwrap(bwrap_path: str | None, command: str, scope: Scope, limits: Limits,
                       env: dict[str, str], spawn: Callable[..., Awaitable[asyncio.subprocess.Process]],
                       link: network.Link | None, grants: Grants) -> asyncio.subprocess.Process:
    bwrap = bwrap_path or shutil.which("bwrap") or "bwrap"
    for why in grants.refused:
        log.warning("a command of %s runs without a granted folder: %s", scope.workspace, why)
    # bwrap has its own copies of the filter and the folders once started.
    with seccomp.program_fd() as filter_fd:
        argv = bwrap_argv(bwrap, command, scope, env, filter_fd, link, limits, grants)
        fds = _pass_fds(filter_fd) + (link.pass_fds if link else ()) + bound_fds(argv)
        proc = await _start(spawn(*argv, pass_fds=fds, stdin=link.stdin if link else subprocess.DEVNULL))
    if link is not None:
        link.spawned()
    return proc


def _open_grants(scope: Scope) -> Grants:
    """The scope's folders, open for bwrap to bind (sandbox.grants), or why the command cannot run."""
    try:
        return Grants.of(scope)
    except UnsafeGrant as exc:
        raise SandboxUnavailable(f"refused to run the command: {exc}") from None
    except (FileNotFoundError, NotADirectoryError) as exc:
        if exc.filename != str(scope.workspace):
            raise SandboxUnavailable(f"cannot open the granted folder {exc.filename}: "
                                     f"{exc.strerror}; create it, or take it out of the role") from None
        raise ValueError(f"{exc.filename} is not a directory; create it first") from None
    except OSError as exc:
        raise SandboxUnavailable(f"cannot open the granted folder {exc.filename}: {exc.strerror}; "
                                 "create it, or take it out of the role") from None


async def _start(spawning: Awaitable[asyncio.subprocess.Process]) -> asyncio.subprocess.Process:
    """Start the process even when cancelled meanwhile (/stop, a tool timeout). A cancellation that
    lands inside create_subprocess_exec leaves the child running where nobody will kill it, and
    can hang the caller (python/cpython#103847), so the start runs to its end; a process started
    for a cancelled caller is killed, with its group, at once."""
    try:
        return await run_to_end(spawning, lambda proc: _kill_group(proc.pid))
    except subprocess.SubprocessError as exc:  # from _set_rlimits, in the child before exec
        raise SandboxUnavailable(f"cannot start the command: its memory cgroup or its limits "
                                 f"could not be set ({exc})") from None


@dataclass(frozen=True)
class Sandbox:
    """The runner as the daemon configured it ([sandbox] in the config): what skills are handed."""

    bwrap_path: str | None = None
    allow_unsandboxed: bool = False
    slirp4netns_path: str | None = None  # None: slirp4netns on PATH
    # Free space every command leaves on what it can write and on data_dir's filesystem, where the
    # store is ([sandbox] min_free_disk_mb; its default here too). 0: none.
    min_free_disk_bytes: int = 1 << 30
    data_dir: Path | None = None

    async def run(self, command: str, scope: Scope, limits: Limits,
                  env: dict[str, str] | None = None) -> Result:
        return await run_command(command, scope, limits, bwrap_path=self.bwrap_path,
                                 allow_unsandboxed=self.allow_unsandboxed, env=env,
                                 slirp4netns_path=self.slirp4netns_path,
                                 min_free_bytes=self.min_free_disk_bytes,
                                 protected=() if self.data_dir is None else (self.data_dir,))

    async def network(self) -> tuple[bool, str]:
        """(works, what): whether commands of roles granted network can run, for `doctor`: one
        real sandboxed command that must find its interface and default route."""
        isolated, why = await asyncio.to_thread(isolation_available, self.bwrap_path)
        if not isolated:
            return False, f"needs bubblewrap first: {why}"
        with tempfile.TemporaryDirectory(prefix="openclaw-netcheck-") as folder:
            try:
                # Not under the disk budget: a full disk is doctor's disk line, not the network's.
                result = await run_command(
                    "cat /proc/net/route", Scope(Path(folder), network=True),
                    Limits(wall_seconds=10, disk_bytes=0), bwrap_path=self.bwrap_path,
                    allow_unsandboxed=self.allow_unsandboxed, slirp4netns_path=self.slirp4netns_path)
            except SandboxUnavailable as exc:
                return False, str(exc)
        routes = [line.split()[:2] for line in result.stdout.splitlines()[1:]]
        if result.exit_status == 0 and [network.TAP, "00000000"] in routes:
            return True, (f"own namespace, user-mode NAT via {network.locate(self.slirp4netns_path)}; "
                          "the host's loopback and abstract sockets out of reach")
        return False, (f"a test command found no default route via {network.TAP} (exit status "
                       f"{result.exit_status}): {(result.stderr or result.stdout).strip()[-300:]}")

    def isolation(self) -> tuple[bool, str, bool]:
        """(usable, what, whole): whether commands can run, under which isolation, and whether it
        has every layer this runner adds (a seccomp filter, sized /tmp and /dev/shm, folders bound
        by descriptor), for `doctor`:
        usable but not whole is working, with a gap the admin should close."""
        ok, why = isolation_available(self.bwrap_path)
        if ok:
            bwrap = self.bwrap_path or shutil.which("bwrap") or "bwrap"
            return True, why, seccomp.supported() and bwrap_sizes_tmpfs(bwrap) and \
                _bwrap_binds_fds(bwrap)
        if self.allow_unsandboxed:
            return True, f"NONE: commands run unsandboxed (allow_unsandboxed = true; {why})", False
        return False, f"unavailable: {why}", False
