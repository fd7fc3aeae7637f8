"""`openclaw prompts report [NAME] [--since DATE] [--until DATE] [--plot FILE.png]`: how each
variant of a prompt did (openclaw/traces/report.py), as a table, and as a chart with --plot.
`add_parser` adds it to the `openclaw prompts` group's subcommands."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from openclaw.cli.traces import day_end, day_start
from openclaw.config import load_config


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report", help="outcomes per variant of a prompt (--plot: a PNG)")
    p.add_argument("name", nargs="?", default="system",
                   help='the prompt whose variants are compared (default "system"; or "tools")')
    p.add_argument("--since", type=day_start, default=None,
                   help="from this day (YYYY-MM-DD, UTC) or time (ISO 8601); default: all")
    p.add_argument("--until", type=day_end, default=None,
                   help="up to this day, included, or before this time")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                   help="also write a chart of the success rates and their 95%% intervals")
    p.set_defaults(func=cmd_report)
    return p


def cmd_report(args: argparse.Namespace) -> int:
    from openclaw.store import Store
    from openclaw.traces.plot import PlotUnavailable, plot_success
    from openclaw.traces.report import report, table

    config = load_config(args.config, tokens=False)

    async def run():
        store = await Store.open(config.store.url)
        try:
            return await report(store, args.name, args.since, args.until)
        finally:
            await store.close()

    stats = asyncio.run(run())
    print(table(stats, args.name))
    if args.plot is not None:
        try:
            plot_success(stats, args.name, args.plot)
        except PlotUnavailable as exc:
            print(f"openclaw prompts report: no chart written: {exc}", file=sys.stderr)
            return 1
        print(f"chart written to {args.plot}", file=sys.stderr)
    return 0
