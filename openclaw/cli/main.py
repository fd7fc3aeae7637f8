"""The `openclaw` command: its parser, init and run (the service); every other command is a
group of its own in this package (reload, chat, serve, doctor, db, pairing, users, skills,
reminders, jobs, service, mcp, prompts)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pwd
import shlex
import sys
from pathlib import Path

from openclaw import __version__
from openclaw.cli import (
    audit,
    chat,
    db,
    doctor,
    jobs,
    pairing,
    reload,
    reminders,
    serve,
    service,
    skills,
    traces,
    users,
)
from openclaw.cli import mcp as mcp_commands
from openclaw.cli import prompts as prompt_commands
from openclaw.cli.chat import run_daemon
from openclaw.cli.common import with_later_problems
from openclaw.config import (
    ConfigError,
    backup_path,
    data_dir_of,
    default_config_path,
    load_config,
    write_starter_config,
)
from openclaw.datadir import DaemonRunning
from openclaw.gateway.contract import ConnectorStartError
from openclaw.reload import keep_early_reloads

# The command groups, in the order `openclaw --help` lists them (after init and run).
COMMAND_GROUPS = (reload, chat, serve, doctor, db, pairing, users, skills, reminders, jobs,
                  audit, service, mcp_commands, traces, prompt_commands)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else (
        logging.INFO if args.command in ("run", "serve") else logging.WARNING)
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
        if exc.partial is not None and args.command in ("run", "chat"):
            exc = with_later_problems(exc)
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
WRITES_DATA_DIR = frozenset({"run", "chat", "db", "pairing", "users", "skills", "reminders",
                             "jobs", "mcp", "prompts"})


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
    for group in COMMAND_GROUPS:
        group.add_commands(sub, lambda action: _Subparsers(action, common))
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
    keep_early_reloads()
    config = load_config(args.config)
    return asyncio.run(run_daemon(config, terminal=None))
