"""The in-process terminal (`make run`): in an interactive session the prompt shows when the
terminal waits for the person, never in front of a reply that is still streaming."""

from __future__ import annotations

import asyncio
import io
import os
import sys

from connectors.terminal import TerminalConnector


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
