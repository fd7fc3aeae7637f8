"""`openclaw prompts report`: per variant of a prompt, the counts, the success rate with its
Wilson interval, tool-call success, steps, retries, reply length and latency of known traces;
and --plot's PNG."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from openclaw.cli.prompts_report import add_parser, cmd_report
from openclaw.config import load_config
from openclaw.store import Store, UserStatus
from openclaw.traces.report import UNLABELLED, report

T0 = datetime(2026, 12, 1, tzinfo=UTC)
V3, V4 = "system=v3;tools=builtin", "system=v4;tools=v1"
# label, status, duration ms, tool calls, tool errors, steps, reply chars, feedback (kind, source)
TURNS = [
    (V3, "answered", 100, 2, 0, 3, 10, ("good", "command")),
    (V3, "answered", 200, 1, 1, 2, 20, ("good", "reaction")),
    (V3, "answered", 300, 0, 0, 1, 30, ("good", "command")),
    (V3, "answered", 400, 1, 0, 2, 40, ("retry", "text")),
    (V3, "answered", 500, 0, 0, 1, 50, None),
    (V4, "failed", 1000, 0, 0, 1, 5, ("good", "command")),
    (V4, "answered", 2000, 1, 0, 2, 15, ("bad", "text")),  # "that's wrong"
    ("", "answered", 50, 0, 0, 1, 7, None),  # from before the prompt library
]


async def fill(store: Store) -> None:
    await store.ensure_user("telegram", "1", status=UserStatus.ALLOWED)
    conv = await store.active_conversation("telegram:1", "1", "telegram")
    for n, (label, status, ms, calls, errors, steps, chars, feedback) in enumerate(TURNS):
        event, _ = await store.record_inbound("telegram", n, "telegram:1", "1", f"m{n}")
        if feedback is not None:
            await store.grade("telegram:1", event.id, *feedback)
        await store.add_trace(user="telegram:1", conversation_id=conv.id, status=status,
                              started_at=T0 + timedelta(hours=n), inbound_event_id=event.id,
                              prompt_version=label, duration_ms=ms, tool_calls=calls,
                              tool_errors=errors, steps=steps, reply_chars=chars)


async def test_the_numbers_of_each_variant(tmp_path: Path):
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'db'}") as store:
        await fill(store)
        none, v3, v4 = await report(store, "system")
        by_tools = await report(store, "tools")
        later = await report(store, "system", since=T0 + timedelta(hours=5))
    assert (none.variant, none.turns, none.success) == (UNLABELLED, 1, None)
    assert (v3.variant, v3.turns, v3.good, v3.bad) == ("v3", 5, 3, 1)  # a retry is bad
    assert v3.success == pytest.approx(0.75)
    # Wilson 95% of 3 in 4: 0.3006 to 0.9544 (the textbook's table).
    assert v3.interval == pytest.approx((0.3006, 0.9544), abs=1e-4)
    assert v3.tool_success == pytest.approx(1 - 1 / 4)
    assert (v3.mean_steps, v3.retried_share, v3.mean_reply_chars) == (9 / 5, 1 / 5, 30)
    assert (v3.p50_ms, v3.p90_ms) == (300, 500)
    # A failed turn is bad whatever its feedback; "that's wrong" is bad, and counts as retried.
    assert (v4.variant, v4.turns, v4.good, v4.bad, v4.success) == ("v4", 2, 0, 2, 0.0)
    assert v4.interval == pytest.approx((0.0, 3.8415 / 5.8415), abs=1e-4)  # z²/(n+z²) at 0/n
    assert (v4.tool_success, v4.retried_share, v4.p50_ms, v4.p90_ms) == (1.0, 0.5, 1000, 2000)
    assert [(s.variant, s.turns) for s in by_tools] == [(UNLABELLED, 1), ("builtin", 5), ("v1", 2)]
    assert [(s.variant, s.turns) for s in later] == [(UNLABELLED, 1), ("v4", 2)]


def _args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["report", *argv])
    args.config = config
    return args


async def _filled(args: argparse.Namespace) -> None:
    async with await Store.open(load_config(args.config).store.url) as store:
        await fill(store)


def test_the_command_prints_a_row_per_variant_and_writes_a_png(tmp_path: Path, capsys):
    import asyncio

    png = tmp_path / "chart.png"
    args = _args(tmp_path, "system", "--plot", str(png))
    asyncio.run(_filled(args))
    assert cmd_report(args) == 0
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in out[2:]}
    assert rows["v3"][1:6] == ["5", "3", "1", "75.0%", "30-95%"]
    assert rows["v4"][1:6] == ["2", "0", "2", "0.0%", "0-66%"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path: Path, capsys, monkeypatch):
    import asyncio

    args = _args(tmp_path, "--plot", str(tmp_path / "chart.png"))
    asyncio.run(_filled(args))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert cmd_report(args) == 1
    assert "pip install" in capsys.readouterr().err and not (tmp_path / "chart.png").exists()
