"""`openclaw pairing ...`: the admin admits or refuses the strangers who asked for a pairing code.
Like the users commands they change the store, so they work while the daemon runs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from openclaw.cli.common import with_store
from openclaw.gateway.access import REFUSED_HEADING, refusal_line
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
    p.set_defaults(func=cmd_pairing_answer, status=UserStatus.ALLOWED)
    p = pairing.add_parser("deny", help="refuse the user who holds CODE (blocked: no more codes)")
    p.add_argument("code")
    p.set_defaults(func=cmd_pairing_answer, status=UserStatus.BLOCKED)


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
        print("\n" + REFUSED_HEADING)
    for r in refused:
        print(refusal_line(r))
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
