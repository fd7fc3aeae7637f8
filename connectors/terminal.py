"""The terminal: the console's owner chatting with the daemon (user `terminal:local`).

Interactive on a TTY: a prompt, replies streamed as they are generated. Piped: one message per
line, each answered before the next is read, so a script sees replies in order; end of input ends
the session.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import TextIO

from openclaw.gateway.contract import Connector, Handler, InboundMessage, without_literal_blocks


class TerminalConnector(Connector):
    name = "terminal"
    max_message_len = 1_000_000
    streams_drafts = True

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 interactive: bool | None = None,
                 idle: Callable[[], Awaitable[None]] | None = None) -> None:
        self._in = stdin or sys.stdin
        self._out = stdout or sys.stdout
        self.interactive = self._in.isatty() if interactive is None else interactive
        self._screen = self.interactive or _isatty(self._out)  # replies shown on a terminal
        self._idle = idle  # awaits until the daemon has answered everything it was given
        self._task: asyncio.Task | None = None
        self._drafted = ""  # what a streamed draft already printed of the current reply
        self.done = asyncio.Event()  # end of input, and every reply delivered

    async def start(self, handler: Handler) -> None:
        self._next_line = line_reader(self._in)
        self._task = asyncio.create_task(self._read(handler), name="terminal input")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    async def _read(self, handler: Handler) -> None:
        # The prompt shows when the terminal waits for the person: at the start, after an empty
        # line, and after each reply (send_text), so it does not sit in front of a streaming one.
        self._prompt()
        try:
            while True:
                line = await self._next_line()
                if not line:
                    break
                text = line.strip()
                if not text:
                    self._prompt()
                    continue
                await handler(InboundMessage("terminal", "local", "local", uuid.uuid4().hex, text,
                                             display_name="console"))
                if self._idle is not None and not self.interactive:  # /stop stays typeable
                    await self._idle()
        finally:
            if self.interactive:
                self._write("\n", err=True)
            self.done.set()

    async def send_text(self, chat_id: str, text: str) -> str | None:
        text = without_literal_blocks(text)  # no markup here: a command to approve shows as it is
        if self._drafted and text.startswith(self._drafted):
            self._write(text[len(self._drafted):] + "\n")
        else:
            self._write(("\n" if self._drafted else "") + text + "\n")
        self._drafted = ""
        self._prompt()
        return None

    async def draft(self, chat_id: str, text: str) -> None:
        if self.interactive and text.startswith(self._drafted):
            self._write(text[len(self._drafted):])
            self._drafted = text

    async def typing(self, chat_id: str) -> None:
        return None

    def _prompt(self) -> None:
        if self.interactive:
            self._write("> ", err=True)

    def _write(self, text: str, err: bool = False) -> None:
        stream = sys.stderr if err else self._out
        stream.write(for_terminal(text) if self._screen and not err else text)
        stream.flush()


# C0 and C1 control characters but tab and newline: ESC, CSI and OSC start the sequences that move
# the cursor, erase or hide lines, retitle the window or set the clipboard; CR overwrites a line.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def for_terminal(text: str) -> str:
    """A reply as a terminal may show it: its control characters made visible ("\\x1b"). A reply
    carries text the model read (a web page, a mail, a file), which must not drive the terminal:
    hide what an approval is about, or rewrite what was shown."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or closed
        return False


def line_reader(stream: TextIO) -> Callable[[], Awaitable[str]]:
    """Lines of `stream` ("" at end of input), read by a daemon thread: a readline blocked on a
    terminal must never keep the process from exiting on Ctrl-C, as a pooled thread would."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def pump() -> None:
        while True:
            line = stream.readline()
            try:
                loop.call_soon_threadsafe(lines.put_nowait, line)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                return
            if not line:
                return

    threading.Thread(target=pump, name="stdin", daemon=True).start()
    return lines.get
