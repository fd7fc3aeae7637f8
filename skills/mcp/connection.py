"""One live connection to an MCP server, through the SDK's `Client`: over the pipes of a sandboxed
program (sandbox.service) for a stdio server, or streamable HTTP for a URL. The client lives in a
task of its own, which enters and leaves it (the SDK's task groups must be left by the task that
entered them); callers' tasks only send requests through it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from sandbox.service import Service

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0  # for the server to start and answer the handshake and the tool list
STOP_TIMEOUT_S = 5.0
EXIT_POLL_S = 0.05


class ServerDown(Exception):
    """The server cannot be reached now; the message says why (and when it is tried again)."""


@contextlib.asynccontextmanager
async def pipe_transport(service: Service) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's Transport over a started program's stdin and stdout: newline-delimited JSON-RPC
    (the MCP stdio framing). A line that is not a message reaches the session as an error."""
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    proc = service.proc

    async def reader() -> None:
        async with to_session:
            while line := await proc.stdout.readline():
                try:
                    item: SessionMessage | Exception = SessionMessage(
                        types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                except ValueError as exc:
                    item = exc
                await to_session.send(item)

    async def writer() -> None:
        async with from_session:
            async for message in from_session:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                proc.stdin.write(data.encode() + b"\n")
                await proc.stdin.drain()

    async with anyio.create_task_group() as group:
        group.start_soon(reader)
        group.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            group.cancel_scope.cancel()


class Connection:
    """The client of one running server: `open()` starts it (the handshake and the tool list),
    `call` sends a tool call, `close()` ends it. `ended` is set however it ends (a crash too)."""

    def __init__(self, target: Callable[[], Awaitable[Service]] | str,
                 headers: dict[str, str] | None = None) -> None:
        self._target, self._headers = target, headers or {}
        self.service: Service | None = None
        self.client: Client | None = None
        self.tools: list[Any] = []
        self.ended = asyncio.Event()
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.why_ended = ""

    async def open(self) -> None:
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run())
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close()
            raise ServerDown(f"it did not answer within {START_TIMEOUT_S:g} s of its start"
                             + self._stderr()) from None
        except BaseException:
            await self.close()
            raise

    async def _run(self) -> None:
        assert self._ready is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if isinstance(self._target, str):
                    # Its own headers (a token) on every request; redirects the SDK judges.
                    http = await stack.enter_async_context(httpx2.AsyncClient(
                        headers=self._headers, timeout=httpx2.Timeout(30, read=300)))
                    server: Any = streamable_http_client(self._target, http_client=http)
                else:
                    self.service = await self._target()
                    server = pipe_transport(self.service)
                client = await stack.enter_async_context(Client(server, mode="legacy", cache=None))
                self.client = client
                self.tools = list((await client.list_tools()).tools)
                self._ready.set_result(None)
                await self._until_stopped()
        except Exception as exc:
            self.why_ended = _reason(exc)
            if not self._ready.done():
                self._ready.set_exception(ServerDown(self.why_ended + self._stderr()))
        finally:
            if self.service is not None:
                await self.service.close()
                code = self.service.proc.returncode
                if not self._stop.is_set():
                    self.why_ended = self.why_ended or f"it exited (status {code})"
            if not self._ready.done():
                self._ready.set_exception(ServerDown(self.why_ended or "it ended during its start"))
            self.ended.set()

    async def _until_stopped(self) -> None:
        """Until close() or, for a program, its exit."""
        waits = [asyncio.create_task(self._stop.wait())]
        if self.service is not None:
            waits.append(asyncio.create_task(_exited(self.service)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    def _stderr(self) -> str:
        tail = self.service.stderr_tail() if self.service is not None else ""
        return f"; its stderr ends: {tail[-500:]}" if tail else ""

    @property
    def alive(self) -> bool:
        return self.client is not None and not self.ended.is_set()

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """The CallToolResult; ServerDown when the server ends before it answers."""
        if not self.alive:
            raise ServerDown(self.why_ended or "it is not running")
        assert self.client is not None
        calling = asyncio.create_task(self.client.call_tool(tool, arguments))
        ended = asyncio.create_task(self.ended.wait())
        try:
            await asyncio.wait({calling, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not calling.done():
                calling.cancel()
        if calling.done() and not calling.cancelled() and calling.exception() is None:
            return calling.result()
        if calling.done() and not calling.cancelled() and not self.ended.is_set():
            raise ServerDown(_reason(calling.exception()))
        raise ServerDown((self.why_ended or "it ended during the call") + self._stderr())

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await asyncio.shield(self._task)
            if not self._task.done():
                self._task.cancel()
                if self.service is not None:
                    await self.service.close()


async def _exited(service: Service) -> None:
    # Not proc.wait(): on 3.11 it also waits for the pipes, which a child it left may hold.
    while service.running:
        await asyncio.sleep(EXIT_POLL_S)


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(e) for e in exc.exceptions)
    text = str(exc) or type(exc).__name__
    return text if len(text) < 500 else text[:500] + "..."


def result_text(result: Any) -> tuple[str, bool]:
    """(the text a tool message carries, whether the server said it failed) of a CallToolResult:
    its text parts, other parts named; structured content as JSON only when it sent no text (the
    spec has a server send the same as text too, which the SDK does)."""
    parts: list[str] = []
    for item in result.content or []:
        if getattr(item, "type", None) == "text":
            parts.append(item.text)
        else:
            parts.append(f"[{getattr(item, 'type', 'content')} content not shown]")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not parts:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return "\n".join(parts), bool(result.is_error)
