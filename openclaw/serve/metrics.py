"""GET /metrics: the engine's series under the daemon's names (openclaw.metrics.engine_metrics, read
from stats() at each scrape) and the API's own: requests by endpoint and status, requests and
sequences in flight, connections the listener dropped. In a registry of the server's own, never
prometheus_client's global one."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web
from prometheus_client import Counter

from openclaw.metrics import CONTENT_TYPE, Metrics, engine_metrics
from openclaw.serve.state import ServeState

REQUESTS = "openclaw_serve_requests_total"
DROPPED = "openclaw_serve_connections_dropped_total"
# A request whose client left before its answer ended: nginx's "client closed request".
CLIENT_LEFT = "499"
UNROUTED = "other"  # a path the API does not have: one label, however many paths are tried


class ServeMetrics:
    """The API's series beside the engine's, and how a request or a dropped connection counts."""

    def __init__(self, state: ServeState) -> None:
        self.metrics: Metrics = engine_metrics(state.llm.stats, since=time.time())
        registry = self.metrics.registry
        self.requests = Counter(REQUESTS, "API requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=registry)
        self.dropped = Counter(DROPPED, "connections the API's listener closed unanswered: over "
                               "its cap, the oldest that had sent no whole request", registry=registry)
        self.in_flight = 0
        self.metrics.gauge("openclaw_serve_requests_in_flight", lambda: self.in_flight,
                           "API requests being answered now, streams included")
        self.metrics.gauge("openclaw_serve_sequences_in_flight", lambda: state.in_flight,
                           "engine sequences the API has running or waiting")
        self.metrics.gauge("openclaw_serve_sequences_max", lambda: state.capacity,
                           "sequences in flight past which the API answers 503")

    def render(self) -> bytes:
        return self.metrics.render().encode()


METRICS = web.AppKey("openclaw_serve_metrics", ServeMetrics)


@web.middleware
async def count_requests(request: web.Request, handler) -> web.StreamResponse:
    """Counts every request by its route (not its path, which a client may vary without end) and
    the status it got; one whose client left counts as 499."""
    served = request.app[METRICS]
    resource = request.match_info.route.resource
    endpoint = resource.canonical if resource is not None else UNROUTED
    served.in_flight += 1
    status = CLIENT_LEFT
    try:
        response = await handler(request)
        status = str(response.status)
        return response
    except web.HTTPException as exc:
        status = str(exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):  # the client left: CLIENT_LEFT
        raise
    except Exception:
        status = "500"
        raise
    finally:
        served.in_flight -= 1
        served.requests.labels(endpoint, status).inc()


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].render(), headers={"Content-Type": CONTENT_TYPE})
