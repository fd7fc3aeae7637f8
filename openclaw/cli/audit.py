"""`openclaw audit`: the audit log (a row per skill call) as a table or JSON, for the admin.

It only looks, so it works while the daemon runs, and on a fresh install it creates nothing."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from openclaw.cli.common import with_store
from openclaw.gateway import access
from openclaw.gateway.audit import TABLE_HEAD, as_json, parse_since, table_row
from skills.executor import AUDIT_DECISIONS


def add_commands(sub, common_sub) -> None:
    p = sub.add_parser("audit", help="the skill calls on record: who ran what, and how it ended")
    p.add_argument("--user", help='only this user\'s calls, e.g. "telegram:1001"')
    p.add_argument("--skill", help="only calls of this skill")
    p.add_argument("--since", help="only calls since: a span (30m, 12h, 7d) or a date (2026-12-01)")
    p.add_argument("--decision", choices=AUDIT_DECISIONS, help="only calls decided so")
    p.add_argument("--limit", type=int, default=50, help="at most this many rows (default 50)")
    p.add_argument("--json", action="store_true", help="the rows whole, as a JSON array")
    p.set_defaults(func=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    try:
        user = access.check_user(args.user) if args.user else None
        since = parse_since(args.since, datetime.now(UTC)) if args.since else None
        if args.limit < 1:
            raise ValueError(f"--limit {args.limit}: must be at least 1")
    except ValueError as exc:
        print(f"openclaw audit: {exc}", file=sys.stderr)
        return 2
    entries = with_store(args, lambda store: store.list_audit(
        args.limit, user, skill=args.skill, since=since, decision=args.decision), none_yet=[])
    if args.json:
        print(json.dumps([as_json(e) for e in entries], ensure_ascii=False, indent=1))
        return 0
    if not entries:
        filtered = user or args.skill or since or args.decision
        print("no skill call on record matches" if filtered else "no skill calls on record")
        return 0
    print(TABLE_HEAD)
    for entry in entries:
        print(table_row(entry))
    return 0
