"""`openclaw reload`: SIGHUP to the daemon serving the config's data_dir, then what it says it did
(the outcome openclaw/reload.py has it leave in data_dir)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from openclaw.config import ConfigError, data_dir_of
from openclaw.datadir import lock_holder
from openclaw.reload import read_outcome

ANSWER_WAIT_S = 15.0  # a reload takes milliseconds; a daemon busy loading skills may take longer


def add_commands(sub, common_sub) -> None:
    p = sub.add_parser("reload", help="have the running daemon re-read its config, and say what "
                                      "took effect (as SIGHUP, `systemctl reload openclaw`)")
    p.set_defaults(func=cmd_reload)


def cmd_reload(args: argparse.Namespace) -> int:
    """`openclaw reload`: SIGHUP to the daemon serving the config's data_dir, then its outcome.
    Only the data_dir is read here: the daemon checks the file, with the secrets it can read."""
    try:
        data_dir = data_dir_of(args.config)
    except ConfigError as exc:  # not even its data_dir: no daemon to ask, none told
        print(f"openclaw reload: nothing reloaded, no daemon was asked: {exc.path} cannot be read"
              + "".join(f"\n  {p}" for p in exc.problems), file=sys.stderr)
        return 1
    try:
        holder = lock_holder(data_dir)
    except PermissionError:
        print(f"openclaw reload: {data_dir} is not yours to read (the daemon runs as another "
              "user?): run this as that user, or `sudo systemctl reload openclaw`", file=sys.stderr)
        return 1
    if holder is None:
        print(f"openclaw reload: no daemon is running with data_dir {data_dir}, which "
              f"{args.config or 'the default config'} names (start one: openclaw run, or the "
              "service; a daemon started from another file, or before data_dir was changed, "
              "uses its own: `kill -HUP PID` reloads it)", file=sys.stderr)
        return 1
    if not holder.reloads:  # SIGHUP would stop it, or kill it
        print(f"openclaw reload: pid {holder.pid} holds data_dir {data_dir} but does not reload "
              "its config: an `openclaw chat` (restart it to read the file), a command at work "
              "(`users forget`, `db restore`; try again when it is done), or a daemon of an older "
              "version (restart it)", file=sys.stderr)
        return 1
    before = read_outcome(data_dir)
    try:
        os.kill(holder.pid, signal.SIGHUP)
    except PermissionError:
        print(f"openclaw reload: the daemon (pid {holder.pid}) runs as another user: run this as "
              "that user, or `sudo systemctl reload openclaw`", file=sys.stderr)
        return 1
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        outcome = read_outcome(data_dir)
        if outcome is not None and outcome.pid == holder.pid and (before is None or
                                                                  outcome.at > before.at):
            given = Path(args.config).expanduser().absolute() if args.config else None
            if given is not None and outcome.source and not _same_file(given, outcome.source):
                print(f"note: the daemon re-read the file it started from, {outcome.source}, "
                      f"not {given}", file=sys.stderr)
            print(outcome.summary(), file=sys.stdout if outcome.ok else sys.stderr)
            return 0 if outcome.ok else 1
        time.sleep(0.05)
    print(f"openclaw reload: the daemon (pid {holder.pid}) was asked to reload but said nothing "
          f"within {ANSWER_WAIT_S:.0f} s (still starting? it reloads once started); its log says "
          "what happened", file=sys.stderr)
    return 1


def _same_file(a: Path, b: str) -> bool:
    try:
        return os.path.samefile(a, b)  # through symlinks and ".." alike
    except OSError:
        return a == Path(b)
