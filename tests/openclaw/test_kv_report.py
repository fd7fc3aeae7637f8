"""The KV budget as the daemon says it, on the real engine (a tiny random-weight model): /status's
line, the /metrics gauges, and the warning at start when max_num_seqs conversations of the
configured context overflow the pool (and only then)."""

from __future__ import annotations

import argparse
import logging

import pytest

from engine import LLM, AsyncLLM
from engine.kv_budget import KVBudget
from openclaw.backends.local import LocalBackend
from openclaw.backends.server_stats import parse
from openclaw.cli.doctor import cmd_doctor
from openclaw.config import load_config
from openclaw.kv_report import overcommit
from openclaw.metrics import engine_metrics
from tests.helpers.chat_model import random_chat_model
from tests.helpers.daemon import RecordingConnector, say, started

BLOCK_BYTES = 2 * 2 * 2 * 16 * 4 * 16  # K and V x 2 layers x 2 KV heads x 16 dims x fp32, 16 tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return str(random_chat_model(tmp_path_factory.mktemp("model")))


def engine(folder: str, blocks: int, max_num_seqs: int) -> LocalBackend:
    """An engine whose pool is `blocks` blocks, for conversations of up to 256 tokens."""
    return LocalBackend(AsyncLLM(folder, device="cpu", kv_cache_gib=blocks * BLOCK_BYTES / 2**30,
                                 max_model_len=256, max_num_seqs=max_num_seqs))


def settings(max_num_seqs: int, agent: str = "") -> str:
    """More [agent] keys (the helper's config ends in that table), then [engine]'s."""
    return f"reply_max_tokens = 8\n{agent}\n[engine]\nmax_num_seqs = {max_num_seqs}\n"


async def test_status_and_metrics_show_the_pool_and_the_conversations_that_fit(tmp_path, folder, caplog):
    model = engine(folder, blocks=64, max_num_seqs=4)  # 4 x 256 tokens = 64 blocks of 16: they fit
    caplog.set_level(logging.WARNING, logger="openclaw.kv_report")
    daemon, conn = await started(tmp_path, model, settings(4))
    try:
        assert not [r for r in caplog.records if r.name == "openclaw.kv_report"]
        status = await say(daemon, conn, "/status")
        line = next(x for x in status.splitlines() if x.startswith("KV pool:"))
        assert line == ("KV pool: 512 bytes/token; pool 64 blocks of 16 = 1,024 tokens (0.00 GiB); "
                        "4 conversations of 256 tokens fit at once")
        m = daemon.metrics
        assert m.value("openclaw_kv_bytes_per_token") == 512
        assert m.value("openclaw_kv_pool_tokens") == 1024
        assert m.value("openclaw_engine_kv_blocks") == 64
        assert m.value("openclaw_kv_conversations_fit") == 4
        assert "openclaw_kv_conversations_fit 4.0" in m.render()
    finally:
        await daemon.stop(drain_timeout=0)
        await model.close()


async def test_a_batch_that_overflows_the_pool_is_warned_of_at_start_with_what_to_change(
        tmp_path, folder, caplog):
    model = engine(folder, blocks=63, max_num_seqs=4)  # one block short of 4 x 256 tokens
    caplog.set_level(logging.WARNING, logger="openclaw.kv_report")
    # A messaging app connected: many people may talk at once.
    daemon, conn = await started(tmp_path, model, settings(4), also=(RecordingConnector("telegram"),))
    try:
        [warning] = [r.getMessage() for r in caplog.records if r.name == "openclaw.kv_report"]
        assert "engine.max_num_seqs (4) conversations of 256 tokens need 64 KV blocks, the pool " \
               "holds 63" in warning and "preempts" in warning
        assert "engine.kv_cache_gib = 0.00049 " in warning  # 64 blocks, 0.000488 GiB, rounded up
        assert "lower engine.max_num_seqs to 3" in warning and "agent.context_tokens" in warning
        assert "3 conversations of 256 tokens fit" in await say(daemon, conn, "/status")
    finally:
        await daemon.stop(drain_timeout=0)
        await model.close()


async def test_with_the_console_alone_the_overflow_is_a_note_not_a_warning(tmp_path, folder, caplog):
    """One person at the terminal has one conversation at a time: the defaults' 64 x 8,192 tokens
    in 1 GiB must not greet every `openclaw chat` with a warning."""
    model = engine(folder, blocks=63, max_num_seqs=4)
    caplog.set_level(logging.INFO, logger="openclaw.kv_report")
    daemon, _ = await started(tmp_path, model, settings(4))
    try:
        [note] = [r for r in caplog.records if r.name == "openclaw.kv_report"]
        assert note.levelno == logging.INFO and "the pool holds 63" in note.getMessage()
    finally:
        await daemon.stop(drain_timeout=0)
        await model.close()


async def test_a_shorter_configured_context_fits_where_the_models_would_not(tmp_path, folder, caplog):
    model = engine(folder, blocks=63, max_num_seqs=4)
    caplog.set_level(logging.WARNING, logger="openclaw.kv_report")
    daemon, conn = await started(tmp_path, model, settings(4, "context_tokens = 240"))
    try:
        assert not [r for r in caplog.records if r.name == "openclaw.kv_report"]
        assert "4 conversations of 240 tokens fit" in await say(daemon, conn, "/status")
    finally:
        await daemon.stop(drain_timeout=0)
        await model.close()


def test_a_context_longer_than_the_whole_pool_is_said_as_such_with_the_size_that_holds_it():
    budget = KVBudget(bytes_per_token=46_080, block_size=16, num_blocks=100)  # 1,600 tokens
    what, fix = overcommit(budget, max_num_seqs=4, context=8192)
    assert what == ("one conversation of 8,192 tokens needs 512 KV blocks, the pool holds 100: "
                    "a prompt of 1,600 tokens or more is refused")
    assert fix.startswith("set engine.kv_cache_gib = 0.36 at least (for engine.max_num_seqs "
                          "conversations, 1.5)")  # 0.352 and 1.406 GiB, rounded up
    assert "agent.context_tokens below 1,600" in fix
    assert overcommit(budget, max_num_seqs=4, context=400) is None  # 25 blocks each: 4 fit


def test_a_daemon_over_openclaw_serve_reads_the_pool_from_its_metrics(folder):
    """What `openclaw serve`'s /metrics states, as server_stats parses it for an OpenAI backend."""
    model = engine(folder, blocks=40, max_num_seqs=2)
    try:
        load = parse(engine_metrics(model.stats).render())
        assert {k: load[k] for k in ("kv_bytes_per_token", "kv_pool_tokens", "kv_blocks")} == \
               {"kv_bytes_per_token": 512, "kv_pool_tokens": 640, "kv_blocks": 40}
    finally:
        model.llm.shutdown()


def test_doctor_plans_the_pool_run_would_allocate_and_warns_when_the_batch_overflows_it(
        tmp_path, folder, capsys):
    """doctor loads the model with a small pool of its own (a daemon may hold the memory); the
    pool it states is the one `run` allocates with this config, counted from that engine's tensors."""
    config = tmp_path / "openclaw.toml"
    gib = 63 * BLOCK_BYTES / 2**30
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n[engine]\n'
                      f'model = "{folder}"\ndevice = "cpu"\nkv_cache_gib = {gib!r}\nmax_model_len = 256\n'
                      "max_num_seqs = 4\n")
    code = cmd_doctor(argparse.Namespace(config=config, skip_model=False))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "KV cache:" in x)
    assert line.startswith("⚠ KV cache: 512 bytes/token; pool 63 blocks of 16 = 1,008 tokens"), line
    assert "3 conversations of 256 tokens fit at once" in line and "preempts" in line
    assert "fix: set engine.kv_cache_gib" in out and code in (0, 1)  # other checks may fail here
    caches = LLM(load_config(config).engine).engine.runner.kv_caches  # what `run` allocates
    assert sum(t.numel() * t.element_size() for t in caches) == 63 * BLOCK_BYTES


def test_doctor_shows_no_warning_where_the_batch_fits(tmp_path, folder, capsys):
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n[engine]\n'
                      f'model = "{folder}"\ndevice = "cpu"\nkv_cache_gib = {64 * BLOCK_BYTES / 2**30!r}\n'
                      "max_model_len = 256\nmax_num_seqs = 4\n")
    cmd_doctor(argparse.Namespace(config=config, skip_model=False))
    line = next(x for x in capsys.readouterr().out.splitlines() if "KV cache:" in x)
    assert line.startswith("✓ KV cache: 512 bytes/token; pool 64 blocks") and line.endswith(
        "4 conversations of 256 tokens fit at once"), line
