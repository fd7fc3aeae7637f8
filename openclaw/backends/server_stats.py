"""What a model server says of its own load, for /status and /metrics: requests running and
waiting, and the share of its KV cache in use, read from its Prometheus `/metrics` (vLLM's and
SGLang's names). A server shared with other clients is busier than this daemon's requests show."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from openclaw.agent.model import ModelUnavailable
from openclaw.backends.http import Client, ServerRefused

log = logging.getLogger(__name__)

POLL_S = 15.0
# Our stats key -> the server's metric names (vLLM's, SGLang's, `openclaw serve`'s), first
# found wins.
NAMES = {"num_running": ("vllm:num_requests_running", "sglang:num_running_reqs",
                         "openclaw_engine_running"),
         "num_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs",
                         "openclaw_engine_waiting"),
         "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
                      "sglang:token_usage", "openclaw_kv_cache_usage"),
         # The pool itself, as `openclaw serve` states it (engine/kv_budget.py).
         "kv_bytes_per_token": ("openclaw_kv_bytes_per_token",),
         "kv_pool_tokens": ("openclaw_kv_pool_tokens",),
         "kv_blocks": ("openclaw_engine_kv_blocks",)}
# Per engine, not summed over engines: the fullest share, the widest token.
LARGEST = ("kv_usage", "kv_bytes_per_token")


def parse(text: str) -> dict[str, float]:
    """The load a /metrics text states (summed over its engines; the KV share, the fullest)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample.value)
    load = {}
    for key, names in NAMES.items():
        values = next((found[name] for name in names if name in found), None)
        if values:
            load[key] = max(values) if key in LARGEST else sum(values)
    return load


async def follow(client: Client, load: dict[str, float]) -> None:
    """Keep `load` up to date while the server states it; a server without such metrics (none
    of the names, or no /metrics) is not asked again."""
    while True:
        try:
            answer = await client.request("GET", f"{client.root}/metrics", wait=POLL_S, retries=0)
            try:
                text = await answer.text()
            finally:
                answer.release()
            found = parse(text)
        except (ServerRefused, ValueError) as exc:
            log.debug("%s/metrics states no load (%s): not asked again", client.shown_root, exc)
            return
        except (ModelUnavailable, aiohttp.ClientError, TimeoutError) as exc:  # away for now
            log.debug("%s/metrics: %s", client.shown_root, exc)
            found = None
        if found == {} and not load:
            log.debug("%s/metrics states no load this daemon knows: not asked again", client.shown_root)
            return
        if found is not None:
            load.clear()
            load.update(found)
        await asyncio.sleep(POLL_S)
