"""The in-process terminal (`make run`): in an interactive session the prompt shows when the
terminal waits for the person, never in front of a reply that is still streaming."""

from __future__ import annotations

import asyncio
import io
import os
import sys

from connectors.console_socket import ConsoleSocketConnector, attach
from connectors.terminal import TerminalConnector
from openclaw.gateway.contract import literal_block


async def test_the_prompt_follows_each_reply_and_an_empty_line(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)  # prompts and replies on one screen, in order
    read_end, write_end = os.pipe()
    keyboard = os.fdopen(write_end, "w")
    terminal = TerminalConnector(stdin=os.fdopen(read_end), stdout=screen, interactive=True)
    replies: list[asyncio.Task] = []

    async def answer(text: str) -> None:  # as the gateway does: later, streaming a draft first
        await asyncio.sleep(0.05)
        await terminal.draft("local", "you")
        await terminal.send_text("local", f"you said {text}")

    async def daemon(msg) -> None:
        replies.append(asyncio.create_task(answer(msg.text)))

    async def type_line(line: str) -> None:
        keyboard.write(line)
        keyboard.flush()
        for _ in range(500):  # until the terminal has taken it (and what it caused is done)
            await asyncio.sleep(0.01)
            if line.strip() and replies and replies[-1].done():
                break
            if not line.strip() and screen.getvalue().endswith("> > "):
                break

    await terminal.start(daemon)
    await type_line("hi\n")
    await type_line("\n")
    replies.clear()
    await type_line("bye\n")
    keyboard.close()
    await asyncio.wait_for(terminal.done.wait(), 5)
    assert screen.getvalue() == "> you said hi\n> > you said bye\n> \n"
    # An unrequested message (a reminder) puts the prompt back under it.
    await terminal.send_text("local", "⏰ Reminder: tea")
    assert screen.getvalue().endswith("\n⏰ Reminder: tea\n> ")


# A reply quoting what the model read (a web page, a mail): escape sequences that would retitle
# the window, set the clipboard, erase the screen, move up a line and hide text, and a CR.
HOSTILE = "ok\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x1b[1A\x1b[8mhidden\r\x9b0mend"


def assert_shown_harmlessly(shown: str) -> None:
    assert not any(ch in shown for ch in "\x1b\x07\r\x9b"), repr(shown)
    assert all(part in shown for part in ("ok", "owned", "hidden", "end"))  # nothing lost
    assert "\\x1b]0;owned" in shown  # the sequence is visible as what it is


async def test_escape_sequences_in_a_reply_cannot_drive_the_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    screen = io.StringIO()
    terminal = TerminalConnector(stdin=io.StringIO(""), stdout=screen, interactive=True)
    await terminal.draft("local", HOSTILE[:20])
    await terminal.send_text("local", HOSTILE + "\tand a tab\n")
    shown = screen.getvalue()
    assert_shown_harmlessly(shown)
    assert shown.count("ok") == 1 and shown.endswith("\tand a tab\n\n")  # the draft, continued


async def test_escape_sequences_in_a_reply_cannot_drive_an_attached_console(tmp_path):
    console = ConsoleSocketConnector(tmp_path / "c.sock", idle=lambda: asyncio.sleep(0))

    async def daemon(msg) -> None:
        await console.draft("local", HOSTILE[:20])
        await console.send_text("local", HOSTILE)

    await console.start(daemon)
    sent = iter(["hi\n"])

    async def lines() -> str:
        return next(sent, "")

    shown = io.StringIO()
    try:
        assert await attach(tmp_path / "c.sock", lines, shown.write, interactive=True)
        for _ in range(500):  # until the console's session has seen it go
            if not console.connected:
                break
            await asyncio.sleep(0.01)
    finally:
        await console.stop()
    assert_shown_harmlessly(shown.getvalue())
    assert shown.getvalue().count("ok") == 1


async def test_a_piped_reply_keeps_its_text_as_it_is():
    out = io.StringIO()  # a file or a pipe, not a terminal: the bytes are the script's to keep
    terminal = TerminalConnector(stdin=io.StringIO(""), stdout=out, interactive=False)
    await terminal.send_text("local", HOSTILE)
    assert out.getvalue() == HOSTILE + "\n"


async def test_a_command_to_approve_shows_as_it_is_without_the_blocks_markup():
    screen = io.StringIO()
    terminal = TerminalConnector(stdin=io.StringIO(), stdout=screen, interactive=False)
    command = "echo `id` && ls **safe** ```"
    await terminal.send_text("local", f"Approval needed (shell):\n{literal_block(command)}\nReply.")
    assert screen.getvalue() == f"Approval needed (shell):\n{command}\nReply.\n"
