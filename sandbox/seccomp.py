"""The sandbox's seccomp filter: a classic BPF program, built here, that bubblewrap loads (`--seccomp FD`)
just before it starts the command, so the command and everything it starts are bound by it.

What it refuses, and why (each rule is a way into the kernel that shell commands do not need):

- New user namespaces: `unshare` and `clone` with CLONE_NEWUSER get EPERM. In a user namespace of its
  own a process has every capability over it and the namespaces it creates there, which reaches
  kernel code (mounting filesystems, netfilter, ...) otherwise kept from unprivileged users. As
  root, bwrap makes no user namespace and the command runs as a plain uid that could make one; as
  an unprivileged daemon `--disable-userns` already stops it, and this filter makes sure of it.
- `clone3` gets ENOSYS: its flags sit in a struct in memory, which seccomp cannot read, so it cannot
  be checked for CLONE_NEWUSER. glibc (pthread_create, posix_spawn) then falls back to `clone`.
- Reserving disk space gets EOPNOTSUPP: `fallocate` (except punching a hole, which frees space) and
  the ioctls that do the same (FS_IOC_RESVSP, FS_IOC_RESVSP64, FS_IOC_ZERO_RANGE, and XFS's
  ALLOCSP). Each reserves gigabytes in an instant, past RLIMIT_FSIZE too, faster than the disk
  budget's watch looks (sandbox.disk_budget): one command could fill the disk between two looks.
  Refused, glibc's posix_fallocate writes the blocks itself, at the disk's speed, which the watch
  keeps up with; the `fallocate` command says the filesystem does not support it.
- EPERM for a short list of interfaces an unprivileged process can still reach (some only under
  the host's sysctls) that keep yielding privilege escalations (see DENIED). Calls the kernel already
  refuses to a process without capabilities (module loading, kexec, mount, open_by_handle_at, ...)
  are left to it: now that no user namespace can give the command capabilities, a rule would add
  nothing.
- Sockets of any family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK get EAFNOSUPPORT, from
  `socket` and `socketpair` (io_uring, whose IORING_OP_SOCKET would bypass this, is refused whole).
  Some families are in no namespace: AF_VSOCK would let a command without network listen on, or
  connect to, the host's vsock ports (on a VM, the hypervisor's services); the others (AF_PACKET,
  AF_XDP, AF_ALG, Bluetooth, ...) are kernel code no shell command needs. Netlink is kept for
  NETLINK_ROUTE (getifaddrs, `ip`, if_nameindex) and NETLINK_SOCK_DIAG (`ss`), both answering about
  the sandbox's own network namespace; its other protocols (device events, generic netlink's many
  families, ...) get EPROTONOSUPPORT.
- Any other ABI than the host's native one is killed (SIGSYS): on x86_64 the i386 entry (`int 0x80`)
  and x32 calls (numbers with bit 30 set), on aarch64 32-bit ARM. Their syscall numbers differ, so
  the rules above would not match them. 32-bit programs therefore cannot run in the sandbox.

The filter is built for the machine the daemon runs on (bwrap loads it on the same kernel). On a CPU
whose syscall table we do not carry (riscv64, ppc64le, s390x, ...), `program` raises
UnsupportedArchitecture and the runner uses bubblewrap without the filter, saying so in `openclaw
doctor`: the namespaces, the uid drop and the rlimits still hold, which is far better than no
sandbox at all, the only other choice an admin would have.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

# Refused with EPERM. Each can be reached by an unprivileged process on some hosts, no shell command
# needs it, and each has a long record of kernel privilege-escalation bugs.
DENIED = (
    # The kernel keyrings are not namespaced: a uid's keyrings outlive the command and are shared by
    # all of one user's commands; and a recurring source of refcount and use-after-free bugs.
    "keyctl", "add_key", "request_key",
    # eBPF's verifier and JIT are a rich exploit target; unprivileged use is refused only where
    # kernel.unprivileged_bpf_disabled is set.
    "bpf",
    # Open to unprivileged processes up to kernel.perf_event_paranoid = 2 (the usual default): a large
    # driver surface with many CVEs, and timing side channels.
    "perf_event_open",
    # Lets an exploit stall the kernel in the middle of a copy from user memory, turning races into
    # reliable exploits (where vm.unprivileged_userfaultfd = 1).
    "userfaultfd",
    # io_uring is a second syscall interface with its own long list of CVEs (disabled on ChromeOS,
    # Android, Docker's default profile); io_uring_enter/register need the fd only this creates.
    # Programs that can use it fall back to plain syscalls.
    "io_uring_setup",
)
SUMMARY = (f"no user namespaces; {', '.join(DENIED)} refused; no disk reserved by fallocate; "
           "sockets of AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK only")

# What `socket`/`socketpair` may make (linux/socket.h): AF_UNIX, AF_INET, AF_INET6; and AF_NETLINK,
# with the protocols of linux/netlink.h named in the docstring: NETLINK_ROUTE and NETLINK_SOCK_DIAG.
SOCKET_FAMILIES = (1, 2, 10)
AF_NETLINK = 16
NETLINK_PROTOCOLS = (0, 4)

CLONE_NEWUSER = 0x10000000
FALLOC_PUNCH_HOLE = 0x03  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE: the one mode that frees space
# _IOW('X', 40 / 42 / 57, struct space_resv): the generic ioctls that preallocate like fallocate
# (FS_IOC_RESVSP, RESVSP64, ZERO_RANGE); and _IOW('X', 10 / 36): XFS_IOC_ALLOCSP and ALLOCSP64,
# which allocate up to an offset on XFS in kernels before 5.17.
RESERVING_IOCTLS = (0x40305828, 0x4030582A, 0x40305839, 0x4030580A, 0x40305824)

# From the kernel's tables: arch/x86/entry/syscalls/syscall_64.tbl, and for aarch64 the generic
# table (include/uapi/asm-generic/unistd.h). Both are little-endian, which ARG0_LOW below relies on.
_X86_64 = {"clone": 56, "unshare": 272, "clone3": 435, "keyctl": 250, "add_key": 248,
           "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
           "io_uring_setup": 425, "fallocate": 285, "ioctl": 16, "socket": 41, "socketpair": 53}
_AARCH64 = {"clone": 220, "unshare": 97, "clone3": 435, "keyctl": 219, "add_key": 217,
            "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
            "io_uring_setup": 425, "fallocate": 47, "ioctl": 29, "socket": 198, "socketpair": 199}


@dataclass(frozen=True)
class Arch:
    audit_arch: int  # what seccomp_data.arch holds for the native ABI (linux/audit.h)
    syscalls: dict[str, int]
    x32_bit: int = 0  # x86_64: x32 calls are numbered from here


ARCHES = {
    "x86_64": Arch(audit_arch=0xC000003E, syscalls=_X86_64, x32_bit=0x40000000),
    "aarch64": Arch(audit_arch=0xC00000B7, syscalls=_AARCH64),
}


class UnsupportedArchitecture(Exception):
    """No syscall table for this CPU, so no filter: the sandbox must not run."""


# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
NR, ARCH, ARG0_LOW, ARG1_LOW, ARG2_LOW = 0, 4, 16, 24, 32
# Classic BPF opcodes (linux/filter.h) and seccomp return actions (linux/seccomp.h).
LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
KILL_PROCESS, ERRNO, ALLOW = 0x80000000, 0x00050000, 0x7FFF0000


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    """One struct sock_filter; jt/jf: how many instructions to skip when the test holds / fails."""
    return struct.pack("=HBBI", code, jt, jf, k)


def _refuse(nr: int, error: int) -> list[bytes]:
    return [_op(JEQ, nr, jf=1), _op(RET, ERRNO | error)]


def _sockets(nr: dict[str, int]) -> list[bytes]:
    """socket(family, type, protocol) and socketpair(family, ...): the family (an int: the low word
    is all the kernel reads) must be one of SOCKET_FAMILIES, or AF_NETLINK with one of
    NETLINK_PROTOCOLS."""
    families, protocols = len(SOCKET_FAMILIES), len(NETLINK_PROTOCOLS)
    # From the family's load: the family tests, netlink's, the protocol's load and tests, then
    # RET EPROTONOSUPPORT, RET EAFNOSUPPORT, RET ALLOW (jumps count the instructions skipped).
    body = [_op(LD_W_ABS, ARG0_LOW),
            *(_op(JEQ, family, jt=families + protocols + 3 - i) for i, family in enumerate(SOCKET_FAMILIES)),
            _op(JEQ, AF_NETLINK, jf=protocols + 2), _op(LD_W_ABS, ARG2_LOW),
            *(_op(JEQ, protocol, jt=protocols + 1 - i) for i, protocol in enumerate(NETLINK_PROTOCOLS)),
            _op(RET, ERRNO | errno.EPROTONOSUPPORT), _op(RET, ERRNO | errno.EAFNOSUPPORT), _op(RET, ALLOW)]
    return [_op(JEQ, nr["socket"], jt=1), _op(JEQ, nr["socketpair"], jf=len(body)), *body]


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one) as bwrap's --seccomp wants it: sock_filter
    instructions back to back."""
    machine = machine or os.uname().machine
    arch = ARCHES.get(machine)
    if arch is None:
        raise UnsupportedArchitecture(
            f"no seccomp filter for this CPU ({machine}): the sandbox knows the system calls of "
            f"{' and '.join(sorted(ARCHES))} only")
    nr = arch.syscalls
    code = [_op(LD_W_ABS, ARCH), _op(JEQ, arch.audit_arch, jt=1), _op(RET, KILL_PROCESS),
            _op(LD_W_ABS, NR)]
    if arch.x32_bit:
        # Kill x32 calls, except -1 (what a tracer sets to skip a call; the kernel answers ENOSYS).
        code += [_op(JGE, arch.x32_bit, jf=2), _op(JEQ, 0xFFFFFFFF, jt=1), _op(RET, KILL_PROCESS)]
    code += _refuse(nr["clone3"], errno.ENOSYS)
    # fallocate(fd, mode, ...) and ioctl(fd, request, ...): argument 1 (32 bits wide for both).
    not_supported = ERRNO | errno.EOPNOTSUPP
    code += [_op(JEQ, nr["fallocate"], jf=4), _op(LD_W_ABS, ARG1_LOW),
             _op(JEQ, FALLOC_PUNCH_HOLE, jf=1), _op(RET, ALLOW), _op(RET, not_supported)]
    code += [_op(JEQ, nr["ioctl"], jf=len(RESERVING_IOCTLS) + 3), _op(LD_W_ABS, ARG1_LOW),
             *(_op(JEQ, request, jt=len(RESERVING_IOCTLS) - i) for i, request in enumerate(RESERVING_IOCTLS)),
             _op(RET, ALLOW), _op(RET, not_supported)]
    code += _sockets(nr)
    for name in DENIED:
        code += _refuse(nr[name], errno.EPERM)
    # clone and unshare: EPERM when the flags (argument 0 of both, on both arches) ask for a user
    # namespace. The argument is 64 bits wide but CLONE_NEWUSER is bit 28, in the low word, the only
    # one loaded here: whatever the high word holds, the kernel makes a user namespace exactly when
    # that bit is set (clone even ignores the high word).
    code += [_op(JEQ, nr["clone"], jt=1), _op(JEQ, nr["unshare"], jf=3),
             _op(LD_W_ABS, ARG0_LOW), _op(JSET, CLONE_NEWUSER, jf=1), _op(RET, ERRNO | errno.EPERM),
             _op(RET, ALLOW)]
    return b"".join(code)


def supported(machine: str | None = None) -> bool:
    return (machine or os.uname().machine) in ARCHES


@contextlib.contextmanager
def program_fd(machine: str | None = None) -> Iterator[int | None]:
    """A file descriptor holding the filter, read from its start, for bwrap's `--seccomp FD` (pass it
    to the child with pass_fds), or None on a CPU we have no filter for. One per bwrap: reading
    moves the offset that every copy shares."""
    if not supported(machine):
        yield None
        return
    code = program(machine)
    fd = os.memfd_create("openclaw-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, code)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)
