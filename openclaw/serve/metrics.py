"""GET /metrics: the engine's counters as Prometheus text, read at each scrape, in a registry of
the server's own (never prometheus_client's global one, which a daemon's other parts share)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from openclaw.serve.state import ServeState


class EngineStats(Collector):
    """Each number of the engine's stats() as a gauge `openclaw_engine_<key>`, and the API's own
    sequences in flight."""

    def __init__(self, stats: Callable[[], dict[str, Any]], state: ServeState) -> None:
        self.stats, self.state = stats, state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for key, value in self.stats().items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                yield GaugeMetricFamily(f"openclaw_engine_{key}", f"the engine's {key}",
                                        value=value)
        yield GaugeMetricFamily("openclaw_serve_sequences_in_flight",
                                "engine sequences the API has running or waiting",
                                value=self.state.in_flight)
        yield GaugeMetricFamily("openclaw_serve_sequences_max",
                                "sequences in flight past which the API answers 503",
                                value=self.state.capacity)


def registry_for(state: ServeState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineStats(state.llm.stats, state))
    return registry


METRICS = web.AppKey("openclaw_serve_metrics", CollectorRegistry)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
