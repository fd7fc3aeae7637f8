"""bubblewrap's command line for one sandboxed shell command, and what this host's bubblewrap can do.

New user, pid, ipc, uts, cgroup and net namespaces, a read-only system, the workspace bound read-write
at /workspace, all capabilities dropped, a cleared environment, and the seccomp filter of
sandbox.seccomp. When the daemon is root, bwrap runs as root without a user namespace (so it can bind
any granted path) and the command becomes a real unprivileged uid through setpriv, with no
capabilities and no_new_privs: root would ignore RLIMIT_NPROC and keep every capability.

/tmp and /dev/shm are tmpfs, whose pages no rlimit charges: bwrap --size (0.7 and later) bounds them
together by the role's memory limit, and /dev is read-only.

Pseudo-terminals come from a pool the kernel shares among every devpts instance (kernel.pty.max less
the host's reserve: 3072 by default), so one command holding them all would leave every other
sandbox none. bwrap's --dev mounts a devpts instance of the sandbox's own, without a bound; as root
it is remounted, just before setpriv, with `max=` the role's `ptys`. An unprivileged daemon cannot
(its command has no capability left to mount with), so its commands get no ptys at all: an empty,
read-only /dev/pts, where /dev/ptmx leads nowhere. An older bwrap cannot size them (nor
bind by descriptor, 0.8): commands still run, and `isolation_available` and the log say so.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

from sandbox import network, seccomp
from sandbox.grants import Grants
from sandbox.scope import SANDBOX_UID, WORKSPACE_MOUNT, Limits, Scope

log = logging.getLogger(__name__)

SETPRIV = "/usr/bin/setpriv"
MOUNT = "/usr/bin/mount"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
DEFAULT_LIMITS = Limits()  # frozen: one shared default is safe
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
        # a 0700 home), and setpriv (see command_prefix) makes the command a real unprivileged uid.
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


def command_prefix(uid: int = SANDBOX_UID) -> list[str]:
    """As root: become `uid` inside the sandbox, with no capabilities left (bounding set included)
    and no_new_privs, so setuid binaries cannot win them back. A real unprivileged uid is also what
    makes RLIMIT_NPROC count (root ignores it)."""
    if not _is_root():
        return []
    return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]


def pty_bound(limits: Limits) -> list[str]:
    """As root: the command line that remounts the sandbox's own devpts with at most `limits.ptys`
    ptys, then runs the rest of it (setpriv, the command) in its place; as root, before setpriv
    drops it. If the remount fails the command does not run. A remount resets every option not
    given: these are the ones bwrap's --dev mounts with."""
    if not _is_root():
        return []
    # max=0 would be no bound at all to the kernel (it allocates below max - 1, unsigned).
    options = f"remount,nosuid,noexec,ptmxmode=0666,mode=620,max={max(limits.ptys, 1)}"
    return ["/bin/sh", "-c", f'{MOUNT} -o {options} /dev/pts && exec "$@"', "sh"]


def _binds(scope: Scope, grants: Grants | None = None, by_fd: bool = True
           ) -> list[tuple[str, str, bool, int | None]]:
    """(destination, source, read-only, descriptor to bind or None: by path) for the workspace and
    the granted paths, parents before children: a later bind over a parent would hide one below
    it. A read-only folder inside the workspace is bound again, read-only, under /workspace. Paths
    are resolved first (with `grants`, through no link a command made), so nesting is decided on
    the real folders. With `grants` every bind goes by descriptor (a dup for a second bind): by
    path, bwrap resolves the source well before it mounts, and a command could swap a folder for
    a link meanwhile. Without `by_fd` (bubblewrap before 0.8), by path. Refused folders are left out."""
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
    """Whether a bind's destination lies in an earlier writable bind: bwrap reaches it through
    folders a running command can change, so a link put on the way (`docs -> ../usr`) could land
    the granted folder over /usr/bin, whose setpriv bwrap runs as root. bwrap_argv then binds the
    system folders again after."""
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


def filter_fds(filter_fd: int | None) -> tuple[int, ...]:
    """The descriptor bwrap reads the seccomp filter from (see _seccomp_args), to pass to it."""
    return () if filter_fd is None else (filter_fd,)


def _mount_args(bwrap: str, limits: Limits) -> list[str]:
    # /dev/shm: bwrap's --dev leaves it root's and 0755, so as root the sandbox uid could not use
    # POSIX shared memory (Python's multiprocessing locks and queues need it). Both tmpfs get a size
    # (see tmpfs_sizes) where bwrap can set one: without, each may grow to half of the host's RAM.
    tmp, shm = tmpfs_sizes(limits)
    sized = bwrap_sizes_tmpfs(bwrap)
    # An unprivileged daemon's command gets no ptys (see pty_bound): its user namespace's devpts is
    # covered by an empty folder it cannot write.
    no_ptys = [] if _is_root() else ["--tmpfs", "/dev/pts", "--remount-ro", "/dev/pts"]
    return ["--proc", "/proc", "--dev", "/dev", *no_ptys,
            "--perms", "1777", *(["--size", str(shm)] if sized else []), "--tmpfs", "/dev/shm",
            "--perms", "1777", *(["--size", str(tmp)] if sized else []), "--tmpfs", "/tmp"]


def bwrap_argv(bwrap: str, command: str, scope: Scope, env: dict[str, str],
               filter_fd: int | None, link: network.Link | None = None,
               limits: Limits = DEFAULT_LIMITS, grants: Grants | None = None) -> list[str]:
    """The full bubblewrap command line for one shell command; `link`: its network, when granted;
    `limits`: the role's, which size /tmp and /dev/shm; `grants`: the scope's folders, open (see
    sandbox.grants), bound by descriptor where bwrap can (pass `bound_fds(argv)` to it)."""
    argv = [bwrap, *_namespace_args(), *_seccomp_args(filter_fd), *_system_args()]
    argv += link.bwrap_args if link else []
    argv += _mount_args(bwrap, limits)
    # Extra binds come after /tmp's tmpfs so a granted path under /tmp is not hidden by it.
    by_fd = grants if grants and bwrap_binds_fds(bwrap) else None
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
    return [*argv, *pty_bound(limits), *command_prefix(scope.uid), *shell]


def bound_fds(argv: list[str]) -> tuple[int, ...]:
    """The descriptors bwrap binds (and closes before the command runs). Only these may be passed:
    any other would stay open in the command, a way out of its root (openat(fd, ".."))."""
    return tuple(int(argv[i + 1]) for i, arg in enumerate(argv[:-1])
                 if arg in ("--bind-fd", "--ro-bind-fd"))


def bwrap_binds_fds(bwrap: str) -> bool:
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
    if _is_root() and not os.access(MOUNT, os.X_OK):
        return False, f"{MOUNT} (util-linux) is missing; it bounds the sandbox's ptys"
    try:
        with seccomp.program_fd() as filter_fd:
            argv = [bwrap, *_namespace_args(), *_seccomp_args(filter_fd), *_system_args(),
                    *_mount_args(bwrap, DEFAULT_LIMITS), "--remount-ro", "/dev",
                    *pty_bound(DEFAULT_LIMITS), *command_prefix(), "/bin/sh", "-c", "exit 0"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=10,
                                  env={"PATH": SANDBOX_PATH}, pass_fds=filter_fds(filter_fd))
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
    what += (f"; at most {DEFAULT_LIMITS.ptys} ptys per command" if _is_root() else
             "; no ptys for commands (only a root daemon can give each sandbox a bounded number)")
    if not bwrap_sizes_tmpfs(bwrap):
        what += f"; {UNSIZED_TMPFS}"
    if not bwrap_binds_fds(bwrap):
        what += f"; {PATH_BINDS}"
    return True, what

