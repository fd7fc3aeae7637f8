"""Serving a fake's aiohttp app on loopback, on a free port or the same one again: the fakes'
`stop()` then `start()` is a service that goes away and comes back where clients expect it."""

from __future__ import annotations

import socket

from aiohttp import web


async def serve(app: web.Application, port: int | None = None) -> tuple[web.AppRunner, int]:
    """The app listening on 127.0.0.1:`port` (None or 0: a free one); its runner and port. Cleaning the
    runner up drops open connections almost at once, as an outage does (a shutdown timeout of 0
    would mean "wait for every handler to finish")."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port or 0))
    runner = web.AppRunner(app, shutdown_timeout=0.01, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]
