"""sd_notify as systemd sees it: real AF_UNIX datagram sockets (a file and an abstract name) that
receive exactly the datagrams systemd would."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from openclaw import systemd


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never talk to a real systemd that happens to supervise the test run."""
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def notify_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound datagram socket in tmp_path, named by NOTIFY_SOCKET."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


@pytest.fixture
def abstract_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket in the abstract namespace, named '@...' the way systemd passes it."""
    name = f"openclaw-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2.0)
    monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
    yield sock
    sock.close()


def test_notify_without_notify_socket_does_nothing_and_says_false() -> None:
    assert systemd.notify("READY=1") is False
    assert systemd.ready() is False
    assert systemd.stopping() is False
    assert systemd.status("hello") is False


def test_ready_stopping_and_status_send_exact_datagrams(notify_socket: socket.socket) -> None:
    assert systemd.ready() is True
    assert notify_socket.recv(4096) == b"READY=1"
    assert systemd.status("answering 2 conversations") is True
    assert notify_socket.recv(4096) == b"STATUS=answering 2 conversations"
    assert systemd.stopping() is True
    assert notify_socket.recv(4096) == b"STOPPING=1"


def test_status_text_cannot_inject_a_second_assignment(notify_socket: socket.socket) -> None:
    systemd.status("line one\nREADY=1")
    assert notify_socket.recv(4096) == b"STATUS=line one READY=1"


def test_abstract_socket_name_with_at_sign_reaches_the_abstract_namespace(
        abstract_socket: socket.socket) -> None:
    assert systemd.ready() is True
    assert abstract_socket.recv(4096) == b"READY=1"


def test_a_vanished_socket_is_reported_as_false_not_raised(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert systemd.ready() is False


def test_a_non_unix_notify_address_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert systemd.ready() is False


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    assert systemd.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    assert systemd.watchdog_interval() == pytest.approx(0.1)
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval() == pytest.approx(0.1)


def test_watchdog_meant_for_another_process_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert systemd.watchdog_interval() is None


@pytest.mark.parametrize("usec", ["0", "soon", "-5"])
def test_malformed_or_zero_watchdog_usec_means_no_watchdog(usec: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    assert systemd.watchdog_interval() is None


async def test_watchdog_pings_within_the_interval_until_cancelled(
        notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    # systemd's deadline: 2 s; we ping every 1 s. Seconds, not tenths: a loaded machine's pause
    # of the loop must not read as a missed deadline.
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    deadline = 2.0
    notify_socket.setblocking(False)
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    task = systemd.start_watchdog()
    assert task is not None
    try:
        arrivals = []
        for _ in range(3):
            data = await asyncio.wait_for(loop.sock_recv(notify_socket, 4096), timeout=deadline)
            assert data == b"WATCHDOG=1"
            arrivals.append(time.monotonic() - started)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert arrivals[0] < deadline
    assert all(gap < deadline for gap in gaps), gaps  # every ping lands inside systemd's deadline
    _drain(notify_socket)  # a ping may have left between the last read and the cancel
    await asyncio.sleep(1.5)  # longer than the interval: a task still running would have pinged
    with pytest.raises(BlockingIOError):  # cancelled: no more pings
        notify_socket.recv(4096)


async def test_no_watchdog_task_without_watchdog_usec(notify_socket: socket.socket) -> None:
    assert systemd.start_watchdog() is None


async def test_no_watchdog_task_without_notify_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    assert systemd.start_watchdog() is None


def _drain(sock: socket.socket) -> None:
    while True:
        try:
            sock.recv(4096)
        except BlockingIOError:
            return
