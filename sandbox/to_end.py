"""Work that must run to its end even when its caller is cancelled (/stop, a tool's timeout,
shutdown), and what it made undone if nobody is left to use it: a process started, a cgroup or a
descriptor opened in a worker thread. Cancelling the await would leave such work running
unwatched (a thread cannot be stopped) and its result leaked."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def run_to_end(work: Awaitable[T], undo: Callable[[T], object] | None = None) -> T:
    """`work`'s result. Cancelled meanwhile, this still waits for `work` to finish (through
    further cancellations too), hands what it made to `undo`, then raises CancelledError."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():  # asyncio.wait does not cancel what it waits on
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        # exception() also marks a failure as seen: nobody is left to take it, and asyncio would
        # log "Task exception was never retrieved".
        if not task.cancelled() and task.exception() is None and undo is not None:
            undo(task.result())
        raise
