"""Tell systemd how the daemon is doing (sd_notify): ready, stopping, status text, watchdog pings.

The protocol is one datagram of `KEY=VALUE` lines sent to the socket named by `$NOTIFY_SOCKET`, so
it needs no library. Outside systemd (a terminal, a test) the variable is unset and every call here
is a cheap no-op that returns False.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") to systemd; True when it was sent.

    A failure is logged and reported as False, never raised: losing a notification must not take
    the daemon down (systemd then restarts it for a missed watchdog, which is the right outcome).
    """
    address = _notify_address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        log.warning("could not notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True


def ready() -> bool:
    """Start-up is complete; a Type=notify unit counts as started only after this."""
    return notify("READY=1")


def reloading() -> bool:
    """A reload of the config has begun; the READY=1 that follows says it ended."""
    # MONOTONIC_USEC: systemd >= 253 matches the reload it asked for by this timestamp.
    return notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")


def stopping() -> bool:
    """Shutdown has begun, so systemd does not read a slow drain as a hang."""
    return notify("STOPPING=1")


def extend_timeout(seconds: float) -> bool:
    """The start (or stop) in progress needs up to `seconds` more: systemd waits that long past
    now, beyond TimeoutStartSec, for this or the next extension (systemd >= 236)."""
    return notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")


def status(text: str) -> bool:
    """A one-line status shown by `systemctl status`."""
    # A newline would start a new KEY=VALUE assignment in the datagram.
    return notify("STATUS=" + " ".join(text.splitlines()))


def watchdog_interval() -> float | None:
    """Seconds between pings (half of `$WATCHDOG_USEC`, as sd_watchdog_enabled advises), or None.

    None when no watchdog was asked for, or when `$WATCHDOG_PID` names another process (the
    variables were inherited, and the watchdog belongs to our parent).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    try:
        if pid and int(pid) != os.getpid():
            return None
        microseconds = int(usec) if usec else 0
    except ValueError:
        log.warning("ignoring a malformed systemd watchdog setting (WATCHDOG_USEC=%r, "
                    "WATCHDOG_PID=%r)", usec, pid)
        return None
    return microseconds / 2_000_000 if microseconds > 0 else None


def start_watchdog(interval: float | None = None) -> asyncio.Task[None] | None:
    """Ping `WATCHDOG=1` from the running event loop until the returned task is cancelled.

    The pings come from the loop itself on purpose: if the loop wedges, they stop and systemd
    restarts the service. Returns None (and starts nothing) when no watchdog is configured.
    """
    interval = interval if interval is not None else watchdog_interval()
    if interval is None or _notify_address() is None:
        return None
    return asyncio.get_running_loop().create_task(_ping_forever(interval), name="systemd-watchdog")


async def _ping_forever(interval: float) -> None:
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)


def _notify_address() -> str | None:
    address = os.environ.get("NOTIFY_SOCKET", "")
    if address.startswith("@"):
        return "\0" + address[1:]  # an abstract socket: systemd spells the leading NUL as '@'
    if address.startswith("/"):
        return address
    if address:  # e.g. "vsock:..." (systemd >= 254 in VMs): not a socket this module speaks
        log.debug("NOTIFY_SOCKET=%s is not a unix socket path; not notifying", address)
    return None
