"""Network for a sandbox, against real bubblewrap and real slirp4netns: a role granted network reaches
other machines through a namespace of its own, never the host's loopback services or abstract
sockets; without slirp4netns such a role is refused; nothing of the plumbing outlives a run."""

import asyncio
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import network
from sandbox.disk import free_bytes
from sandbox.runner import Sandbox, run_command
from sandbox.scope import Limits, SandboxUnavailable, Scope
from tests.helpers.processes import our_helpers, processes_running
from tests.helpers.sandbox import LIMITS, run

pytestmark = pytest.mark.usefixtures("bwrap_installed")  # see conftest.py
needs_slirp = pytest.mark.usefixtures("slirp4netns_works")

REPO = Path(__file__).resolve().parents[2]

# Prints the outcome of each connection attempt: "connected" or the exception's name.
CONNECT = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    family = socket.AF_UNIX if host == "@" else socket.AF_INET
    try:
        with socket.socket(family) as s:
            s.settimeout(2)
            s.connect(b"\\0" + port.encode() if host == "@" else (host, int(port)))
        print(target, "connected")
    except OSError as exc:
        print(target, type(exc).__name__)
"""


async def connect(workspace, *targets: str) -> dict[str, str]:
    (workspace / "connect.py").write_text(CONNECT)
    result = await run(f"python3 connect.py {' '.join(targets)}", workspace, network=True)
    assert result.exit_status == 0, result.stderr
    return dict(line.split() for line in result.stdout.splitlines())


async def wait_for_slirp(task: asyncio.Task) -> None:
    """Until this process's slirp4netns runs (the command has started behind it)."""
    deadline = time.monotonic() + 5
    while not any(comm == "slirp4netns" for _, comm in our_helpers()):
        assert not task.done() and time.monotonic() < deadline, "slirp4netns never ran"
        await asyncio.sleep(0.005)


def slirp4netns_after(tmp_path, delay: str, then: str) -> str:
    """A slirp4netns that sleeps `delay` seconds, then execs `then` (the real one: '... "$@"')."""
    slow = tmp_path / "slow-slirp4netns"
    slow.write_text(f"#!/bin/sh\nsleep {delay}\nexec {then}\n")
    slow.chmod(0o755)
    return str(slow)


def lan_address() -> str | None:
    """The host's address towards other machines (no packet is sent: a UDP connect only picks the
    route); None when it has only loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture
def listener(request):
    """A TCP listener of the host on the given address; the kernel completes a handshake without
    accept(), so `accepted()` tells whether any connection arrived."""
    server = socket.socket()
    server.bind((request.param, 0))
    server.listen(4)
    server.setblocking(False)
    yield server
    server.close()


def accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return False
    return True


@needs_slirp
async def test_a_network_role_has_its_own_interface_default_route_and_resolver(workspace):
    # The very first thing the command does already sees the network: bwrap waited for it.
    result = await run("cat /proc/net/route /proc/net/fib_trie /etc/resolv.conf; ls /proc/self/fd",
                       workspace, network=True)
    assert result.exit_status == 0, result.stderr
    routes = [line.split()[:3] for line in result.stdout.splitlines() if line.startswith(network.TAP)]
    assert [network.TAP, "00000000", "0202000A"] in routes  # default via 10.0.2.2
    assert f"|-- {network.GUEST_ADDRESS}\n" in result.stdout
    assert "nameserver 10.0.2.3\n" in result.stdout  # readable by the sandbox uid
    assert result.stdout.split()[-4:] == ["0", "1", "2", "3"]  # none of the plumbing's descriptors


@needs_slirp
async def test_the_command_waits_for_a_slow_network(workspace, tmp_path):
    # The real slirp4netns, started late: the command must still find the network up.
    slow = slirp4netns_after(tmp_path, "0.5", f'{network.locate()} "$@"')
    result = await run("grep -c tap0 /proc/net/route", workspace, network=True, slirp4netns_path=slow)
    assert result.stdout == "2\n", result.stderr  # the default route and the local one


@needs_slirp
async def test_the_network_setup_counts_in_the_wall_clock_limit(workspace, tmp_path):
    # 1.5 s of setup, then the command gets the rest of the 3.5 s, not 3.5 s more. The rest, 2 s,
    # is for bwrap to start the command on a loaded machine.
    slow = slirp4netns_after(tmp_path, "1.5", f'{network.locate()} "$@"')
    result = await run("echo started; sleep 4334", workspace, Limits(wall_seconds=3.5),
                       network=True, slirp4netns_path=slow)
    assert result.timed_out and result.stdout == "started\n", result.stderr
    assert result.duration_s < 4.5  # 5 s and more had the setup not counted
    assert our_helpers() == [] and processes_running("sleep", "4334") == []


@needs_slirp
async def test_a_network_setup_longer_than_the_wall_clock_limit_is_refused_at_the_limit(
        workspace, tmp_path):
    hung = slirp4netns_after(tmp_path, "0", "sleep 4335")  # never says the network is up
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable) as refused:
        await run("echo never", workspace, Limits(wall_seconds=1), network=True, slirp4netns_path=hung)
    assert time.monotonic() - started < 2.5  # not the setup's own 10 s
    assert "the sandbox's network setup did not finish within" in str(refused.value)
    assert "left of the command's wall-clock limit" in str(refused.value)
    assert "a longer `wall_seconds` on the role" in str(refused.value)  # not "install slirp4netns"
    assert our_helpers() == [] and processes_running("sleep", "4335") == []


async def test_without_network_there_is_only_loopback_and_no_resolver(workspace):
    result = await run("tail -n +3 /proc/net/dev; cat /etc/resolv.conf", workspace)
    assert [line.split(":")[0].strip() for line in result.stdout.splitlines()] == ["lo"]
    assert "No such file" in result.stderr


# Prints "call family outcome" for each socket the sandbox tries: "ok" or the errno's name.
FAMILIES = """
import errno, socket
TRIES = (("AF_VSOCK", 40, socket.SOCK_STREAM, 0), ("AF_PACKET", 17, socket.SOCK_RAW, 0),
         ("AF_XDP", 44, socket.SOCK_RAW, 0), ("AF_ALG", 38, socket.SOCK_SEQPACKET, 0),
         ("AF_UNIX", 1, socket.SOCK_STREAM, 0), ("AF_INET", 2, socket.SOCK_STREAM, 0),
         ("AF_INET6", 10, socket.SOCK_DGRAM, 0), ("NETLINK_ROUTE", 16, socket.SOCK_RAW, 0),
         ("NETLINK_SOCK_DIAG", 16, socket.SOCK_DGRAM, 4),
         ("NETLINK_KOBJECT_UEVENT", 16, socket.SOCK_DGRAM, 15), ("NETLINK_GENERIC", 16, socket.SOCK_RAW, 16))
for name, family, kind, protocol in TRIES:
    for call in (socket.socket, socket.socketpair):
        try:
            made = call(family, kind, protocol)
            for each in made if isinstance(made, tuple) else [made]:
                each.close()
            print(call.__name__, name, "ok")
        except OSError as exc:
            print(call.__name__, name, errno.errorcode[exc.errno])
"""


def socket_outcomes(text: str) -> dict[str, str]:
    return {f"{call} {family}": outcome for call, family, outcome in map(str.split, text.splitlines())}


async def socket_families(workspace, granted: bool) -> None:
    (workspace / "families.py").write_text(FAMILIES)
    result = await run("python3 families.py", workspace, network=granted)
    assert result.exit_status == 0, result.stderr
    outcomes = socket_outcomes(result.stdout)
    refused = ("AF_VSOCK", "AF_PACKET", "AF_XDP", "AF_ALG")
    assert {what: outcomes.pop(what) for what in list(outcomes) if what.split()[1] in refused} == {
        f"{call} {family}": "EAFNOSUPPORT" for family in refused for call in ("socket", "socketpair")}
    # socketpair is a UNIX-only call: the kernel's own EOPNOTSUPP for the others.
    unix_only = errno.errorcode[errno.EOPNOTSUPP]
    assert outcomes == {
        "socket AF_UNIX": "ok", "socketpair AF_UNIX": "ok",
        "socket AF_INET": "ok", "socketpair AF_INET": unix_only,
        "socket AF_INET6": "ok", "socketpair AF_INET6": unix_only,
        "socket NETLINK_ROUTE": "ok", "socketpair NETLINK_ROUTE": unix_only,
        "socket NETLINK_SOCK_DIAG": "ok", "socketpair NETLINK_SOCK_DIAG": unix_only,
        **{f"{call} {protocol}": "EPROTONOSUPPORT" for call in ("socket", "socketpair")
           for protocol in ("NETLINK_KOBJECT_UEVENT", "NETLINK_GENERIC")}}


async def test_without_network_only_unix_inet_and_netlink_sockets_can_be_made(workspace):
    # AF_VSOCK is in no namespace: a command could listen on the host's (on a VM, the hypervisor's)
    # vsock ports. Unfiltered, socket(AF_VSOCK) succeeds on a kernel with vsock (as on the test VM),
    # AF_PACKET and AF_XDP answer EPERM (no CAP_NET_RAW), netlink's uevent and generic protocols
    # succeed: EAFNOSUPPORT and EPROTONOSUPPORT are the filter's answers. (A kernel without AF_ALG
    # answers EAFNOSUPPORT itself.)
    await socket_families(workspace, granted=False)


@needs_slirp
async def test_with_network_still_only_unix_inet_and_netlink_sockets_can_be_made(workspace):
    await socket_families(workspace, granted=True)


@needs_slirp
@pytest.mark.parametrize("listener", [lan_address() or "127.0.0.1"], indirect=True)
async def test_a_network_role_reaches_the_host_like_any_machine_on_its_network(workspace, listener):
    if lan_address() is None:
        pytest.skip("this host has no address but loopback")
    host, port = listener.getsockname()
    assert await connect(workspace, f"{host}:{port}") == {f"{host}:{port}": "connected"}
    assert accepted(listener)


@needs_slirp
@pytest.mark.parametrize("listener", ["127.0.0.1"], indirect=True)
async def test_a_network_role_cannot_reach_the_hosts_loopback_services(workspace, listener):
    port = listener.getsockname()[1]
    outcome = await connect(workspace, f"127.0.0.1:{port}", f"{network.GATEWAY}:{port}")
    assert "connected" not in outcome.values(), outcome
    assert not accepted(listener)


@needs_slirp
async def test_a_network_role_cannot_reach_the_hosts_abstract_unix_sockets(workspace):
    # Like X11's @/tmp/.X11-unix/X0 or a D-Bus bus: no file to hide, only the network namespace.
    name = f"openclaw-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(b"\0" + name.encode())
        server.listen(1)
        server.setblocking(False)
        assert await connect(workspace, f"@:{name}") == {f"@:{name}": "ConnectionRefusedError"}
        assert not accepted(server)


@needs_slirp
async def test_the_network_helpers_do_not_get_the_daemons_secrets(workspace, monkeypatch):
    # slirp4netns parses every packet the command sends: a bug there must find no token to take.
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456:SECRET-IN-DAEMON-ENV")
    environs = {}
    release = network.Link._release_holder

    def read_environs_then_release(link):
        # The moment both run: slirp4netns is ready, the holder (nsenter, now `cat`) not yet gone.
        for name, proc in (("holder", link._holder), ("slirp4netns", link._slirp)):
            environs[name] = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")[:-1]
        release(link)

    monkeypatch.setattr(network.Link, "_release_holder", read_environs_then_release)
    result = await run("echo hi", workspace, network=True)
    assert result.stdout == "hi\n", result.stderr
    assert set(environs) == {"holder", "slirp4netns"}
    for name, environ in environs.items():
        assert not any(b"SECRET" in entry for entry in environ), (name, environ)
        assert {entry.partition(b"=")[0].decode() for entry in environ} == set(network.HELPER_ENV), name


async def test_without_slirp4netns_a_network_role_is_refused_and_others_still_run(workspace):
    gone = "/nonexistent/slirp4netns"
    with pytest.raises(SandboxUnavailable) as refused:
        await run("echo hi", workspace, network=True, slirp4netns_path=gone)
    assert f"slirp4netns not found at {gone};" in str(refused.value)
    assert "apt-get install slirp4netns" in str(refused.value)
    result = await run("echo hi", workspace, slirp4netns_path=gone)
    assert result.exit_status == 0 and result.stdout == "hi\n"
    works, what = await Sandbox(slirp4netns_path=gone).network()  # what `openclaw doctor` shows
    assert not works and "apt-get install slirp4netns" in what


@needs_slirp
async def test_slirp4netns_is_stopped_after_runs_side_by_side(workspace):
    tasks = [asyncio.create_task(run("sleep 0.5; grep -c tap0 /proc/net/route", workspace, network=True))
             for _ in range(2)]
    await wait_for_slirp(tasks[0])
    results = await asyncio.gather(*tasks)
    assert [r.stdout for r in results] == ["2\n", "2\n"], [r.stderr for r in results]
    assert our_helpers() == []


@needs_slirp
async def test_slirp4netns_is_stopped_after_a_wall_clock_kill(workspace):
    task = asyncio.create_task(run("sleep 4330", workspace, Limits(wall_seconds=1), network=True))
    await wait_for_slirp(task)
    result = await task
    assert result.timed_out
    assert our_helpers() == [] and processes_running("sleep", "4330") == []


@needs_slirp
async def test_slirp4netns_is_stopped_when_the_run_is_cancelled_at_any_moment(workspace):
    task = asyncio.create_task(run("sleep 4331", workspace, network=True))
    await wait_for_slirp(task)
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled() and our_helpers() == []
    # And at every moment of the start and the network's setup (a few tens of milliseconds).
    for i, delay in enumerate(0.002 * n for n in range(30)):
        marker = str(4450 + i)
        task = asyncio.create_task(run(f"sleep {marker}", workspace, network=True))
        await asyncio.sleep(delay)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5)
        assert done, f"the cancelled run did not return (cancelled after {delay} s)"
        assert our_helpers() == [], f"left running after a cancel at {delay} s"
        deadline = time.monotonic() + 2  # SIGKILL of the group, then the kernel tears it down
        while processes_running("sleep", marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert processes_running("sleep", marker) == [], f"left running after a cancel at {delay} s"


# The daemon's part in the next test: runs a network command, says which slirp4netns serves it.
DAEMON = """
import asyncio, os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from sandbox.runner import run_command
from sandbox.scope import Limits, Scope
from tests.helpers.processes import our_helpers

async def main():
    task = asyncio.create_task(run_command("sleep 4332", Scope(Path({workspace!r}), network=True),
                                           Limits(wall_seconds=30)))
    while not (slirp := [pid for pid, comm in our_helpers() if comm == "slirp4netns"]):
        await asyncio.sleep(0.005)
    print(slirp[0], flush=True)
    await task

asyncio.run(main())
"""


@needs_slirp
def test_slirp4netns_does_not_outlive_a_daemon_that_is_killed(workspace):
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON.format(repo=str(REPO), workspace=str(workspace))],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        slirp = int(daemon.stdout.readline())
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
    deadline = time.monotonic() + 3
    while alive(slirp) and time.monotonic() < deadline:  # it sees its exit pipe close
        time.sleep(0.02)
    assert not alive(slirp)
    # Nothing of the sandbox either, neither the command nor a bwrap left waiting to start it.
    deadline = time.monotonic() + 3
    while processes_mentioning("sleep 4332") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert processes_mentioning("sleep 4332") == []


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (entry.name.isdigit() and alive(int(entry.name))
                    and text.encode() in (entry / "cmdline").read_bytes().replace(b"\0", b" ")):
                found.append(int(entry.name))
        except OSError:
            pass  # exited while we looked
    return found


def alive(pid: int) -> bool:
    """Running, that is: a zombie is dead (here pid 1 may never reap an orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1] != "Z"
    except FileNotFoundError:
        return False


@needs_slirp
async def test_a_sandbox_that_fails_its_own_setup_reports_bwraps_error_not_a_network_one(workspace):
    scope = Scope(workspace, read_only=(Path("/nonexistent/share"),), network=True)
    # Repeated: bwrap's child may still be a zombie (no /proc/PID/net) when we look, which once
    # read as "this kernel has no /proc/PID/net/igmp" about one run in ten.
    for _ in range(20):
        result = await run_command("echo never", scope, LIMITS)
        assert result.exit_status != 0 and result.stdout == ""
        assert "/nonexistent/share" in result.stderr  # bwrap's own message
    assert our_helpers() == []


# No admin port: doctor's check of it would fail the test whenever a daemon of the machine's holds
# the default one.
DOCTOR_CONFIG = 'data_dir = "{tmp}/data"\n[admin]\nenabled = false\n[skills]\nenabled = ["clock", "shell"]\n'


@needs_slirp
def test_doctor_tries_the_network_of_roles_that_run_commands(tmp_path):
    from tests.helpers.cli import run as openclaw

    config = tmp_path / "openclaw.toml"
    config.write_text(DOCTOR_CONFIG.format(tmp=tmp_path))
    doctor = openclaw(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=120)
    assert "✓ sandbox network for roles admin: own namespace" in doctor.stdout, doctor.stdout
    # The same install where slirp4netns cannot be found (bubblewrap still can).
    path = tmp_path / "bin"
    path.mkdir()
    (path / "bwrap").symlink_to(shutil.which("bwrap"))
    doctor = openclaw(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=120,
                      PATH=str(path))
    assert doctor.returncode == 1
    assert ("✗ sandbox network for roles admin: cannot run commands with network: slirp4netns is "
            "not installed (not on PATH)") in doctor.stdout, doctor.stdout
    assert "apt-get install slirp4netns" in doctor.stdout
    # A disk under the reserve is the disk line's warning, not a network failure.
    (tmp_path / "data").mkdir(exist_ok=True)
    above = (free_bytes(tmp_path) >> 20) + 100
    config.write_text(DOCTOR_CONFIG.format(tmp=tmp_path) + f"[sandbox]\nmin_free_disk_mb = {above}\n")
    doctor = openclaw(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=120)
    assert "✓ sandbox network for roles admin: own namespace" in doctor.stdout, doctor.stdout
    assert "⚠ disk: " in doctor.stdout and doctor.returncode == 0, doctor.stdout
    # Without a skill that runs commands, no role needs it.
    config.write_text(DOCTOR_CONFIG.format(tmp=tmp_path).replace(', "shell"', ""))
    doctor = openclaw(["--config", str(config), "doctor", "--skip-model"], tmp_path, timeout=120,
                      PATH=str(path))
    assert "sandbox network" not in doctor.stdout, doctor.stdout
