"""Network for a sandbox whose role grants it: the internet as a guest, never the host's own network.

The sandbox always gets a network namespace of its own (bwrap --unshare-net). For a role granted
network, slirp4netns then puts a tap device in it (10.0.2.100, default route via 10.0.2.2, DNS at
10.0.2.3, a generated /etc/resolv.conf) and carries its traffic through ordinary sockets of the host,
like a NAT router: the command reaches the internet, other machines and the host's own non-loopback
addresses (as connections from the host itself), and DNS through the host's resolver, but not what
the host binds on 127.0.0.1 (`--disable-host-loopback`, so 10.0.2.2 does not lead there either) and
not the host's abstract UNIX sockets (X11, D-Bus), which belong to the host's network namespace.

How one run is wired (`Link`), each step because of something we found:
1. bwrap writes its child's pid to `--info-fd`. The command's shell first reads a line from a gate
   pipe (its stdin; the command then gets /dev/null, as always), so it never runs before the network
   is up. Not bwrap's `--block-fd`: bwrap waits on that before it re-arms --die-with-parent and
   ignores end-of-file there, so a daemon that died during the setup left the command running,
   orphaned (seen with bwrap 0.8). The gate is read after bwrap has armed it: if the daemon dies,
   the sandbox dies with it, and end-of-file runs nothing.
2. We open the child's network namespace and the user namespace that owns it (NS_GET_USERNS: as an
   unprivileged daemon bwrap's --disable-userns moves the child into a nested user namespace, which
   has no power over the network namespace; as root there is none and the owner is ours), and check
   it is the namespace bwrap reported and not our own.
3. We wait until bwrap has brought up the sandbox's loopback: slirp4netns brings it up too, and when
   it does so first bwrap's own setup fails.
4. A holder process (nsenter, then `cat`) sits in exactly those two namespaces, and slirp4netns is
   pointed at its pid. Not `--userns-path` with `--netns-type=path`: slirp4netns 1.2 cannot combine
   them with `--enable-sandbox` (rootless-containers/slirp4netns#317), and the sandbox matters: it
   drops slirp4netns's capabilities (as root) and hides the host's files from it, while it parses
   packets the command wrote. The holder is our unreaped child, so its pid cannot be reused, and we
   check it has entered the namespaces before slirp4netns looks them up.
5. slirp4netns writes `--ready-fd` when the network is configured; then the holder goes, and a
   line on the gate lets the command start.
slirp4netns stops when the `--exit-fd` pipe closes (also when the daemon dies) and is killed when the
`Link`'s `async with` is left, whatever ended the run. Neither it nor the holder inherits the
daemon's environment (bot tokens, database passwords): slirp4netns parses every packet the command
sends, so a bug there must find no secrets to take.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

GUEST_ADDRESS = "10.0.2.100"
GATEWAY = "10.0.2.2"
NAMESERVER = "10.0.2.3"
RESOLV_CONF = f"nameserver {NAMESERVER}\n".encode()
# slirp4netns's recommended MTU: fewer, larger packets through its user-space TCP/IP stack.
MTU = 65520
TAP = "tap0"
NSENTER = "/usr/bin/nsenter"
HOLD = "/bin/cat"  # reads the holder's stdin until we close it, or the daemon dies
NS_GET_USERNS = 0xB701  # linux/nsfs.h: _IO(0xb7, 0x1)
SETUP_TIMEOUT_S = 10.0
POLL_S = 0.001
ERROR_TAIL = 600  # characters of slirp4netns's stderr quoted in an error
# The whole environment of slirp4netns and the holder; they need nothing else from it.
HELPER_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

INSTALL_HINT = ("Install it (`apt-get install slirp4netns`), or set `network = false` on the role; "
                "roles without network are not affected.")


class NetworkUnavailable(Exception):
    """slirp4netns is missing, or could not give the sandbox its network. `hint`: what to do."""

    def __init__(self, message: str, hint: str = "`openclaw doctor` runs the same check; or set "
                 "`network = false` on the role") -> None:
        super().__init__(message)
        self.hint = hint


class _SandboxEnded(Exception):
    """bwrap exited during its own setup; its message, in the command's stderr, says why."""


def locate(slirp4netns_path: str | None = None) -> str | None:
    """The slirp4netns to run: `slirp4netns_path` when given (and executable), else the one on PATH."""
    if slirp4netns_path is not None:
        return slirp4netns_path if os.access(slirp4netns_path, os.X_OK) else None
    return shutil.which("slirp4netns")


def missing(slirp4netns_path: str | None = None) -> str | None:
    """Why a network-granted sandbox cannot run here, or None when its tools are present."""
    if locate(slirp4netns_path) is None:
        where = (f"not found at {slirp4netns_path}" if slirp4netns_path else
                 "is not installed (not on PATH)")
        return (f"slirp4netns {where}; the sandbox gives network through it, in a namespace of "
                "its own, never the host's")
    if not os.access(NSENTER, os.X_OK):
        return f"{NSENTER} (util-linux) is missing; it attaches slirp4netns to the sandbox"
    return None


class Link:
    """One sandbox's network, from before bwrap starts until the command has ended. Hand
    `bwrap_args`, `pass_fds`, `stdin` and the `shell` command line to bwrap, call `spawned` once it
    runs, then `connect`; leaving the `async with` block stops every process it started.
    `own_stdin`: the program keeps the stdin it was started with (a service's pipe, sandbox.service)
    and its first line is the gate, which the caller writes once `connect` returned True."""

    def __init__(self, slirp4netns: str, *, own_stdin: bool = False) -> None:
        self.slirp4netns = slirp4netns
        self.own_stdin = own_stdin
        self._fds: list[int] = []
        self._info_r, self._info_w = self._pipe(polled=True)
        self._gate_r, self._gate_w = self._pipe()
        self._resolv_r, resolv_w = self._pipe()
        os.write(resolv_w, RESOLV_CONF)  # a few bytes: the pipe holds them until bwrap reads
        self._close(resolv_w)
        self._info = b""
        self._exit_w: int | None = None
        self._holder: subprocess.Popen[bytes] | None = None
        self._slirp: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # slirp4netns's and nsenter's stderr, for errors

    async def __aenter__(self) -> Link:
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Killed at once; reaped in a thread: slirp4netns takes 30-50 ms to exit (the kernel tears
        # its tap device down), which would stall every other chat on the event loop. Shielded, so
        # a cancellation does not leave them unreaped.
        reaping = self._kill()
        if reaping:
            await asyncio.shield(asyncio.to_thread(_reap, reaping))

    @property
    def bwrap_args(self) -> list[str]:
        # 0644: bwrap would make the file 0600 and root's, unreadable for the sandbox uid.
        return ["--info-fd", str(self._info_w),
                "--perms", "0644", "--ro-bind-data", str(self._resolv_r), "/etc/resolv.conf"]

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return self._info_w, self._resolv_r

    @property
    def stdin(self) -> int:
        """bwrap's stdin: the gate. (As stdin, not a descriptor of its own: dash redirects only
        descriptors 0 to 9, and a daemon's pipes have higher numbers.)"""
        return self._gate_r

    def shell(self, command: str) -> list[str]:
        """`/bin/sh -c command` once a line has come through the gate, with /dev/null for stdin
        (or, `own_stdin`, the rest of the stdin whose first line was the gate: dash's `read` takes
        a pipe one byte at a time, so it takes no more than that line)."""
        if self.own_stdin:
            return ["/bin/sh", "-c", 'read -r _ && exec /bin/sh -c "$1"', "sh", command]
        return ["/bin/sh", "-c", 'read -r _ && exec /bin/sh -c "$1" </dev/null', "sh", command]

    def spawned(self) -> None:
        """bwrap has its copies now; ours of its ends would hide its exit (no EOF on info)."""
        for fd in (*self.pass_fds, self.stdin):
            self._close(fd)

    async def connect(self, sandbox_running: Callable[[], bool], time_left: float) -> bool:
        """Attach slirp4netns to the sandbox and let the command start. False when the sandbox
        ended during its setup (bwrap's own error then tells why); NetworkUnavailable when its
        network could not be brought up, or not within SETUP_TIMEOUT_S or `time_left`, what is
        left of the run's wall-clock limit: the setup counts in it, the command gets the rest."""
        limit = max(0.0, min(SETUP_TIMEOUT_S, time_left))
        try:
            async with asyncio.timeout(limit):
                await self._attach(sandbox_running)
        except _SandboxEnded:
            return False
        except TimeoutError:
            if limit == SETUP_TIMEOUT_S:
                raise NetworkUnavailable(f"the sandbox's network setup did not finish within "
                                         f"{limit:.3g} s{self._errors()}") from None
            raise NetworkUnavailable(
                f"the sandbox's network setup did not finish within {limit:.3g} s, all that was "
                f"left of the command's wall-clock limit{self._errors()}",
                hint="a longer `wall_seconds` on the role leaves the setup more time") from None
        try:
            if not self.own_stdin:  # else the caller opens the gate on the program's stdin
                os.write(self._gate_w, b"go\n")
        except BrokenPipeError:
            return False  # it has just exited
        finally:
            self._close(self._gate_w)
        return True

    async def _attach(self, sandbox_running: Callable[[], bool]) -> None:
        def poll(check: Callable[[], Any]) -> Any:
            if not sandbox_running():
                raise _SandboxEnded
            return check()

        info = await _until(lambda: poll(self._read_info))
        pid = info["child-pid"]
        netns, userns = await _until(lambda: poll(lambda: self._namespaces(pid, info)))
        await _until(lambda: poll(lambda: _loopback_up(pid)))
        holder = self._hold(netns, userns)
        await _until(lambda: poll(lambda: self._entered(holder, netns, userns)))
        slirp, ready_r = self._start_slirp(holder.pid)
        await _until(lambda: poll(lambda: self._ready(slirp, ready_r)))
        self._release_holder()

    def _read_info(self) -> dict[str, Any] | None:
        """bwrap's JSON once complete; None while it is still coming."""
        try:
            chunk = os.read(self._info_r, 4096)
        except BlockingIOError:
            return None
        if not chunk:
            raise _SandboxEnded  # bwrap closed it without a word: it failed before its child ran
        self._info += chunk
        try:
            return json.loads(self._info)
        except ValueError:
            return None

    def _namespaces(self, pid: int, info: dict[str, Any]) -> tuple[int, int] | None:
        """The sandbox's network namespace and the user namespace that owns it, as descriptors;
        None to be asked again: a process on its way out (bwrap's failed setup) refuses access to
        its /proc entries for an instant before they go, and the next look says it ended."""
        try:
            netns = self._keep(os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        except FileNotFoundError:
            raise _SandboxEnded from None
        except PermissionError:
            return None
        inode, reported = os.fstat(netns).st_ino, info.get("net-namespace")  # bwrap 0.4 and later
        if inode == os.stat("/proc/self/ns/net").st_ino or reported not in (None, inode):
            raise NetworkUnavailable(f"process {pid} is not in the network namespace bwrap made "
                                     f"(bwrap reported {reported}, found {inode})")
        return netns, self._keep(fcntl.ioctl(netns, NS_GET_USERNS))

    def _hold(self, netns: int, userns: int) -> subprocess.Popen[bytes]:
        enter = [f"--net=/proc/self/fd/{netns}"]
        if not _same_namespace(os.fstat(userns), "/proc/self/ns/user"):
            enter = [f"--user=/proc/self/fd/{userns}", "--preserve-credentials", *enter]
        self._holder = self._popen([NSENTER, *enter, "--", HOLD], (netns, userns), stdin=subprocess.PIPE)
        return self._holder

    def _entered(self, holder: subprocess.Popen[bytes], netns: int, userns: int) -> bool | None:
        if holder.poll() is not None:
            raise NetworkUnavailable(f"nsenter could not enter the sandbox's namespaces{self._errors()}")
        try:
            inside = all(_same_namespace(os.fstat(fd), f"/proc/{holder.pid}/ns/{kind}")
                         for fd, kind in ((netns, "net"), (userns, "user")))
        except FileNotFoundError:
            return None
        return inside or None

    def _start_slirp(self, target_pid: int) -> tuple[subprocess.Popen[bytes], int]:
        ready_r, ready_w = self._pipe(polled=True)
        exit_r, self._exit_w = self._pipe()
        argv = [self.slirp4netns, "--configure", f"--mtu={MTU}", "--disable-host-loopback",
                "--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={exit_r}",
                str(target_pid), TAP]
        self._slirp = self._popen(argv, (ready_w, exit_r))
        self._close(ready_w)
        self._close(exit_r)
        return self._slirp, ready_r

    def _ready(self, slirp: subprocess.Popen[bytes], ready_r: int) -> bool | None:
        try:
            if os.read(ready_r, 1):
                return True
        except BlockingIOError:
            if slirp.poll() is None:
                return None
        raise NetworkUnavailable(f"slirp4netns could not set up the sandbox's network{self._errors()}")

    def _release_holder(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None:
            _reap(_kill([holder]))  # nsenter's cat: gone in about a millisecond

    def _kill(self) -> list[subprocess.Popen[bytes]]:
        """SIGKILL slirp4netns and the holder and close every descriptor; the processes, which
        the caller must reap. Safe to call again."""
        procs = [p for p in (self._holder, self._slirp) if p is not None]
        self._holder = self._slirp = None
        if self._exit_w is not None:
            self._close(self._exit_w)
            self._exit_w = None
        for fd in list(self._fds):
            self._close(fd)
        self._log.close()
        return _kill(procs)

    def _popen(self, argv: list[str], fds: tuple[int, ...], **kwargs: Any) -> subprocess.Popen[bytes]:
        # subprocess, not asyncio's: a synchronous start cannot be cut in half by a cancellation,
        # and we are the only ones to wait for these children. A session of their own keeps a
        # terminal's Ctrl-C for the daemon to handle. HELPER_ENV, never the daemon's environment.
        try:
            return subprocess.Popen(argv, pass_fds=fds, stdout=subprocess.DEVNULL, stderr=self._log,
                                    env=HELPER_ENV, start_new_session=True, **kwargs)
        except OSError as exc:
            raise NetworkUnavailable(f"could not start {argv[0]}: {exc}") from None

    def _errors(self) -> str:
        self._log.seek(0)
        text = self._log.read().decode(errors="replace").strip()
        return f": {text[-ERROR_TAIL:]}" if text else ""

    def _pipe(self, polled: bool = False) -> tuple[int, int]:
        """polled: we read it, without blocking; the others' read ends are bwrap's and the
        command's, which wait on them."""
        read, write = os.pipe()
        os.set_blocking(read, not polled)
        self._fds += [read, write]
        return read, write

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd

    def _close(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.remove(fd)
            os.close(fd)


async def _until(check: Callable[[], Any]) -> Any:
    """Poll `check` until it returns something other than None (the caller bounds the time)."""
    while (value := check()) is None:
        await asyncio.sleep(POLL_S)
    return value


def _loopback_up(pid: int) -> bool | None:
    """Whether `lo` is up in `pid`'s network namespace: only an interface that is up has joined the
    all-hosts multicast group that /proc/PID/net/igmp lists."""
    if not os.path.exists("/proc/self/net/igmp"):
        raise NetworkUnavailable("this kernel has no /proc/PID/net/igmp (no IP multicast), "
                                 "which tells when the sandbox's loopback is up")
    try:
        with open(f"/proc/{pid}/net/igmp") as igmp:
            lines = igmp.read().splitlines()
    except (FileNotFoundError, PermissionError):  # PermissionError: on its way out, as above
        # The sandbox ended (a zombie until bwrap reaps it has no net/ either): the caller's
        # check then says so, and bwrap's own error is the answer.
        return None
    return any(line.split()[1:2] == ["lo"] for line in lines[1:] if line[:1].isdigit()) or None


def _same_namespace(fd_stat: os.stat_result, path: str) -> bool:
    other = os.stat(path)
    return (fd_stat.st_dev, fd_stat.st_ino) == (other.st_dev, other.st_ino)


def _kill(procs: list[subprocess.Popen[bytes]]) -> list[subprocess.Popen[bytes]]:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        if proc.stdin is not None:
            proc.stdin.close()
    return procs


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.wait()
