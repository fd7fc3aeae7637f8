"""Waiting for what a running daemon does later, by polling: no fixed sleeps, as the machine may
be busy and a sleep long enough there is slow everywhere else."""

from __future__ import annotations

import asyncio


async def until(condition, timeout: float = 10.0) -> None:
    """Wait for `condition()` to hold."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def eventually(read, ok, timeout: float = 10.0):
    """What `read()` returns once `ok` holds for it (a store query the daemon changes later)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not ok(value := await read()):
        assert asyncio.get_running_loop().time() < deadline, f"still {value!r}"
        await asyncio.sleep(0.01)
    return value
