"""`openclaw pairing ...` and `openclaw users ...`: who may talk to the agent, decided by the admin.

The store holds each user's status (allowed, pending, blocked); `[access]` in the config wins over
it (admins and `allow` always pass, `blocked` never does). These commands change the store, so
they work while the daemon runs: it reads a user's status at each message, and a reminder's
user's at each delivery."""

from __future__ import annotations

import argparse
import asyncio
import sys

from openclaw import access
from openclaw.config import LOCAL_USER, _check_user, load_config
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


def with_store(args: argparse.Namespace, work):
    """Run `work(store)` against the config's database, from a command-line command."""
    from openclaw.store import Store

    config = load_config(args.config)

    async def run():
        store = await Store.open(config.store.url)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def cmd_pairing_list(args: argparse.Namespace) -> int:
    codes = with_store(args, lambda store: store.list_pairing_codes())
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
                                            store.deny_pairing)(code))
    if user is None:
        print(f"no pending pairing code {args.code!r} (expired, used, or mistyped)", file=sys.stderr)
        return 1
    name = f"{user.key} ({user.display_name or 'no name'})"
    print(f"approved {name}" if approve else
          f"denied {name}: blocked; `openclaw users allow {user.key}` admits them after all")
    return 0


def cmd_users_list(args: argparse.Namespace) -> int:
    """The store's users and those only the config names (the console too), one line each."""
    config = load_config(args.config)
    stored = {u.key: u for u in with_store(args, lambda store: store.list_users())}
    for key in sorted(stored.keys() | access.named_users(config)):
        u = stored.get(key)
        # The console's name in the store is "console", which its status already says.
        name = "" if u is None or key == LOCAL_USER else visible(u.display_name or "")
        print(f"{key:<24} {_effective_status(config, key, u and u.status):<18} "
              f"role={(u and u.role) or config.user_role(key):<8} uid={sandbox_uid(key)}  {name}"
              .rstrip())
    return 0


def cmd_users_set(args: argparse.Namespace) -> int:
    try:
        user = _check_user(args.user.strip())
    except ValueError as exc:
        print(f"openclaw users {args.action}: {args.user!r}: {exc}", file=sys.stderr)
        return 2
    config = load_config(args.config)
    status, effect = _ACTIONS[args.action]
    decided = access.config_status(config, user)
    if decided is not None and decided is not status:
        # The store cannot override the config: say where the admin must change it instead.
        where = access.listed_in(config, user)
        print(f"openclaw users {args.action}: {user} is "
              + ("this machine's own console, always allowed" if where == "console" else
                 f"in access.{where} of the config, which decides for them; change it there "
                 "and restart the daemon"), file=sys.stderr)
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
