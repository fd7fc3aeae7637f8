"""The API's aiohttp application: routes, the middlewares every request passes (its count in the
metrics, errors in OpenAI's shape, the API key, the Host check), and `APIServer`, which runs it
in the caller's event loop (`openclaw serve`, or the daemon on the model it already loaded) behind
openclaw.listener's gate, so a flood of connections cannot take the process's descriptors."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import resource
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from aiohttp import web

from openclaw.config import ConfigError
from openclaw.config.sections import ServeConfig
from openclaw.listener import CEILING, Listener
from openclaw.serve import chat, completions, metrics, models, tokens
from openclaw.serve.errors import INVALID_REQUEST, NOT_FOUND, SERVER_ERROR, APIError
from openclaw.serve.state import DEFAULT_MAX_WAITING, STATE, ServeState, default_model_name

if TYPE_CHECKING:
    from engine import AsyncLLM

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20  # a long conversation with tool results; far beyond any context
OPEN_PATHS = frozenset({"/health"})  # answered without the key: a load balancer's probe
# A request head (the request line and headers): the first within HEAD_TIMEOUT_S of connecting
# (the listener's gate), each at most MAX_HEAD_BYTES; a connection idle between requests is
# closed after KEEPALIVE_S, so idle clients do not hold the connection cap.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
KEEPALIVE_S = 15.0
# The kernel's queue of connections not yet accepted: streaming clients arrive in bursts, and
# one past the queue waits a second for its retry.
BACKLOG = 128
# How long a stop waits for handlers to end before cancelling them: the answers in flight are
# ended first (ServeState.stop), so this is only for a client that does not read its last bytes.
SHUTDOWN_TIMEOUT_S = 2.0
# At most this share of the open-files limit for the API's connections (the listener's ceiling,
# twice the cap, included): the rest is the daemon's files, database, connectors and commands.
FILES_SHARE = 4

# aiohttp logs a request it cannot parse with the bytes that broke it, which may hold the API
# key: to a logger that is off, and outside logging's tree, where no configuration turns it on.
_UNLOGGED = logging.Logger(__name__ + ".requests")
_UNLOGGED.disabled = True


def build_app(state: ServeState) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[
        metrics.count_requests, errors_middleware, access_middleware])
    app[STATE] = state
    app[metrics.METRICS] = metrics.ServeMetrics(state)
    app.router.add_get("/v1/models", models.list_models)
    app.router.add_get("/v1/models/{model}", models.get_model)
    app.router.add_post("/v1/chat/completions", chat.chat_completions)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/tokenize", tokens.tokenize)
    app.router.add_post("/detokenize", tokens.detokenize)
    app.router.add_get("/health", models.health)
    app.router.add_get("/metrics", metrics.metrics)
    return app


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Every error in OpenAI's shape. Nothing of a request's body is logged: it is someone's
    conversation."""
    try:
        return await handler(request)
    except APIError as exc:
        return exc.response()
    except web.HTTPException as exc:  # no such path, a method not allowed, a body too large
        if exc.status < 400:
            raise
        kind = NOT_FOUND if exc.status == 404 else INVALID_REQUEST
        return APIError(exc.status, f"{request.method} {request.path}: {exc.reason}",
                        type=kind).response()
    except (ConnectionResetError, asyncio.CancelledError):  # the client left
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return APIError(500, "the server failed to answer; its log says why",
                        type=SERVER_ERROR).response()


@web.middleware
async def access_middleware(request: web.Request, handler) -> web.StreamResponse:
    """A browser's request from a page of another site gets 403 (check_browser), and a POST
    whose body is not declared JSON 415. With a key, every path but /health asks for
    `Authorization: Bearer KEY` (compared in constant time). Without one the server listens on
    loopback only, and answers only requests addressed to a loopback name: a web page that
    rebinds its own name to 127.0.0.1 gets no answer from the model (DNS rebinding)."""
    check_browser(request)
    key = request.app[STATE].api_key
    if key is not None:
        if request.path not in OPEN_PATHS:
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            # The scheme is case-insensitive (RFC 9110): clients send "bearer" too.
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.encode("utf-8", "surrogateescape"), key.encode()):
                raise APIError(401, "a valid API key is required: send the header "
                               "`Authorization: Bearer KEY`", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
    elif not addressed_to_loopback(request.host):
        raise APIError(421, "this server answers only requests addressed to localhost or a "
                       "loopback address; set an API key to serve other names",
                       code="misdirected_request")
    if request.method == "POST" and request.content_type != "application/json":
        # A form or text POST is what a page of another site may send without a preflight.
        raise APIError(415, "send the body as JSON, with the header `Content-Type: "
                       "application/json`", code="unsupported_media_type")
    return await handler(request)


def check_browser(request: web.Request) -> None:
    """A 403 for a request a browser sends from a page that is not on this machine: an Origin
    that is not loopback ("null" included: a sandboxed or file page), or Sec-Fetch-Site
    cross-site. Without them, a page the user visits could use the model on loopback (CSRF)."""
    origin = request.headers.get("Origin")
    if origin is not None:
        try:
            name = urlsplit(origin).hostname
        except ValueError:
            name = None
        if not (name and addressed_to_loopback(f"[{name}]" if ":" in name else name)):
            raise cross_origin()
    if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
        raise cross_origin()


def cross_origin() -> APIError:
    return APIError(403, "this server answers no page of another site; call it from a program, "
                    "or from a page served on localhost", code="cross_origin")


def addressed_to_loopback(host_header: str) -> bool:
    """Whether a Host header ("localhost:8000", "127.0.0.1", "[::1]:8000") names loopback."""
    name = host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def connection_cap(asked: int) -> int:
    """The connections the API takes at once: `asked`, lowered where the open-files limit is too
    small for it to stay within its share."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return asked
    cap = max(1, min(asked, soft // (FILES_SHARE * CEILING)))
    if cap < asked:
        log.warning("the API takes at most %d connections at once, not %d ([serve] "
                    "max_connections): the open-files limit is %d (raise it: LimitNOFILE=, "
                    "ulimit -n)", cap, asked, soft)
    return cap


class APIServer:
    """The API over one AsyncLLM, on `config.host` and `config.port` (a ServeConfig, checked as
    the config file's [serve] is: beyond loopback only with an api_key), at most
    `config.max_connections` connections at once (see openclaw/listener.py for how a flood is
    held off)."""

    def __init__(self, llm: AsyncLLM, config: ServeConfig, *,
                 max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        self.config = config
        name = config.served_model_name or default_model_name(llm.engine.config.model)
        key = config.api_key.get() if config.api_key is not None else None
        self.state = ServeState(llm, name, api_key=key, max_waiting=max_waiting)
        self.app = build_app(self.state)
        self._site: tuple[web.AppRunner, Listener] | None = None  # while it listens
        self.host: str | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        return self._site[1].connections if self._site is not None else 0

    async def start(self) -> None:
        """Listen; port 0 picks a free one, read back from `.port`."""
        host, port = self.config.host, self.config.port
        # A client that leaves ends its handler, and with it the engine request (blocks freed).
        runner = web.AppRunner(self.app, access_log=None, logger=_UNLOGGED,
                               handler_cancellation=True, keepalive_timeout=KEEPALIVE_S,
                               shutdown_timeout=SHUTDOWN_TIMEOUT_S,
                               max_line_size=MAX_HEAD_BYTES, max_field_size=MAX_HEAD_BYTES)
        await runner.setup()
        if port == 0:  # a name such as localhost would get a free port per address
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
            host = infos[0][4][0]
        listener = Listener(runner.server, max_connections=connection_cap(self.config.max_connections),
                            max_head_bytes=MAX_HEAD_BYTES, read_timeout=HEAD_TIMEOUT_S,
                            on_drop=self.app[metrics.METRICS].dropped.inc)
        try:
            self.host, self.port = await listener.start(host, port, backlog=BACKLOG)
        except BaseException:
            await runner.cleanup()
            raise
        self._site = runner, listener

    async def stop(self) -> None:
        """Stop listening and end the requests in flight at once: their engine requests are
        aborted, a stream ends with an error event and [DONE], a whole answer gets a 503."""
        if self._site is None:
            return
        (runner, listener), self._site = self._site, None
        listener.close()  # no new connection, and the ones without a whole request dropped
        self.state.stop()
        await runner.cleanup()
        await listener.wait_closed()


async def serve_daemon_model(model: object, config: ServeConfig) -> APIServer:
    """The daemon's [serve]: the API on the engine it already loaded, so the machine holds the
    weights once. Only an in-process engine can be served so."""
    from openclaw.backends.local import LocalBackend

    if not isinstance(model, LocalBackend):
        raise ConfigError(None, [
            "[serve] enabled = true serves the daemon's in-process engine, and this daemon talks "
            f"to its model through {type(model).__name__}; run `openclaw serve` beside it, or "
            "set [serve] enabled = false"])
    server = APIServer(model.llm, config)
    try:
        await server.start()
    except OSError as exc:
        raise OSError(exc.errno, f"[serve] port {config.port} on {config.host}: {exc.strerror}; "
                      "set [serve] port = N (a free one), or [serve] enabled = false") from exc
    log.info("OpenAI-compatible API on %s/v1, model %s", server.url, server.state.model_name)
    return server
