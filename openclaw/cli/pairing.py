"""`openclaw pairing ...`: the admin admits or refuses the strangers who asked for a pairing code.
Like the users commands they change the store, so they work while the daemon runs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from openclaw.cli.common import with_store
from openclaw.config import load_config
from openclaw.gateway import access
from openclaw.store.records import PairingCode, PairingRefusal, UserStatus
from skills.base import visible

if TYPE_CHECKING:
    from openclaw.store import Store


def add_commands(sub, common_sub) -> None:
    pairing = common_sub(sub.add_parser("pairing", help="admit or refuse new users")
                         .add_subparsers(dest="pair_cmd", required=True))
    pairing.add_parser("list", help="pending pairing codes, and the requests refused lately") \
        .set_defaults(func=cmd_pairing_list)
    p = pairing.add_parser("approve", help="admit the user who holds CODE")
    p.add_argument("code")
    p.add_argument("--role", help="the role they act with (default: user); [access] roles wins")
    p.add_argument("--admin", action="store_true",
                   help="an owner: answers pairing requests (and acts as admin unless --role)")
    p.set_defaults(func=cmd_pairing_answer, status=UserStatus.ALLOWED)
    p = pairing.add_parser("deny", help="refuse the user who holds CODE (blocked: no more codes)")
    p.add_argument("code")
    p.set_defaults(func=cmd_pairing_answer, status=UserStatus.BLOCKED, role=None, admin=False)


def cmd_pairing_list(args: argparse.Namespace) -> int:
    async def both(store: Store) -> tuple[list[PairingCode], list[PairingRefusal]]:
        return await store.list_pairing_codes(), await store.list_pairing_refusals()

    codes, refused = with_store(args, both, none_yet=([], []))
    if not codes:
        print("no pending pairing codes")
    for c in codes:
        print(f"{c.code}  {c.user}  {visible(c.display_name or '')}  "
              f"expires {c.expires_at:%Y-%m-%d %H:%M} UTC")
    if refused:
        print("\n" + access.REFUSED_HEADING)
    for r in refused:
        print(access.refusal_line(r))
    return 0


def cmd_pairing_answer(args: argparse.Namespace) -> int:
    code = args.code.strip().upper()
    approve = args.status is UserStatus.ALLOWED
    config = load_config(args.config, tokens=False)
    if args.role is not None and args.role not in (defined := config.policy().roles):
        # Before the code is used: a typo must not admit them with no role, nor spend the code.
        print(f"openclaw pairing approve: no role {args.role!r} in the config; use one of: "
              f"{', '.join(sorted(defined))} (or define [roles.{args.role}])", file=sys.stderr)
        return 2
    user = with_store(args, lambda store: store.approve_pairing(code, role=args.role, admin=args.admin)
                      if approve else store.deny_pairing(code), none_yet=None)
    if user is None:
        print(f"no pending pairing code {args.code!r} (expired, used, or mistyped)", file=sys.stderr)
        return 1
    name = f"{user.key} ({visible(user.display_name or '') or 'no name'})"  # a stranger's to choose
    if not approve:
        print(f"denied {name}: blocked; `openclaw users allow {user.key}` admits them after all")
        return 0
    role = access.role_of(config, user.key, user)
    print(f"approved {name}: role {role}" + (", an owner" if access.is_owner(config, user.key, user)
                                             else ""))
    if (args.role or args.admin) and user.key in access.config_names(config):
        where = access.listed_in(config, user.key) or "roles"
        print(f"note: access.{where} in the config names {user.key}, so the config decides their "
              f"role ({role}) and whether they are an owner; the --role/--admin stored now apply "
              "only once it no longer names them", file=sys.stderr)
    return 0
