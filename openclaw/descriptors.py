"""The daemon's open-file budget: the soft limit raised to the hard one at start, and accepts that
fail for want of a descriptor said once a minute rather than once a second."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# asyncio's report of an accept that failed for want of a descriptor or memory (selector_events).
ACCEPT_FAILED = "socket.accept() out of system resource"
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
REPORT_EVERY_S = 60.0

ExceptionHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit: (before, after) when it changed. The usual
    soft limit, 1024, is what every shell and files call, the database, the connectors and the
    admin port share; the kernel allows the process the hard limit. Sandboxed commands get limits
    of their own (sandbox/process.py), so this reaches none of them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:  # unlimited hard: there is no number to ask
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-files limit from %d to %d: %s", soft, hard, exc)
        return None
    return soft, hard


class AcceptFailureLog:
    """An event loop exception handler. asyncio reports each accept that failed for want of a
    descriptor (it then pauses that listener for a second and tries again), with a traceback every
    time: a log line a second per listening socket for as long as it lasts. This says it once per
    `every_s`, with how many failed meanwhile; any other report goes to the handler before it."""

    def __init__(self, previous: ExceptionHandler | None, every_s: float = REPORT_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.previous = previous
        self.every_s = every_s
        self._clock = clock
        self._last_report: float | None = None
        self._failed = 0  # since the last report

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") != ACCEPT_FAILED or getattr(exc, "errno", None) not in OUT_OF_RESOURCES:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self._failed += 1
        now = self._clock()
        if self._last_report is not None and now - self._last_report < self.every_s:
            return
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        log.error("cannot accept connections: %s (open-files limit %d); %d accept(s) failed since "
                  "the last report; retrying every second, said again in %.0f s at the earliest",
                  os.strerror(exc.errno), soft, self._failed, self.every_s)
        self._last_report, self._failed = now, 0


def quiet_accept_failures(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """Install AcceptFailureLog on `loop`; returns what puts the handler before it back."""
    previous = loop.get_exception_handler()
    loop.set_exception_handler(AcceptFailureLog(previous))
    return lambda: loop.set_exception_handler(previous)
