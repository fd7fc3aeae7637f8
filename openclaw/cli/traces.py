"""`openclaw traces export`: the graded traces of agent turns as chat-format JSONL for supervised
fine-tuning (docs/traces.md), with the config's secrets and private paths redacted and the users
who said /private on left out.

    openclaw traces export --since 2026-12-01 --grade good --output good.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, date, datetime, time, timedelta

from openclaw.config import load_config
from openclaw.prompts.choice import SYSTEM
from openclaw.prompts.labels import parse_label

FORMATS = ("jsonl",)


def add_commands(sub, common_sub) -> None:
    from openclaw.traces.export import ANY, GRADE_CHOICES

    traces = sub.add_parser("traces", help="export the traces of agent turns for fine-tuning")
    actions = common_sub(traces.add_subparsers(dest="traces_cmd", required=True))
    p = actions.add_parser("export", help="graded turns as chat-format JSONL, redacted")
    p.add_argument("--since", required=True, type=day_start,
                   help="from this day (YYYY-MM-DD, UTC) or time (ISO 8601)")
    p.add_argument("--until", type=day_end, default=None,
                   help="up to this day, included (YYYY-MM-DD), or before this time (ISO 8601)")
    p.add_argument("--grade", choices=GRADE_CHOICES, default=ANY,
                   help="only turns with this grade (default: any)")
    p.add_argument("--format", choices=FORMATS, default="jsonl")
    p.add_argument("--output", "-o", default=None,
                   help="file to write (made readable by you alone); default: stdout")
    p.set_defaults(func=cmd_export)


def _parsed(value: str) -> tuple[datetime, bool]:
    """(the moment, whether `value` was a bare date)."""
    try:
        return datetime.combine(date.fromisoformat(value), time(), UTC), True
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date (YYYY-MM-DD) or a time (YYYY-MM-DDTHH:MM, ISO 8601)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)), False


def day_start(value: str) -> datetime:
    return _parsed(value)[0]


def day_end(value: str) -> datetime:
    """The end of the period: a bare date includes that day."""
    moment, bare = _parsed(value)
    return moment + timedelta(days=1) if bare else moment


def answered_under(label: str, texts: dict[str, str], configured: str) -> str:
    """The system prompt a turn labelled `label` was answered with: its library version's text,
    else (the config's, or a label from before the library) the configured one."""
    try:
        version = parse_label(label).get(SYSTEM)
    except ValueError:
        version = None
    return texts.get(version or "", configured)


def cmd_export(args: argparse.Namespace) -> int:
    from openclaw.skillset import configured_skills
    from openclaw.store import Store
    from openclaw.traces.export import export_traces
    from openclaw.traces.redact import Redactor, SecretsUnreadable

    config = load_config(args.config)  # with the tokens: the export must know what to redact
    try:
        redactor = Redactor.from_config(config)
    except SecretsUnreadable as exc:
        print(f"openclaw traces export: nothing exported: {exc}; run it where the service's "
              "credentials are readable, so that none can leak into the export", file=sys.stderr)
        return 1
    try:
        tools = configured_skills(config, secrets=False).tool_specs() or None
    except Exception:  # a skill that does not load: the lines go without their tools
        tools = None

    async def run():
        store = await Store.open(config.store.url)
        try:
            texts = {v.version: v.text for v in await store.prompt_versions(SYSTEM)}
            return await export_traces(store, redactor, system=lambda t: answered_under(
                                           t.prompt_version, texts, config.agent.system_prompt),
                                       since=args.since, until=args.until, grade=args.grade,
                                       tools=lambda t: tools)
        finally:
            await store.close()

    exported = asyncio.run(run())
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in exported.lines)
    if args.output is None:
        sys.stdout.write(text)
    else:
        # The lines are the users' conversations: readable by the admin alone, as the store is.
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # also a file that was there
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
    print(f"exported {len(exported.lines)} turns ({exported.other_grade} of another grade and "
          f"{exported.incomplete} without a final reply left out; private users' never listed)",
          file=sys.stderr)
    return 0
