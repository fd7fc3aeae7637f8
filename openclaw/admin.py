"""The admin port: `/healthz` (JSON, 503 unless healthy) and Prometheus `/metrics`, over a tiny
HTTP/1.1 server on asyncio streams.

Deliberately minimal: one request per connection (`Connection: close`), GET and HEAD only, a cap on
the request head and a read timeout, so a stuck or hostile client cannot hold the daemon's memory
or sockets. Request headers and bodies are never logged: a scraper's credentials may be in them.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from openclaw.metrics import Metrics

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8 * 1024
READ_TIMEOUT_S = 10.0
# A small body (a mistaken POST) is read and dropped so that closing the socket does not reset the
# connection before the client has read our answer; a bigger one is not worth waiting for.
MAX_DISCARD_BYTES = 64 * 1024
LINGER_S = 1.0

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JSON_CONTENT_TYPE = "application/json"

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 421: "Misdirected Request", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 token: a method name
_VERSION = re.compile(r"^HTTP/1\.[0-9]$")

Health = Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]]


@dataclass
class _Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    allow: str | None = None


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


class _BadRequest(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class AdminServer:
    """Serves `/healthz` from `health()` and `/metrics` from `metrics.render()`."""

    def __init__(self, metrics: Metrics, health: Health, *, read_timeout: float = READ_TIMEOUT_S) -> None:
        self.metrics = metrics
        self.health = health
        self.read_timeout = read_timeout
        self.host: str | None = None
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    @property
    def url(self) -> str:
        """Base URL of the running server, e.g. http://127.0.0.1:9477."""
        if self.host is None or self.port is None:
            raise RuntimeError("the admin server is not running; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on host:port; port 0 picks a free port, read back from `.port`. A port that
        something else holds is an AdminPortInUse."""
        if self._server is not None:
            raise RuntimeError(f"the admin server already listens on {self.url}")
        if port == 0:
            # A name such as "localhost" can resolve to ::1 and 127.0.0.1, and port 0 would give
            # each its own random port; bind the first address so there is one port to report.
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            host = infos[0][4][0]
        try:
            self._server = await asyncio.start_server(self._on_connection, host, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise AdminPortInUse(host, port) from exc
            raise
        bound = self._server.sockets[0].getsockname()
        self.host, self.port = bound[0], bound[1]

    async def stop(self) -> None:
        """Stop listening and drop open connections; returns once the socket is closed."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Aborting the transports ends each handler at its next read or write, as if the client had
        # hung up; cancelling the tasks instead makes Python 3.11's streams log a spurious error.
        for writer in self._connections.values():
            writer.transport.abort()
        tasks = list(self._connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=LINGER_S)
            for task in pending:  # stuck in a slow health() callback: give up on it
                task.cancel()
        await server.wait_closed()

    # ---- one connection ------------------------------------------------------------------------

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # start_server runs each connection in its own task
        self._connections[task] = writer  # so stop() can drop connections that are still open
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            writer.transport.abort()  # stop() gave up waiting; end quietly (see stop)
        finally:
            del self._connections[task]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                async with asyncio.timeout(self.read_timeout):
                    method, path, host, unread_body = await self._read_request(reader)
                    if unread_body:
                        await reader.readexactly(unread_body)
                if self._foreign_host(host):
                    response = _Response(421, b"This port answers only to localhost and IP "
                                              b"addresses.\n")
                else:
                    response = await self._route(method, path)
            except _BadRequest as exc:
                method, response = "GET", _Response(exc.status, _REASONS[exc.status].encode() + b"\n")
            except TimeoutError:
                method, response = "GET", _Response(408, b"Request Timeout\n")
            except asyncio.IncompleteReadError:  # a body shorter than its Content-Length
                method, response = "GET", _Response(400, b"Bad Request\n")
            await self._respond(writer, response, head_only=method == "HEAD")
            await self._linger(reader)
        except (ConnectionError, _ClosedEarly):
            pass  # the client went away; nothing to answer
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                pass

    async def _read_request(self, reader: asyncio.StreamReader) -> tuple[str, str, str | None, int]:
        """Method, path without query, the Host header (None without one), and how many body
        bytes are still to be read and dropped."""
        head, body_start = await _read_head(reader)
        lines = head.decode("latin-1").splitlines()
        parts = lines[0].split(" ") if lines else []
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not _VERSION.match(parts[2]):
            raise _BadRequest(400)
        method, target, _version = parts
        if not target.startswith("/"):
            raise _BadRequest(400)
        content_length, host = 0, None
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise _BadRequest(400)
            if name.lower() == "content-length":
                if not value.strip().isdigit():
                    raise _BadRequest(400)
                content_length = int(value.strip())
            elif name.lower() == "host":
                host = value.strip()
        unread = content_length - len(body_start)
        if unread > MAX_DISCARD_BYTES:
            unread = 0  # not worth waiting for; _linger drops what arrives after the answer
        return method, target.split("?", 1)[0], host, max(unread, 0)

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

    async def _route(self, method: str, path: str) -> _Response:
        if path not in ("/healthz", "/metrics"):
            return _Response(404, b"Not Found\n")
        if method not in ("GET", "HEAD"):
            return _Response(405, b"Method Not Allowed\n", allow="GET, HEAD")
        if path == "/metrics":
            try:
                return _Response(200, self.metrics.render().encode(), METRICS_CONTENT_TYPE)
            except Exception:
                log.exception("rendering /metrics failed")
                return _Response(500, b"Internal Server Error\n")
        return await self._healthz()

    async def _healthz(self) -> _Response:
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
        return _Response(200 if healthy else 503, body.encode() + b"\n", JSON_CONTENT_TYPE)

    @staticmethod
    async def _respond(writer: asyncio.StreamWriter, response: _Response, *, head_only: bool) -> None:
        headers = [f"HTTP/1.1 {response.status} {_REASONS[response.status]}",
                   f"Content-Type: {response.content_type}",
                   f"Content-Length: {len(response.body)}",
                   "Cache-Control: no-store",
                   "X-Content-Type-Options: nosniff",
                   "Connection: close"]
        if response.allow:
            headers.append(f"Allow: {response.allow}")
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(response.body)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    @staticmethod
    async def _linger(reader: asyncio.StreamReader) -> None:
        """Wait briefly for the client to close, discarding what it still sends.

        Closing a socket with unread input makes the kernel send a reset, which can destroy our
        answer before the client reads it (a 431 for a huge head, say). We half-closed already.
        """
        try:
            async with asyncio.timeout(LINGER_S):
                received = 0
                while received < MAX_DISCARD_BYTES and (chunk := await reader.read(4096)):
                    received += len(chunk)
        except TimeoutError:
            pass


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


class _ClosedEarly(Exception):
    """The client closed the connection before sending a complete request head."""


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The request line and headers (at most MAX_HEAD_BYTES), and the body bytes read with them."""
    buffer = bytearray()
    while True:
        found = _head_end(buffer)
        if found is not None:
            end, separator = found
            if end > MAX_HEAD_BYTES:
                raise _BadRequest(431)
            return bytes(buffer[:end]), bytes(buffer[end + separator:])
        if len(buffer) > MAX_HEAD_BYTES:
            raise _BadRequest(431)
        chunk = await reader.read(4096)
        if not chunk:
            if buffer.strip():
                raise _BadRequest(400)  # a head cut off by the client's half-close
            raise _ClosedEarly
        buffer += chunk


def _head_end(buffer: bytearray) -> tuple[int, int] | None:
    """Where the head ends and the length of the blank line that ends it."""
    # CRLF is the standard; bare LF is accepted as RFC 9112 permits, for hand-typed requests.
    ends = [(i, len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (i := buffer.find(sep)) >= 0]
    return min(ends) if ends else None
