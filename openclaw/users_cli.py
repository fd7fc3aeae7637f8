"""`openclaw pairing ...` and `openclaw users ...`: who may talk to the agent, decided by the admin.

The store holds each user's status (allowed, pending, blocked); `[access]` in the config wins over
it (admins and `allow` always pass, `blocked` never does). These commands change the store, so
they work while the daemon runs: it reads a user's status at each message, and a reminder's
user's at each delivery. `forget` is the exception: it refuses while a daemon uses the data_dir
(see cmd_users_forget)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

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
    pairing = common_sub(sub.add_parser("pairing", help="admit or refuse new users")
                         .add_subparsers(dest="pair_cmd", required=True))
    pairing.add_parser("list", help="pending pairing codes").set_defaults(func=cmd_pairing_list)
    p = pairing.add_parser("approve", help="admit the user who holds CODE")
    p.add_argument("code")
    p.set_defaults(func=cmd_pairing_answer, status=UserStatus.ALLOWED)
    p = pairing.add_parser("deny", help="refuse the user who holds CODE (blocked: no more codes)")
    p.add_argument("code")
    p.set_defaults(func=cmd_pairing_answer, status=UserStatus.BLOCKED)

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


_OPEN = object()  # with_store's default: open (and create) the database whatever


def with_store(args: argparse.Namespace, work, *, none_yet=_OPEN):
    """Run `work(store)` against the config's database, from a command-line command. `none_yet`:
    the answer, when the database is a file not made yet, of a command that only looks (or finds
    nothing to change): a look at a fresh install creates no data folder and no database, which
    would be the command's user's, not the service's."""
    from openclaw.store import Store

    config = load_config(args.config, tokens=False)
    if none_yet is not _OPEN and _not_made_yet(config.store.url):
        return none_yet

    async def run():
        store = await Store.open(config.store.url)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _not_made_yet(url: str) -> bool:
    from openclaw.store.engine import _sqlite_file, normalize_url

    path = _sqlite_file(normalize_url(url))
    return path is not None and not path.exists()


def cmd_pairing_list(args: argparse.Namespace) -> int:
    codes = with_store(args, lambda store: store.list_pairing_codes(), none_yet=[])
    if not codes:
        print("no pending pairing codes")
    for c in codes:
        print(f"{c.code}  {c.user}  {visible(c.display_name or '')}  "
              f"expires {c.expires_at:%Y-%m-%d %H:%M} UTC")
    return 0


def cmd_pairing_answer(args: argparse.Namespace) -> int:
    code = args.code.strip().upper()
    approve = args.status is UserStatus.ALLOWED
    user = with_store(args, lambda store: (store.approve_pairing if approve else
                                            store.deny_pairing)(code), none_yet=None)
    if user is None:
        print(f"no pending pairing code {args.code!r} (expired, used, or mistyped)", file=sys.stderr)
        return 1
    name = f"{user.key} ({visible(user.display_name or '') or 'no name'})"  # a stranger's to choose
    print(f"approved {name}" if approve else
          f"denied {name}: blocked; `openclaw users allow {user.key}` admits them after all")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    """The store's users and those only the config names (the console too), one line each."""
    config = load_config(args.config, tokens=False)
    stored = {u.key: u for u in with_store(args, lambda store: store.list_users(), none_yet=[])}
    for key in sorted(stored.keys() | access.named_users(config)):
        u = stored.get(key)
        # The console's name in the store is "console", which its status already says.
        name = "" if u is None or key == LOCAL_USER else visible(u.display_name or "")
        print(f"{key:<24} {_effective_status(config, key, u and u.status):<18} "
              f"role={(u and u.role) or config.user_role(key):<8} uid={sandbox_uid(key)}  {name}"
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


def confirmed(command: str, question: str, yes: bool) -> bool:
    """--yes, or "y" typed at a terminal. Without a terminal to ask, says how to go on."""
    if yes:
        return True
    if not sys.stdin.isatty():
        print(f"{command}: nothing done: stdin is not a terminal to ask at; add --yes to go ahead",
              file=sys.stderr)
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("nothing done", file=sys.stderr)
    return False


@contextmanager
def data_dir_held(config: Config) -> Iterator[str | None]:
    """Hold the data_dir as a daemon does, so that none runs or starts while a command changes the
    store under it. Yields None, or what holds it (then nothing is held). With a PostgreSQL store,
    a daemon on another machine (another data_dir) is not seen: stop it first."""
    from openclaw.daemon import DaemonRunning, claim_data_dir  # here: it loads the engine (2 s)

    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        lock = claim_data_dir(config.data_dir)
    except DaemonRunning as running:
        yield running.holder
        return
    try:
        yield None
    finally:
        lock.truncate(0)  # as Daemon.stop: no pid in the file, nobody holds it (data_dir_claimed)
        lock.close()
