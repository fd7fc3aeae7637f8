"""`openclaw chat`, and the daemon run in this process with its console: a socket that `openclaw
chat` attaches to (`openclaw run`), or this terminal (a chat with no daemon running)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from openclaw.channels import configured_connectors, disabled_with_token
from openclaw.config import Config, data_dir_of, load_config
from openclaw.datadir import DaemonRunning, data_dir_claimed, lock_holder

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from connectors.console_socket import ConsoleSocketConnector
    from connectors.terminal import TerminalConnector
    from openclaw.daemon import Daemon


def add_commands(sub, common_sub) -> None:
    p = sub.add_parser("chat", help="chat from this terminal: with the running daemon (its console "
                                    "socket), else with one started here")
    p.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    """Attach to the running daemon's console if there is one; otherwise run one in-process."""
    # Attaching needs only where the socket is: the daemon checked its file when it (re)read it,
    # and an admin fixing a mistake in it keeps the console meanwhile.
    data_dir = data_dir_of(args.config)
    from connectors.console_socket import attach
    from connectors.terminal import TerminalConnector, line_reader

    interactive = sys.stdin.isatty()

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    async def attached() -> bool:
        reader = []  # made on first use: only once attached may a thread start consuming stdin

        async def read_line() -> str:
            if not reader:
                reader.append(line_reader(sys.stdin))
            return await reader[0]()

        def prompt() -> None:
            print("> ", end="", file=sys.stderr, flush=True)

        # Also when the lines are piped in: replies shown on a terminal must not drive it.
        screen = interactive or sys.stdout.isatty()
        return await attach(console_socket(data_dir), read_line, write, interactive, prompt,
                            screen=screen)

    try:
        if asyncio.run(attached()):
            return 0
    except PermissionError as exc:
        print(f"openclaw chat: {exc}", file=sys.stderr)
        return 1
    config = load_config(args.config)  # a daemon runs here: all of the file
    while True:
        try:
            return asyncio.run(run_daemon(config, terminal=TerminalConnector))
        except DaemonRunning:
            try:
                holder = lock_holder(config.data_dir)
            except PermissionError:  # another user's daemon: the wait below says what it can
                holder = None
            if holder is not None and not holder.reloads:  # its console is its own terminal
                print(f"openclaw chat: pid {holder.pid} holds {config.data_dir} with no console to "
                      "attach to: another `openclaw chat` (only one runs without a daemon; start "
                      "`openclaw run` or the service to chat from several terminals), or a command "
                      "at work (`users forget`, `db restore`)", file=sys.stderr)
                return 1
            # Its console opens last, after the model loads: a daemon still starting has none yet.
            print("openclaw chat: a daemon is running here; waiting for its console...",
                  file=sys.stderr)
            deadline = time.monotonic() + CONSOLE_WAIT_S
            while time.monotonic() < deadline and data_dir_claimed(config.data_dir):
                if asyncio.run(attached()):
                    return 0
                time.sleep(0.5)
            if data_dir_claimed(config.data_dir):
                print(f"openclaw chat: the daemon holding {config.data_dir} opened no console "
                      f"within {CONSOLE_WAIT_S:.0f} s; its log says why", file=sys.stderr)
                return 1
            # It stopped (or failed to start) meanwhile: this chat runs the daemon itself.


CONSOLE_WAIT_S = 120.0  # for a daemon that is loading its model when `openclaw chat` starts


def console_socket(data_dir: Path) -> Path:
    return data_dir / "openclaw.sock"


def console_connector(path: Path, daemon: Daemon) -> ConsoleSocketConnector:
    """The socket `openclaw chat` attaches to: "done" once a line's replies are delivered, and
    replies that waited for a console sent as soon as one attaches."""
    from connectors.console_socket import ConsoleSocketConnector

    return ConsoleSocketConnector(path, lambda: daemon.gateway.wait_answered("terminal", "local"),
                                  attached=lambda: daemon.gateway.outbox.retry_now("terminal", "local"))


EMBEDDED_NOTE = ("model: the embedded SmolLM2-135M-Instruct, a 135M demo, weak at tools and facts; "
                 "for real use set [engine] model (see docs/models.md)")


def embedded_model(config: Config) -> bool:
    return isinstance(config.engine, EngineConfig) and config.engine.model is None


async def run_daemon(config: Config, terminal: type[TerminalConnector] | None) -> int:
    """The daemon in this process until it stops: headless with its console socket (`openclaw
    run`), or with `terminal` on this terminal (`openclaw chat` with no daemon to attach to)."""
    from openclaw.daemon import Daemon  # here: heavy, and only run and chat start one

    connectors = configured_connectors(config)
    for what, fix in disabled_with_token(config):
        log.warning("%s: %s", what, fix)
    # A chat goes on with its admin port taken (one warning); the service, which is scraped, does
    # not start without it.
    # A chat's SIGHUP is its terminal closing: it stops. The service's re-reads the config.
    daemon = Daemon(config, connectors=connectors, admin_optional=terminal is not None,
                    hangup_reloads=terminal is None, freeze_heap=True)
    idle = lambda: daemon.gateway.wait_idle("terminal")  # noqa: E731
    term = None
    if terminal is None:  # headless: the console is a socket `openclaw chat` attaches to
        daemon.connectors.append(console_connector(console_socket(config.data_dir), daemon))
    else:
        term = terminal(idle=idle)
        daemon.connectors.append(term)
        if term.interactive:
            print("loading the model...", file=sys.stderr, flush=True)
    try:
        await daemon.start()
    except BaseException:
        await daemon.stop(drain_timeout=0)  # close what did start (store, admin port, handlers)
        raise
    if term is None:
        await daemon.run_until_stopped()
        return 0
    if embedded_model(config):  # what a first `make run` answers with, and what it is for
        print(EMBEDDED_NOTE, file=sys.stderr, flush=True)
    if term.interactive:
        print("ready: type a message (/help for commands), Ctrl-D to quit", file=sys.stderr)
    ended = asyncio.create_task(term.done.wait())
    interrupted = asyncio.create_task(daemon.wait_stop_requested())
    await asyncio.wait([ended, interrupted], return_when=asyncio.FIRST_COMPLETED)
    by_signal = not ended.done()
    if not by_signal:  # end of input: answer what was asked, then stop
        await daemon.gateway.wait_idle()
    await daemon.stop(drain_timeout=5)
    return 130 if by_signal else 0
