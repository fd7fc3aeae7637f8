"""The console of a running daemon: `openclaw chat` attaches here instead of starting a second one.

A Unix socket in the data folder (mode 0600: only the daemon's own user can connect, and that user
is the console's owner, `terminal:local`). The protocol is JSON lines. Client to daemon:
`{"text": "..."}`. Daemon to client: `{"type": "draft", "text": ...}` while a reply streams,
`{"type": "reply", "text": ...}` for each message sent, and `{"type": "done"}` once everything the
line caused has been answered, so a script can send the next line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from connectors.terminal import for_terminal
from openclaw.gateway.contract import (
    Connector,
    ConnectorStartError,
    Handler,
    InboundMessage,
    without_literal_blocks,
)

log = logging.getLogger(__name__)

MAX_LINE = 1 << 20
SEND_TIMEOUT_S = 5.0  # a console that reads nothing for this long is dropped, not waited for
DRAFT_BACKLOG = 1 << 16  # bytes unsent to a console past which its drafts are skipped
INPUT_END_WAIT_S = 2.0  # for a script's end of input once its daemon went away


class ConsoleSocketConnector(Connector):
    name = "terminal"
    max_message_len = 1_000_000
    streams_drafts = True

    def __init__(self, path: Path, idle: Callable[[], Awaitable[None]],
                 attached: Callable[[], None] | None = None) -> None:
        """`idle()` returns once everything sent so far is answered and delivered; `attached()`
        is told when a console attaches (replies waiting for one can go now)."""
        self.path = path
        self._idle = idle
        self._attached = attached
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()

    async def start(self, handler: Handler) -> None:
        try:
            _, writer = await asyncio.open_unix_connection(str(self.path))
        except OSError:
            pass  # nobody listening: no socket, or a stale one from a daemon that died
        else:
            writer.close()
            raise ConnectorStartError(f"another openclaw daemon is running (its console answers at "
                               f"{self.path}); stop it first, or use `openclaw chat` to talk to it")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        old_umask = os.umask(0o177)  # created 0600, never briefly world-connectable
        try:
            self._server = await asyncio.start_unix_server(
                lambda r, w: self._session(r, w, handler), path=str(self.path), limit=MAX_LINE)
        except OSError as exc:  # e.g. a path over the 107-byte limit of Unix sockets
            log.warning("no console socket at %s (%s): `openclaw chat` cannot attach", self.path, exc)
        finally:
            os.umask(old_umask)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._clients):
                writer.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       handler: Handler) -> None:
        self._clients.add(writer)
        if self._attached is not None:
            self._attached()
        answering: set[asyncio.Task] = set()
        try:
            # Lines are taken while earlier ones are answered: a /stop must reach the gateway
            # while the reply it stops is still streaming.
            while line := await reader.readline():
                try:
                    text = str(json.loads(line)["text"]).strip()
                except (ValueError, KeyError, TypeError):
                    await self._send(writer, {"type": "error", "text": "expected {\"text\": ...}"})
                    continue
                if text:
                    await handler(InboundMessage("terminal", "local", "local", uuid.uuid4().hex,
                                                 text, display_name="console"))
                task = asyncio.create_task(self._done_when_idle(writer, wait=bool(text)))
                answering.add(task)
                task.add_done_callback(answering.discard)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except RuntimeError as exc:  # the daemon is shutting down
            with contextlib.suppress(ConnectionError):
                await self._send(writer, {"type": "error", "text": str(exc)})
        finally:
            for task in answering:
                task.cancel()
            self._clients.discard(writer)
            writer.close()

    async def _done_when_idle(self, writer: asyncio.StreamWriter, wait: bool) -> None:
        """Tell the client a line is answered: everything it caused has been (and was sent)."""
        if wait:
            await self._idle()
        with contextlib.suppress(ConnectionError):
            await self._send(writer, {"type": "done"})

    async def _broadcast(self, message: dict) -> int:
        """Send to every attached console; how many took it. A console that stopped reading
        (suspended, hung) skips drafts, which the next one replaces, and is dropped when a
        message cannot reach it in time: it must not hold the others, or the turn, back."""
        took = 0
        for writer in list(self._clients):
            if message["type"] == "draft" and writer.transport.get_write_buffer_size() > DRAFT_BACKLOG:
                continue
            try:
                await self._send(writer, message)
                took += 1
            except ConnectionError:
                self._clients.discard(writer)
                writer.close()
        return took

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, message: dict) -> None:
        writer.write(json.dumps(message).encode() + b"\n")
        try:
            await asyncio.wait_for(writer.drain(), SEND_TIMEOUT_S)
        except TimeoutError:
            raise ConnectionError("the console reads nothing") from None

    @property
    def connected(self) -> bool:
        """Whether a console is attached: what is sent now is seen by someone."""
        return bool(self._clients)

    async def send_text(self, chat_id: str, text: str) -> str | None:
        # With nobody attached the reply would be lost: the outbox keeps it and retries, so the
        # next `openclaw chat` gets it.
        text = without_literal_blocks(text)  # a terminal has no markup: the text as it is
        if not await self._broadcast({"type": "reply", "text": text}):
            raise ConnectionError("no console is attached")
        return None

    async def draft(self, chat_id: str, text: str) -> None:
        await self._broadcast({"type": "draft", "text": text})

    async def typing(self, chat_id: str) -> None:
        return None


async def attach(path: Path, lines: Callable[[], Awaitable[str]], out: Callable[[str], None],
                 interactive: bool, prompt: Callable[[], None] | None = None, *,
                 screen: bool | None = None) -> bool:
    """Chat through a running daemon's console socket. False if no daemon is listening there.

    What the daemon sends is shown as it comes, also while waiting for the next line (a reminder
    arrives on its own). A person's lines go as typed (a /stop must not wait for the reply it
    stops), and `prompt()` is shown when nothing is being answered; piped lines go one at a time,
    each once the daemon has answered the one before, and a daemon gone before the last answer
    is a ConnectionError (a script must not pass for answered). `screen`: `out` shows on a
    terminal (default: `interactive`; lines piped in may be answered on one), so the replies'
    control characters are made visible (connectors.terminal.for_terminal)."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=MAX_LINE)
    except PermissionError as exc:
        raise PermissionError(f"a daemon is running but its console {path} belongs to another "
                              "user; run `openclaw chat` as the user the service runs as") from exc
    except OSError:  # no socket, a stale one, or a path too long for one: no daemon to attach to
        return False
    waiting = _Unanswered(prompt if interactive else None)
    showing = asyncio.create_task(_show(reader, out, interactive, waiting,
                                        interactive if screen is None else screen))
    try:
        while True:
            waiting.prompt_if_idle()
            # Waiting for the person's next line ends when the daemon goes away, too.
            typed = asyncio.ensure_future(lines())
            await asyncio.wait({typed, showing}, return_when=asyncio.FIRST_COMPLETED)
            if showing.done():  # the daemon went away: nothing typed can reach it
                if not interactive:  # a script must not pass for done with lines left unsent
                    await _check_input_over(typed)
                typed.cancel()
                return True
            line = typed.result()
            if not line:
                break
            waiting.sent()
            writer.write(json.dumps({"text": line.rstrip("\n")}).encode() + b"\n")
            await writer.drain()
            if not interactive:  # a script's lines go one at a time; a person may /stop anytime
                await waiting.none()
                if waiting.lost:
                    raise ConnectionError("the daemon went away before answering")
        await waiting.none()  # at the end of input, the answers still coming are shown
        if waiting.lost and not interactive:
            raise ConnectionError("the daemon went away before answering")
        return True
    finally:
        showing.cancel()
        writer.close()


async def _check_input_over(typed: asyncio.Future[str]) -> None:
    """After the daemon went away with every line sent answered: a ConnectionError unless the
    input has ended. Its end ("") may not have been read yet (a stopping daemon often closes right
    after its last "done"), so it is waited for, briefly: input that stays open is not."""
    try:
        line = await asyncio.wait_for(asyncio.shield(typed), INPUT_END_WAIT_S)
    except TimeoutError:
        raise ConnectionError("the daemon went away while more input could still come") from None
    if line:
        raise ConnectionError("the daemon went away before the input was all sent")


class _Unanswered:
    """Lines sent whose "done" has not come back, and the prompt shown when there are none."""

    def __init__(self, prompt: Callable[[], None] | None) -> None:
        self.count, self._zero, self._prompt = 0, asyncio.Event(), prompt
        self._zero.set()
        self.lost = False  # the daemon went away with lines unanswered
        self._prompted = False

    def sent(self) -> None:
        self.count += 1
        self._zero.clear()
        self._prompted = False

    def answered(self) -> None:
        self.count = max(self.count - 1, 0)
        if not self.count:
            self._zero.set()
            self.prompt_if_idle()

    def gone(self) -> None:
        """Nothing more will come: whoever waits for answers must stop waiting."""
        self.lost = self.count > 0
        self.count = 0
        self._zero.set()

    def shown(self) -> None:
        """Something was printed: the prompt, if it was up, is no longer the last line."""
        self._prompted = False
        self.prompt_if_idle()

    def prompt_if_idle(self) -> None:
        if self._prompt is not None and not self.count and not self._prompted:
            self._prompted = True
            self._prompt()

    async def none(self) -> None:
        await self._zero.wait()


async def _show(reader: asyncio.StreamReader, out: Callable[[str], None], interactive: bool,
                waiting: _Unanswered, screen: bool) -> None:
    shown = ""
    try:
        while raw := await reader.readline():
            message = json.loads(raw)
            kind, text = message.get("type"), str(message.get("text", ""))
            if screen:  # on a person's terminal: see for_terminal
                text = for_terminal(text)
            if kind == "done":
                waiting.answered()
            elif kind == "draft" and interactive and text.startswith(shown):
                out(text[len(shown):])
                shown = text
            elif kind == "reply":
                out((text[len(shown):] if shown and text.startswith(shown) else text) + "\n")
                shown = ""
                waiting.shown()  # a reply that came on its own (a reminder): the prompt again
            elif kind == "error":
                out(f"[daemon] {text}\n")
        out("[daemon] disconnected: the daemon stopped, or dropped this console\n")
    finally:
        waiting.gone()
