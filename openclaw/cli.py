"""The `openclaw` command: init, run (the service), reload, chat (the daemon with this terminal
attached), doctor, db, pairing, users, skills, reminders, service install."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import shlex
import sys
import time
from pathlib import Path

from openclaw import __version__, doctor, reload
from openclaw.channels import configured_connectors
from openclaw.config import (
    ConfigError,
    backup_path,
    data_dir_of,
    default_config_path,
    load_config,
    write_starter_config,
)
from openclaw.datadir import DaemonRunning, data_dir_claimed, lock_holder
from openclaw.gateway.contract import ConnectorStartError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else (
        logging.INFO if args.command == "run" else logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # its plugin set-up says seven INFO lines at every start
        logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        if args.command in WRITES_DATA_DIR:
            not_as_root = _not_as_root(args, sys.argv[1:] if argv is None else argv)
            if not_as_root:
                print(f"openclaw {args.command}: {not_as_root}", file=sys.stderr)
                return 1
        return args.func(args)
    except ConfigError as exc:
        print(f"config error:\n{exc}", file=sys.stderr)
        return 2
    except ConnectorStartError as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError) as exc:
        # What a user can fix gets one line: a port in use, a file, another daemon, the database.
        from openclaw.store import StoreUnavailableError  # here: heavy for commands without one

        if args.verbose or not isinstance(exc, OSError | DaemonRunning | StoreUnavailableError):
            raise
        print(f"openclaw {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# Commands that may create files in data_dir (the lock, the database, workspaces, the console).
WRITES_DATA_DIR = frozenset({"run", "chat", "db", "pairing", "users", "skills", "reminders"})


def _not_as_root(args: argparse.Namespace, argv: list[str]) -> str | None:
    """Why root must not run this command: data_dir belongs to another user (a system service's
    `User=`). A file root made there (the lock, a new database, a workspace) is one the daemon
    cannot open, and the service would fail at its next start."""
    if os.geteuid() != 0:
        return None
    data_dir = data_dir_of(args.config)
    try:
        owner = data_dir.stat().st_uid
    except FileNotFoundError:
        return None
    if owner == 0:
        return None
    try:
        name = pwd.getpwuid(owner).pw_name
    except KeyError:
        name = f"#{owner}"  # sudo's spelling of a uid without a name
    return (f"{data_dir} belongs to {name}, the daemon's user, and files root made there would be "
            f"ones the daemon cannot open; run this as {name}: "
            f"sudo -u {shlex.quote(name)} {shlex.join([_program(), *argv])}")


def _program() -> str:
    """How this openclaw was started, for a command line to copy: its script's path, which
    another user's PATH (sudo's secure_path) may not find by name."""
    script = Path(sys.argv[0])
    return str(script.absolute()) if script.name == "openclaw" else "openclaw"


def _this_openclaw() -> str:
    """The command line that runs this very openclaw, for the unit: the `openclaw` script that
    was started, else this interpreter with `-m openclaw.cli`. Never the `openclaw` PATH finds
    first, which may be another install; quoted, as a venv's path may hold a space."""
    script = Path(sys.argv[0])
    if script.name == "openclaw" and script.is_file():
        return str(script.absolute())
    return shlex.join([sys.executable, "-m", "openclaw.cli"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="openclaw", description="Your personal agent daemon.")
    parser.add_argument("--version", action="version", version=f"openclaw {__version__}")
    parser.add_argument("--config", type=Path, default=None,
                        help=f"config file (default {default_config_path()})")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # The same options after the subcommand (`openclaw run --config PATH`, as the unit runs it).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="config file")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    sub = _Subparsers(parser.add_subparsers(dest="command", required=True), common)

    p = sub.add_parser("init", help="write a commented starter config")
    p.add_argument("--force", action="store_true", help="replace an existing file")
    p.set_defaults(func=cmd_init)
    p = sub.add_parser("run", help="run the daemon headless (what the service runs)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("reload", help="have the running daemon re-read its config, and say what "
                                      "took effect (as SIGHUP, `systemctl reload openclaw`)")
    p.set_defaults(func=reload.cmd_reload)
    p = sub.add_parser("chat", help="chat from this terminal: with the running daemon (its console "
                                    "socket), else with one started here")
    p.set_defaults(func=cmd_chat)
    p = sub.add_parser("doctor", help="check config, database, model, sandbox, tokens")
    p.add_argument("--skip-model", action="store_true", help="do not load the model")
    p.set_defaults(func=doctor.cmd_doctor)
    from openclaw import db_cli, reminders_cli, skills_cli, users_cli

    db_cli.add_commands(sub, lambda action: _Subparsers(action, common))
    users_cli.add_commands(sub, lambda action: _Subparsers(action, common))
    skills_cli.add_commands(sub, lambda action: _Subparsers(action, common))
    reminders_cli.add_commands(sub, lambda action: _Subparsers(action, common))
    service = _Subparsers(sub.add_parser("service", help="systemd service").add_subparsers(
        dest="svc_cmd", required=True), common)
    p = service.add_parser("install", help="write a systemd unit and say how to enable it")
    p.add_argument("--system", action="store_true", help="a system unit (default: a user unit)")
    p.add_argument("--user", dest="run_as", default=None, help="system unit: the user to run as")
    p.add_argument("--force", action="store_true", help="replace a unit file already there")
    p.set_defaults(func=cmd_service_install)
    return parser


class _Subparsers:
    """add_parser() that gives every subcommand the common options."""

    def __init__(self, action, common: argparse.ArgumentParser) -> None:
        self.action, self.common = action, common

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self.action.add_parser(name, parents=[self.common], **kwargs)


# ---- commands ------------------------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    existed = args.force and Path(args.config or default_config_path()).expanduser().exists()
    path = write_starter_config(args.config, force=args.force)
    if existed:
        print(f"the file it replaced is kept as {backup_path(path)}")
    print(f"wrote {path}\nedit it, then check it with: openclaw --config {path} doctor")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    # Until the daemon's own handler is in (after the start's first steps), a SIGHUP must not end
    # it, as its default action would: it asks for a reload, done once started.
    reload.keep_early_reloads()
    config = load_config(args.config)
    return asyncio.run(_run_daemon(config, terminal=None))


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
            return asyncio.run(_run_daemon(config, terminal=TerminalConnector))
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


def console_connector(path: Path, daemon):
    """The socket `openclaw chat` attaches to: "done" once a line's replies are delivered, and
    replies that waited for a console sent as soon as one attaches."""
    from connectors.console_socket import ConsoleSocketConnector

    return ConsoleSocketConnector(path, lambda: daemon.gateway.wait_answered("terminal", "local"),
                                  attached=lambda: daemon.gateway.outbox.retry_now("terminal", "local"))


async def _run_daemon(config, terminal) -> int:
    from openclaw.daemon import Daemon

    connectors = configured_connectors(config)
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


def cmd_service_install(args: argparse.Namespace) -> int:
    from openclaw.service import install_unit, service_user, unreadable_config

    # No secret: the unit gives the service its own environment, and this opens nothing.
    config = load_config(args.config, tokens=False, store=False)
    exe = _this_openclaw()
    config_path = (args.config or default_config_path()).expanduser().resolve()
    data_dir, run_as = config.data_dir, args.run_as
    if args.system:
        run_as = service_user(args.run_as)
        try:
            home = Path(pwd.getpwnam(run_as).pw_dir)
        except KeyError:
            print(f"service install: there is no user {run_as} on this machine; create it first "
                  f"(e.g. useradd --system --create-home {shlex.quote(run_as)}), then run this "
                  "again", file=sys.stderr)
            return 1
        # systemd gives the service its user's HOME, not this shell's: the default data_dir
        # (and a data_dir written "~/...") is under that home.
        data_dir = data_dir_of(args.config, home=home)
    try:
        path, instructions = install_unit(exe, config_path, run_as, data_dir,
                                          system=args.system, force=args.force)
    except (FileExistsError, ValueError) as exc:
        print(f"service install: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path}\n{instructions}")
    if not config_path.is_file():
        print(f"warning: there is no config file at {config_path}, which the service is told to "
              "read: create it (`openclaw init`) before starting the service", file=sys.stderr)
    elif args.system and (why := unreadable_config(config_path, run_as)):
        print(f"warning: the service runs as {run_as}, who cannot read {config_path}: {why}",
              file=sys.stderr)
    for what, where in (("the config file", config_path), ("data_dir", data_dir)):
        if any(where.absolute().is_relative_to(tmp) for tmp in ("/tmp", "/var/tmp")):
            print(f"warning: {what} {where} is under /tmp, which the service does not see "
                  "(PrivateTmp=yes gives it an empty one): keep it elsewhere before starting it",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
