"""The admin port: `/healthz` (JSON, 503 unless healthy) and Prometheus `/metrics`, an aiohttp
application run in the daemon's loop behind openclaw.listener's gate.

One request per connection (`Connection: close`), GET and HEAD only, at most MAX_CONNECTIONS at
once and a request head within MAX_HEAD_BYTES and READ_TIMEOUT_S, so a stuck, hostile or flooding
client cannot hold the daemon's memory or descriptors. Nothing about a request is logged (no access
log, and aiohttp's own parse errors go nowhere): a scraper's credentials may be in its headers.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import ipaddress
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from openclaw.listener import LINGER_S, MAX_DISCARD_BYTES, Listener
from openclaw.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from openclaw.metrics import Metrics

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8 * 1024
READ_TIMEOUT_S = 10.0
# Prometheus, a health checker and `openclaw doctor` need a few; each one over this costs nothing.
MAX_CONNECTIONS = 32

JSON_CONTENT_TYPE = "application/json"

# aiohttp logs a request it cannot parse with the bytes that broke it, a header's included: to a
# logger that is off, and outside logging's tree, where no configuration can turn it on.
_UNLOGGED = logging.Logger(__name__ + ".requests")
_UNLOGGED.disabled = True

Health = Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]]


class AdminPortInUse(OSError):
    """Something else listens on the admin port; says which key to change."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(f"[admin] port {port} on {host} is in use (another openclaw? see "
                         "`ss -ltnp`); set [admin] port or [admin] enabled = false")
        self.errno = errno.EADDRINUSE
        self.host, self.port = host, port


def port_in_use(host: str, port: int) -> bool:
    """Whether start(host, port) would find the port taken: bound as asyncio binds it (address
    reuse on, so a port left in TIME_WAIT counts as free), then released at once."""
    for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                raise
    return False


class AdminServer:
    """Serves `/healthz` from `health()` and `/metrics` from `metrics.render()`."""

    def __init__(self, metrics: Metrics, health: Health, *, read_timeout: float = READ_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.metrics = metrics
        self.health = health
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.host: str | None = None
        self.port: int | None = None
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. http://127.0.0.1:9477."""
        if self.host is None or self.port is None:
            raise RuntimeError("the admin server is not running; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now (for tests and the flood's checks)."""
        return self._listener.connections if self._listener is not None else 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on host:port; port 0 picks a free port, read back from `.port`. A port that
        something else holds is an AdminPortInUse."""
        if self._runner is not None:
            raise RuntimeError(f"the admin server already listens on {self.url}")
        if port == 0:
            # A name such as "localhost" can resolve to ::1 and 127.0.0.1, and port 0 would give
            # each its own random port; bind the first address so there is one port to report.
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            host = infos[0][4][0]
        app = web.Application(client_max_size=MAX_DISCARD_BYTES)  # a body is never read anyway
        app.router.add_route("*", "/{path:.*}", self._handle)
        runner = web.AppRunner(
            app, handle_signals=False, access_log=None, logger=_UNLOGGED,
            handler_cancellation=True,  # a client that hangs up ends a slow health() for it
            shutdown_timeout=LINGER_S, lingering_time=LINGER_S, keepalive_timeout=self.read_timeout,
            max_line_size=MAX_HEAD_BYTES, max_field_size=MAX_HEAD_BYTES)
        await runner.setup()
        listener = Listener(runner.server, max_connections=self.max_connections,
                            max_head_bytes=MAX_HEAD_BYTES, read_timeout=self.read_timeout,
                            on_drop=lambda: self.metrics.inc("openclaw_admin_connections_dropped_total"))
        try:
            self.host, self.port = await listener.start(host, port)
        except OSError as exc:
            await runner.cleanup()
            if exc.errno == errno.EADDRINUSE:
                raise AdminPortInUse(host, port) from exc
            raise
        self._runner, self._listener = runner, listener

    async def stop(self) -> None:
        """Stop listening and drop open connections; returns once the socket is closed. A request
        still being answered gets LINGER_S, then is cancelled."""
        runner, listener, self._runner, self._listener = self._runner, self._listener, None, None
        if runner is None or listener is None:
            return
        listener.close()
        await runner.cleanup()
        await listener.wait_closed()

    # ---- one request ---------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        # aiohttp answers an HTTP/0.9 request and an absolute URL; this port takes neither.
        if request.version < (1, 0) or not request.raw_path.startswith("/"):
            return _response(400, b"Bad Request\n")
        if self._foreign_host(request.headers.get("Host")):
            return _response(421, b"This port answers only to localhost and IP addresses.\n")
        path = request.raw_path.split("?", 1)[0]
        if path not in ("/healthz", "/metrics"):
            return _response(404, b"Not Found\n")
        if request.method not in ("GET", "HEAD"):
            response = _response(405, b"Method Not Allowed\n")
            response.headers["Allow"] = "GET, HEAD"
            return response
        if path == "/metrics":
            try:
                return _response(200, self.metrics.render().encode(), METRICS_CONTENT_TYPE)
            except Exception:
                log.exception("rendering /metrics failed")
                return _response(500, b"Internal Server Error\n")
        return await self._healthz()

    def _foreign_host(self, host: str | None) -> bool:
        """A request to the loopback port for a host name that is not a loopback one: a web page
        whose name was made to resolve to 127.0.0.1 (DNS rebinding) would otherwise read
        /metrics and /healthz from the user's browser. Names are no concern on a port the admin
        opened to others (allow_remote), nor without a Host (HTTP/1.0). Answered 421."""
        if host is None or not _is_loopback_address(self.host):
            return False
        if host.startswith("["):  # an IPv6 address, [::1]:9477
            name = host[1:].partition("]")[0]
        else:
            name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        name = name.rstrip(".").lower()
        # A page needs a name in public DNS, which has a dot; a one-word name is this machine's
        # (/etc/hosts, a search domain), as is localhost, and so are its own names.
        if "." not in name or name.endswith(".localhost") or name in _own_names():
            return False
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return True
        return False  # an address names no site a page could rebind

    async def _healthz(self) -> web.Response:
        try:
            report = self.health()
            if inspect.isawaitable(report):
                report = await report
            body = json.dumps(report, default=str)
            healthy = isinstance(report, dict) and report.get("status") == "ok"
        except Exception as exc:
            log.exception("the health check failed")
            body = json.dumps({"status": "error", "error": type(exc).__name__})
            healthy = False
        return _response(200 if healthy else 503, body.encode() + b"\n", JSON_CONTENT_TYPE)


def _response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> web.Response:
    response = web.Response(status=status, body=body, headers={
        "Content-Type": content_type, "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
    response.force_close()  # one request per connection: nothing to keep open between scrapes
    return response


@functools.cache
def _own_names() -> frozenset[str]:
    """This machine's dotted names a local client may use for the loopback port: its host name
    (no DNS look-up: that could stall the loop) and the usual /etc/hosts alias of 127.0.0.1."""
    return frozenset({"localhost.localdomain", socket.gethostname().lower().rstrip(".")})


def _is_loopback_address(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
