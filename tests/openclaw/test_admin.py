"""The admin port over a real loopback socket: what Prometheus, a load balancer's health check,
curl, and a broken or hostile client each get back."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from openclaw.admin import AdminServer
from openclaw.metrics import Metrics


class Health:
    """A health callback whose answer a test can change."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {"status": "ok", "queue": 0}
        self.error: Exception | None = None

    def __call__(self) -> dict[str, Any]:
        if self.error:
            raise self.error
        return self.report


@pytest.fixture
def health() -> Health:
    return Health()


@pytest.fixture
def metrics() -> Metrics:
    m = Metrics()
    m.inc("openclaw_requests_total", channel="telegram")
    m.gauge("openclaw_queue_length", lambda: 3, "messages waiting or answering")
    return m


@pytest.fixture
async def server(metrics: Metrics, health: Health) -> AsyncIterator[AdminServer]:
    admin = AdminServer(metrics, health)
    await admin.start("127.0.0.1", 0)
    yield admin
    await admin.stop()


async def exchange(server: AdminServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes, parse the status, headers and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ")[1]), headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closed the connection without answering (a FIN or a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), timeout=2) == b""
    except ConnectionResetError:
        return True


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n".encode()


def fetch(url: str, data: bytes | None = None) -> tuple[int, str, bytes]:
    """urllib, the way a script or health checker would call us (run in a thread)."""
    try:
        with urllib.request.urlopen(url, data=data, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


async def test_healthz_answers_200_with_the_health_report_as_json(server: AdminServer) -> None:
    status, content_type, body = await asyncio.to_thread(fetch, server.url + "/healthz")
    assert status == 200
    assert content_type == "application/json"
    assert json.loads(body) == {"status": "ok", "queue": 0}


async def test_healthz_answers_503_when_not_ok(server: AdminServer, health: Health) -> None:
    health.report = {"status": "starting", "queue": 0}
    status, headers, body = await exchange(server, get("/healthz"))
    assert status == 503
    assert json.loads(body)["status"] == "starting"


async def test_healthz_answers_503_when_the_check_itself_fails(server: AdminServer, health: Health) -> None:
    health.error = RuntimeError("database is locked")
    status, _, body = await exchange(server, get("/healthz"))
    assert status == 503
    assert json.loads(body) == {"status": "error", "error": "RuntimeError"}


async def test_async_health_callbacks_are_awaited(metrics: Metrics) -> None:
    async def health() -> dict[str, Any]:
        return {"status": "ok", "source": "async"}

    admin = AdminServer(metrics, health)
    await admin.start("127.0.0.1", 0)
    try:
        status, _, body = await exchange(admin, get("/healthz"))
    finally:
        await admin.stop()
    assert status == 200 and json.loads(body)["source"] == "async"


async def test_metrics_serves_prometheus_text(server: AdminServer, metrics: Metrics) -> None:
    status, content_type, body = await asyncio.to_thread(fetch, server.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    text = body.decode()
    assert text == metrics.render()
    assert 'openclaw_requests_total{channel="telegram"} 1' in text
    assert "openclaw_queue_length 3" in text


async def test_every_response_closes_the_connection_and_states_its_length(server: AdminServer) -> None:
    status, headers, body = await exchange(server, get("/metrics"))
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)


async def test_query_strings_are_ignored(server: AdminServer) -> None:
    status, _, _ = await exchange(server, get("/healthz?verbose=1"))
    assert status == 200


async def test_head_returns_headers_without_a_body(server: AdminServer) -> None:
    status, headers, body = await exchange(server, b"HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert status == 200 and int(headers["content-length"]) > 0 and body == b""


async def test_unknown_path_is_404(server: AdminServer) -> None:
    status, _, _ = await exchange(server, get("/admin"))
    assert status == 404
    assert (await asyncio.to_thread(fetch, server.url + "/"))[0] == 404


async def test_post_is_405_and_names_the_allowed_methods(server: AdminServer) -> None:
    status, headers, _ = await exchange(
        server, b"POST /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 7\r\n\r\nx=1&y=2")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"
    status, _, _ = await asyncio.to_thread(fetch, server.url + "/metrics", b"x=1")
    assert status == 405


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET /healthz\r\n\r\n",
    b"GET /healthz HTTP/1.1 extra\r\n\r\n",
    b"GET healthz HTTP/1.1\r\n\r\n",
    b"GET /healthz SPDY/3\r\n\r\n",
    b"G(T /healthz HTTP/1.1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nContent-Length: many\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS ClientHello on the plain port
    b"GET http://localhost/healthz HTTP/1.1\r\nHost: localhost\r\n\r\n",  # absolute form
    b"GET /healthz HTTP/0.9\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\n\r\n",
])
async def test_malformed_requests_are_400(server: AdminServer, raw: bytes) -> None:
    status, _, _ = await exchange(server, raw)
    assert status == 400


async def test_a_request_head_over_8_kib_is_431(server: AdminServer) -> None:
    raw = b"GET /healthz HTTP/1.1\r\nX-Padding: " + b"a" * 9000 + b"\r\n\r\n"
    status, _, _ = await exchange(server, raw)
    assert status == 431


async def test_a_head_that_never_ends_is_431_without_waiting_for_the_rest(server: AdminServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nX-Padding: " + b"a" * 20000)  # no end of head
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 431 ")


async def test_a_client_that_sends_nothing_is_timed_out(metrics: Metrics, health: Health) -> None:
    admin = AdminServer(metrics, health, read_timeout=0.2)
    await admin.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", admin.port)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # ...and then silence
        data = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
    finally:
        await admin.stop()
    assert data.startswith(b"HTTP/1.1 408 ")


async def test_a_client_that_hangs_up_early_does_not_disturb_the_server(server: AdminServer) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /hea")
    writer.close()
    status, _, _ = await exchange(server, get("/healthz"))
    assert status == 200


async def test_request_headers_and_bodies_never_reach_the_log(server: AdminServer, health: Health,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "Bearer sk-very-secret-token"
    await exchange(server, f"GET /healthz HTTP/1.1\r\nAuthorization: {secret}\r\n\r\n".encode())
    await exchange(server, b"POST /metrics HTTP/1.1\r\nContent-Length: 14\r\n\r\npassword=hunter")
    health.error = RuntimeError("boom")
    await exchange(server, f"GET /healthz HTTP/1.1\r\nAuthorization: {secret}\r\n\r\n".encode())
    assert "sk-very-secret" not in caplog.text
    assert "hunter" not in caplog.text


async def test_port_zero_picks_a_free_port_and_reports_it(metrics: Metrics, health: Health) -> None:
    first, second = AdminServer(metrics, health), AdminServer(metrics, health)
    await first.start("127.0.0.1", 0)
    await second.start("localhost", 0)
    try:
        assert first.port and second.port and first.port != second.port
        for admin in (first, second):
            status, _, _ = await exchange(admin, get("/healthz"))
            assert status == 200
        assert first.url == f"http://127.0.0.1:{first.port}"
    finally:
        await first.stop()
        await second.stop()


async def test_stop_closes_the_listening_socket(metrics: Metrics, health: Health) -> None:
    admin = AdminServer(metrics, health)
    await admin.start("127.0.0.1", 0)
    port = admin.port
    await admin.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    await admin.stop()  # a second stop is harmless


async def test_stop_drops_idle_connections_instead_of_waiting_for_them(metrics: Metrics,
                                                                       health: Health) -> None:
    admin = AdminServer(metrics, health)  # the default 10 s read timeout
    await admin.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", admin.port)
    writer.write(b"GET /healthz HTTP/1.1\r\n")  # an incomplete request, then idle
    await writer.drain()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(admin.stop(), timeout=2)
    assert await closed_by_server(reader)
    writer.close()


async def test_stop_does_not_hang_on_a_health_check_that_never_returns(metrics: Metrics) -> None:
    async def stuck() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"status": "ok"}

    admin = AdminServer(metrics, stuck)
    await admin.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", admin.port)
    writer.write(get("/healthz"))
    await writer.drain()
    await asyncio.sleep(0.05)
    await asyncio.wait_for(admin.stop(), timeout=3)
    assert await closed_by_server(reader)
    writer.close()


async def test_starting_twice_is_refused(server: AdminServer) -> None:
    with pytest.raises(RuntimeError, match="already listens"):
        await server.start("127.0.0.1", 0)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:9477", "rebind.attacker.test"])
async def test_a_loopback_port_refuses_requests_for_other_host_names(server: AdminServer,
                                                                     host: str) -> None:
    # DNS rebinding: a web page whose name now resolves to 127.0.0.1 must not read the port.
    raw = f"GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    status, _, body = await exchange(server, raw)
    assert status == 421
    assert b"openclaw_requests_total" not in body


@pytest.mark.parametrize("host", ["localhost", "localhost:9477", "127.0.0.1:9477", "[::1]:9477",
                                  "prometheus.localhost", "LOCALHOST", "myhost:9477",
                                  "localhost.localdomain:9477",  # /etc/hosts' usual alias
                                  f"{socket.gethostname()}:9477"])  # this machine's own name
async def test_a_loopback_port_answers_to_loopback_names_and_addresses(server: AdminServer,
                                                                       host: str) -> None:
    status, _, _ = await exchange(server, f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    assert status == 200
    status, _, _ = await exchange(server, b"GET /healthz HTTP/1.0\r\n\r\n")  # no Host at all
    assert status == 200


async def test_nothing_about_a_request_is_logged_not_even_by_aiohttp(
        server: AdminServer, caplog: pytest.LogCaptureFixture) -> None:
    # No access log, and aiohttp's own reports of a request it cannot parse (which quote the
    # bytes that broke it, a header's included) go nowhere.
    caplog.set_level(logging.DEBUG)
    await exchange(server, get("/healthz"))
    await exchange(server, b"GET /healthz HTTP/1.1\r\nAuthorization: Bearer sk-secret\r\nbad header\r\n\r\n")
    await exchange(server, b"G(T /healthz HTTP/1.1\r\n\r\n")
    assert [r for r in caplog.records if r.name.startswith(("aiohttp", "openclaw.admin"))] == []


async def half_sent(server: AdminServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sent part of a request head and then nothing."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
    await writer.drain()
    return reader, writer


async def test_over_the_cap_the_oldest_half_sent_connection_makes_room(
        metrics: Metrics, health: Health) -> None:
    admin = AdminServer(metrics, health, max_connections=4)
    await admin.start("127.0.0.1", 0)
    try:
        held = [await half_sent(admin) for _ in range(4)]
        await asyncio.sleep(0.1)
        assert admin.connections == 4
        status, _, _ = await exchange(admin, get("/healthz"))
        assert status == 200  # it got in: it sent its head at once
        assert await closed_by_server(held[0][0])  # the oldest half-sent one made room
        assert admin.connections == 3
        assert metrics.value("openclaw_admin_connections_dropped_total") == 1
        for _, writer in held:
            writer.close()
    finally:
        await admin.stop()


async def test_a_flood_of_half_sent_connections_holds_no_more_than_the_cap(metrics: Metrics,
                                                                           health: Health) -> None:
    admin = AdminServer(metrics, health, max_connections=8)
    await admin.start("127.0.0.1", 0)
    try:
        held = [await half_sent(admin) for _ in range(200)]
        await asyncio.sleep(0.1)
        assert admin.connections <= 8
        assert metrics.value("openclaw_admin_connections_dropped_total") == 192
        status, _, body = await exchange(admin, get("/healthz"))
        assert status == 200 and json.loads(body)["status"] == "ok"
        for _, writer in held:
            writer.close()
    finally:
        await admin.stop()


async def test_with_every_slot_answering_a_new_connection_is_closed_at_once(metrics: Metrics) -> None:
    release = asyncio.Event()

    async def slow() -> dict[str, Any]:
        await release.wait()
        return {"status": "ok"}

    admin = AdminServer(metrics, slow, max_connections=2)  # twice that at once, briefly
    await admin.start("127.0.0.1", 0)
    try:
        answering = [asyncio.create_task(exchange(admin, get("/healthz"))) for _ in range(4)]
        while admin.connections < 4:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", admin.port)
        writer.write(get("/healthz"))
        assert await closed_by_server(reader)  # unanswered, without waiting for the others
        writer.close()
        release.set()
        assert [status for status, _, _ in await asyncio.gather(*answering)] == [200] * 4
        assert metrics.value("openclaw_admin_connections_dropped_total") == 1
    finally:
        await admin.stop()
