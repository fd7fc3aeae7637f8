"""`openclaw users ...`: who may talk to the agent, decided by the admin.

The store holds each user's status (allowed, pending, blocked); `[access]` in the config wins over
it (admins and `allow` always pass, `blocked` never does). These commands change the store, so
they work while the daemon runs: it reads a user's status at each message, and a reminder's
user's at each delivery. `forget` is the exception: it refuses while a daemon uses the data_dir
(see cmd_users_forget)."""

from __future__ import annotations

import argparse
import shutil
import sys

from openclaw.cli.common import confirmed, data_dir_held, with_store
from openclaw.config import LOCAL_USER, Config, load_config
from openclaw.gateway import access
from openclaw.store.records import UserStatus, parse_user_key
from sandbox.policy import sandbox_uid
from skills.base import visible

# What each `users` action sets, and what it says it did.
_ACTIONS = {
    "allow": (UserStatus.ALLOWED, "may talk to the agent now"),
    "block": (UserStatus.BLOCKED, "gets no answer from now on; their reminders are cancelled when due"),
    "revoke": (UserStatus.PENDING, "must pair again to talk to the agent"),
}


def add_commands(sub, common_sub) -> None:
    users = sub.add_parser("users", help="known users and their status; allow, block, revoke")
    users.set_defaults(func=cmd_users_list)
    actions = common_sub(users.add_subparsers(dest="users_cmd"))
    actions.add_parser("list", help="known users, their status and role").set_defaults(
        func=cmd_users_list)
    for action, (_, effect) in _ACTIONS.items():
        p = actions.add_parser(action, help=f"USER {effect}")
        p.add_argument("user", help='"channel:id", e.g. "telegram:1001"')
        p.set_defaults(func=cmd_users_set, action=action)
    p = actions.add_parser("forget", help="USER: delete everything the store holds about them; "
                                          "the daemon must be stopped")
    p.add_argument("user", help='"channel:id", e.g. "telegram:1001"')
    p.add_argument("--workspace", action="store_true", help="delete their workspace folder too")
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.set_defaults(func=cmd_users_forget)


def cmd_users_list(args: argparse.Namespace) -> int:
    """The store's users and those only the config names (the console too), one line each."""
    config = load_config(args.config, tokens=False)
    stored = {u.key: u for u in with_store(args, lambda store: store.list_users(), none_yet=[])}
    for key in sorted(stored.keys() | access.named_users(config)):
        u = stored.get(key)
        # The console's name in the store is "console", which its status already says.
        name = "" if u is None or key == LOCAL_USER else visible(u.display_name or "")
        print(f"{key:<24} {_effective_status(config, key, u and u.status):<18} "
              f"role={access.role_of(config, key, u):<8} uid={sandbox_uid(key)}  {name}"
              .rstrip())
    return 0


def _named_user(args: argparse.Namespace, command: str) -> str | None:
    """The USER argument checked (None, once the reason is printed, when it names nobody)."""
    try:
        return access.check_user(args.user)
    except ValueError as exc:
        print(f"{command}: {args.user!r}: {exc}", file=sys.stderr)
        return None


def cmd_users_set(args: argparse.Namespace) -> int:
    user = _named_user(args, f"openclaw users {args.action}")
    if user is None:
        return 2
    config = load_config(args.config, tokens=False)
    status, effect = _ACTIONS[args.action]
    decided = access.config_status(config, user)
    if decided is not None and decided is not status:
        # The store cannot override the config: say where the admin must change it instead.
        where = access.listed_in(config, user)
        print(f"openclaw users {args.action}: {user} is "
              + ("this machine's own console, always allowed: whoever holds it owns the daemon, "
                 "and is not shut out of their own terminal" if where == "console" else
                 f"in access.{where} of the config, which decides for them; change it there "
                 "and run `openclaw reload`"), file=sys.stderr)
        return 1
    with_store(args, lambda store: store.set_user_status(*parse_user_key(user), status))
    print(f"{user} {effect}")
    return 0


def _effective_status(config, user: str, stored: UserStatus | None) -> str:
    """The status that holds, and what decides it when the config does (always, for a user the
    store does not know: only the config's users are listed without one)."""
    where = access.listed_in(config, user)
    if not where:
        return str(stored)
    return f"{access.config_status(config, user)} ({'console' if where == 'console' else 'config'})"


def cmd_users_forget(args: argparse.Namespace) -> int:
    """Delete a user's conversations, messages, reminders... and their users row: they are unknown
    again. Only with the daemon stopped: a running daemon keeps each chat's conversation id and
    history in memory, and SQLite gives a deleted id to the next new conversation, which would
    then be another user's with this one's history (blocking the user first does not help)."""
    user = _named_user(args, "openclaw users forget")
    if user is None:
        return 2
    config = load_config(args.config, tokens=False)
    where = access.listed_in(config, user)
    if where in ("console", "admins", "allow"):  # they would be let straight back in
        print(f"openclaw users forget: {user} is "
              + ("this machine's own console, always allowed" if where == "console" else
                 f"in access.{where} of the config, which lets them in without pairing; remove "
                 "them there first"), file=sys.stderr)
        return 1
    if _no_database_yet(config):  # a fresh install: nothing to forget, and nothing to create
        workspace = config.policy().workspace_path(user)
        print(f"openclaw users forget: the store holds nothing about {user} (no database yet)"
              + (f"; their workspace {workspace} is left as it is: delete it by hand"
                 if workspace.is_dir() else ""), file=sys.stderr)
        return 1
    # Always the user's own folder: a role's `workspace` must contain "{user}" (config.py).
    workspace = config.policy().workspace_path(user)
    if not workspace.is_dir():
        workspace_fate = ""
    elif args.workspace:
        workspace_fate = f"workspace {workspace}: deleted"
    else:
        workspace_fate = f"workspace {workspace}: kept (add --workspace to delete it)"
    with data_dir_held(config) as running:
        if running:
            print(f"openclaw users forget: {running}; stop it, forget, then start it again (a "
                  "running daemon keeps the user's conversations in memory)", file=sys.stderr)
            return 1
        counts = with_store(args, lambda store: store.forget_user(user, dry_run=True))
        if not any(counts.values()) and not workspace_fate:
            print(f"openclaw users forget: the store holds nothing about {user} (see `openclaw "
                  "users list`)", file=sys.stderr)
            return 1
        print(f"forget {user}:")
        for kind, n in counts.items():
            print(f"  {kind:<19} {n:>6}" + ("  (the rows stay: who ran which skill, when, how it "
                                             "ended)" if kind.startswith("audit") else ""))
        if workspace_fate:
            print(f"  {workspace_fate}")
        if not confirmed("openclaw users forget", f"Forget {user}? This cannot be undone.", args.yes):
            return 1
        counts = with_store(args, lambda store: store.forget_user(user))
        print(f"forgot {user}: " + (", ".join(f"{kind} {n}" for kind, n in counts.items() if n)
                                    or "no rows"))
        if args.workspace and workspace.is_dir():
            try:
                shutil.rmtree(workspace)
            except OSError as exc:
                print(f"openclaw users forget: could not delete the workspace {workspace}: {exc}; "
                      "delete it by hand", file=sys.stderr)
                return 1
            print(f"deleted the workspace {workspace}")
    return 0


def _no_database_yet(config: Config) -> bool:
    from openclaw.store.backup import sqlite_path

    try:
        return not sqlite_path(config.store.url).exists()
    except ValueError:  # PostgreSQL (or in memory): it is there to ask
        return False
