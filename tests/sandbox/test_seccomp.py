"""The seccomp filter: inside the real bubblewrap sandbox no user namespace can be made and the denied
calls fail, while ordinary programs (forks, threads, pipelines) still work; the program itself is
checked against the kernel headers, a model of the BPF machine for both CPUs, and the kernel."""

import errno
import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import seccomp
from sandbox.bwrap import bwrap_argv
from sandbox.runner import run_command
from sandbox.scope import Limits, Scope

LIMITS = Limits(wall_seconds=10, processes=32)
MACHINE = os.uname().machine
# On a CPU without a filter the sandbox runs without one (tests/sandbox/test_runner.py covers that).
pytestmark = pytest.mark.skipif(MACHINE not in seccomp.ARCHES, reason=f"no seccomp filter for {MACHINE}")
NATIVE = seccomp.ARCHES.get(MACHINE)
OTHER_MACHINE = next(name for name in seccomp.ARCHES if name != MACHINE)

# Run inside the sandbox: each named call's outcome, one "name outcome" line each. The numbers come
# in as arguments (checked against the kernel headers below); ctypes' libc.syscall is a raw call.
SYSCALL_PROBE = r"""
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, SIGCHLD = 0x10000000, 0x00020000, 17

def outcome(ret):
    return f"errno={errno.errorcode[ctypes.get_errno()]}" if ret == -1 else "ok"

def syscall(nr, *args):
    ret = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if ret == 0 and nr == NR["clone"]:
        os._exit(0)  # a child made by a clone the filter should have refused
    return outcome(ret)

NR = {name: int(nr) for name, nr in (arg.split("=") for arg in sys.argv[1:])}
print("clone(NEWUSER)", syscall(NR["clone"], CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0))
print("clone(NEWUSER, high word set)", syscall(NR["clone"], (1 << 32) | CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0))
print("unshare(NEWUSER)", outcome(libc.unshare(CLONE_NEWUSER)))  # last: it would move us into it
print("clone3", syscall(NR["clone3"], 0, 0))
print("fallocate(punch hole)", syscall(NR["fallocate"], 0, 3, 0, 0))
print("ioctl(FS_IOC_RESVSP64)", syscall(NR["ioctl"], 0, 0x4030582A, 0, 0))
for name in NR:
    if name not in ("clone", "clone3", "unshare", "ioctl"):
        print(name, syscall(NR[name], 0, 0, 0, 0, 0))
print("getpid", outcome(libc.getpid()))
"""

# Run inside the sandbox: the ways a program makes processes and threads, all of which must still work.
# glibc's pthread_create and posix_spawn try clone3 first and fall back to clone on ENOSYS.
ORDINARY_PROBE = r"""
import concurrent.futures, os, subprocess, sys, threading
seen = []
thread = threading.Thread(target=seen.append, args=("thread",))
thread.start()
thread.join()
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    seen += pool.map(str.upper, ["pool"] * 4)
pid = os.posix_spawn("/bin/sh", ["sh", "-c", "exit 5"], {})
seen.append(f"posix_spawn={os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
pid = os.fork()
if pid == 0:
    os._exit(7)
seen.append(f"fork={os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
first = subprocess.Popen(["printf", "b\\na\\n"], stdout=subprocess.PIPE)
second = subprocess.run(["sort"], stdin=first.stdout, capture_output=True, text=True)
first.wait()
seen.append("pipeline=" + second.stdout.replace("\n", ""))
seen.append(subprocess.run("seq 3 | wc -l", shell=True, capture_output=True, text=True).stdout.strip())
print(" ".join(seen))
"""


async def run_in_sandbox(command: str, workspace: Path):
    result = await run_command(command, Scope(workspace), LIMITS)
    assert result.isolation == "bubblewrap"
    return result


async def test_the_filter_is_in_force_for_the_command(workspace):
    result = await run_in_sandbox("grep ^Seccomp /proc/self/status", workspace)
    assert result.stdout.split() == ["Seccomp:", "2", "Seccomp_filters:", "1"], result.stderr


async def test_unshare_cannot_make_a_user_namespace(workspace):
    # The gap this closes is widest as root: bwrap makes no user namespace there, so without the
    # filter the command's plain uid could make one of its own.
    result = await run_in_sandbox("unshare -U true; echo rc=$?; unshare -Ur id -u; echo rc=$?", workspace)
    assert result.stdout.split() == ["rc=1", "rc=1"]
    assert result.stderr.count("unshare failed: Operation not permitted") == 2


async def test_user_namespaces_clone3_and_denied_calls_are_refused(workspace):
    (workspace / "probe.py").write_text(SYSCALL_PROBE)
    numbers = " ".join(f"{name}={nr}" for name, nr in NATIVE.syscalls.items())
    result = await run_in_sandbox(f"python3 probe.py {numbers}", workspace)
    assert result.exit_status == 0, result.stderr
    outcomes = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines())
    # Let through to the kernel, which refuses it for its own reasons (fd 0 is no regular file).
    assert outcomes.pop("fallocate(punch hole)") not in ("ok", f"errno={errno.errorcode[errno.EOPNOTSUPP]}")
    # Unfiltered, as the sandbox uid: the first three succeed, clone3(NULL, 0) is EINVAL, and the
    # denied calls with zero arguments EINVAL or EFAULT (userfaultfd EPERM at its default sysctl).
    assert outcomes == {
        "clone(NEWUSER)": "errno=EPERM",
        "clone(NEWUSER, high word set)": "errno=EPERM",
        "unshare(NEWUSER)": "errno=EPERM",
        "clone3": "errno=ENOSYS",
        "fallocate": f"errno={errno.errorcode[errno.EOPNOTSUPP]}",  # ENOTSUP: the same number
        "ioctl(FS_IOC_RESVSP64)": f"errno={errno.errorcode[errno.EOPNOTSUPP]}",
        **{name: "errno=EPERM" for name in seccomp.DENIED},
        "socket": "errno=EAFNOSUPPORT", "socketpair": "errno=EAFNOSUPPORT",  # AF_UNSPEC: no family
        "getpid": "ok",
    }


async def test_forks_threads_spawns_and_pipelines_still_work(workspace):
    (workspace / "ordinary.py").write_text(ORDINARY_PROBE)
    command = "python3 ordinary.py && echo hello | tr a-z A-Z && sh -c 'ls / | grep -c usr'"
    result = await run_in_sandbox(command, workspace)
    assert result.exit_status == 0, result.stderr
    assert result.stdout.splitlines() == [
        "thread POOL POOL POOL POOL posix_spawn=5 fork=7 pipeline=ab 3", "HELLO", "1"]


@pytest.mark.skipif(MACHINE != "x86_64", reason="x32 is an x86_64 ABI")
async def test_an_x32_call_kills_the_process(workspace):
    # getpid through the x32 entry (its number with bit 30 set): the rules match native numbers only.
    command = "python3 -c 'import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39)'; echo rc=$?"
    result = await run_in_sandbox(command, workspace)
    assert result.stdout == f"rc={128 + signal.SIGSYS}\n"


def test_a_filter_the_kernel_refuses_means_nothing_runs(workspace):
    # A jump past the end: the kernel rejects the program, and bwrap must then fail, not run unfiltered.
    broken = os.memfd_create("broken-seccomp")
    try:
        os.write(broken, struct.pack("=HBBI", seccomp.JEQ, 5, 0, 0))
        os.lseek(broken, 0, os.SEEK_SET)
        argv = bwrap_argv("bwrap", "touch ran", Scope(workspace), {"PATH": "/usr/bin:/bin"}, broken)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, pass_fds=(broken,))
    finally:
        os.close(broken)
    assert done.returncode != 0 and "PR_SET_SECCOMP" in done.stderr
    assert not (workspace / "ran").exists()


def test_an_unknown_cpu_gets_no_filter_and_a_clear_refusal():
    with pytest.raises(seccomp.UnsupportedArchitecture) as refused:
        seccomp.program("riscv64")
    assert "riscv64" in str(refused.value) and "aarch64 and x86_64 only" in str(refused.value)


HEADERS = {
    "x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"),
    "aarch64": ("/usr/include/asm-generic/unistd.h",),  # arm64 uses the generic table
}


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_syscall_numbers_match_the_kernel_headers(machine):
    header = next((Path(p) for p in HEADERS[machine] if Path(p).exists()), None)
    if header is None:
        pytest.skip(f"no kernel header for {machine} here (install linux-libc-dev)")
    defined = dict(re.findall(r"#define __NR_(\w+)\s+(\d+)", header.read_text()))
    assert {name: int(defined[name]) for name in seccomp.ARCHES[machine].syscalls} == \
        seccomp.ARCHES[machine].syscalls


def decide(program: bytes, arch: int, nr: int, arg0: int = 0, arg1: int = 0, arg2: int = 0) -> str:
    """A model of the kernel's BPF machine for the instructions the filter uses, over struct
    seccomp_data as a little-endian kernel lays it out."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, arg1, arg2, 0, 0, 0)
    ops = [struct.unpack_from("=HBBI", program, at) for at in range(0, len(program), 8)]
    pc = acc = 0
    while True:
        code, jt, jf, k = ops[pc]
        if code == seccomp.RET:
            names = {seccomp.KILL_PROCESS: "kill", seccomp.ALLOW: "allow"}
            return names.get(k) or errno.errorcode[k - seccomp.ERRNO]
        if code == seccomp.LD_W_ABS:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
            continue
        holds = {seccomp.JEQ: acc == k, seccomp.JGE: acc >= k, seccomp.JSET: bool(acc & k)}[code]
        pc += 1 + (jt if holds else jf)


# The 32-bit ABI each CPU also runs (linux/audit.h: AUDIT_ARCH_I386, AUDIT_ARCH_ARM), and a syscall
# the filter must let through whatever its first argument (write).
COMPAT_ARCH = {"x86_64": 0x40000003, "aarch64": 0x40000028}
WRITE = {"x86_64": 1, "aarch64": 64}


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_the_program_decides_each_call_as_documented(machine):
    program, arch = seccomp.program(machine), seccomp.ARCHES[machine]
    nr, native = arch.syscalls, arch.audit_arch
    newuser, sigchld = seccomp.CLONE_NEWUSER, 17
    assert decide(program, native, WRITE[machine], newuser) == "allow"
    assert decide(program, COMPAT_ARCH[machine], WRITE[machine]) == "kill"
    assert decide(program, native, nr["clone"], sigchld) == "allow"
    assert decide(program, native, nr["clone"], (1 << 32) | sigchld) == "allow"  # the kernel drops it
    assert decide(program, native, nr["clone"], newuser | sigchld) == "EPERM"
    assert decide(program, native, nr["clone"], (0xFFFF << 48) | newuser) == "EPERM"
    assert decide(program, native, nr["unshare"], 0x00020000) == "allow"  # CLONE_NEWNS
    assert decide(program, native, nr["unshare"], newuser) == "EPERM"
    assert decide(program, native, nr["clone3"]) == "ENOSYS"
    not_supported = errno.errorcode[errno.EOPNOTSUPP]
    assert decide(program, native, nr["fallocate"]) == not_supported  # mode 0: allocate
    assert decide(program, native, nr["fallocate"], 3, 1) == not_supported  # KEEP_SIZE alone
    assert decide(program, native, nr["fallocate"], 3, seccomp.FALLOC_PUNCH_HOLE) == "allow"
    assert [decide(program, native, nr["ioctl"], 3, request) for request in seccomp.RESERVING_IOCTLS] \
        == [not_supported] * len(seccomp.RESERVING_IOCTLS)
    assert decide(program, native, nr["ioctl"], 3, 0x541B) == "allow"  # FIONREAD
    assert decide(program, native, nr["ioctl"], 3, (1 << 32) | 0x541B) == "allow"  # high word ignored
    assert [decide(program, native, nr[name]) for name in seccomp.DENIED] == ["EPERM"] * len(seccomp.DENIED)
    assert decide(program, native, -1) == "allow"  # a tracer's skipped call; the kernel says ENOSYS
    for call in (nr["socket"], nr["socketpair"]):
        # Every family up to AF_MAX (46) and beyond: AF_UNIX, AF_INET, AF_INET6 and two netlink
        # protocols only. The kernel reads the family as an int: the high word changes nothing.
        made = {family: decide(program, native, call, (1 << 32) | family, 1, 0) for family in range(64)}
        assert made == {family: "allow" if family in (1, 2, 10, 16) else "EAFNOSUPPORT"
                        for family in range(64)}
        assert [decide(program, native, call, seccomp.AF_NETLINK, 3, protocol) for protocol in range(24)] \
            == ["allow" if protocol in (0, 4) else "EPROTONOSUPPORT" for protocol in range(24)]
        assert decide(program, native, call, 1, 1, 15) == "allow"  # a protocol matters to netlink only
    x32_getpid = arch.x32_bit | 39
    assert decide(program, native, x32_getpid) == ("kill" if arch.x32_bit else "allow")


LOAD_THEN_CALL = """
import ctypes, os, sys
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
code = sys.stdin.buffer.read()
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(Program(len(code) // 8, code)), 0, 0):
    os._exit(3)  # PR_SET_NO_NEW_PRIVS, then PR_SET_SECCOMP with SECCOMP_MODE_FILTER
libc.getpid()
os._exit(0)
"""


def test_the_other_cpus_program_loads_and_kills_every_native_call():
    # The kernel validates the program it cannot otherwise see here; a call from an ABI the filter
    # was not built for (as i386 or 32-bit ARM would be) is killed, never let through unchecked.
    done = subprocess.run([sys.executable, "-c", LOAD_THEN_CALL], input=seccomp.program(OTHER_MACHINE),
                          capture_output=True, timeout=10)
    assert done.returncode == -signal.SIGSYS, done.stderr
