"""GET /v1/models (and one model by id), in vLLM's shape with `max_model_len`; GET /health."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from openclaw.serve.errors import SERVER_ERROR, APIError
from openclaw.serve.state import STATE, ServeState


def model_card(state: ServeState) -> dict[str, Any]:
    return {"id": state.model_name, "object": "model", "created": state.created,
            "owned_by": "openclaw", "root": state.model_name, "parent": None,
            "max_model_len": state.max_model_len, "permission": []}


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [model_card(request.app[STATE])]})


async def get_model(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state.check_model(request.match_info["model"])
    return web.json_response(model_card(state))


async def health(request: web.Request) -> web.Response:
    """200 with an empty body while the engine serves, as vLLM answers; 503 once its step loop
    has ended (shut down, or died of an error), so a load balancer stops sending requests."""
    if not request.app[STATE].llm.running:
        raise APIError(503, "the engine is not running (shut down, or its loop failed: the log "
                       "says why); restart the server", type=SERVER_ERROR, code="engine_dead")
    return web.Response(status=200)
