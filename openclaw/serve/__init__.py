"""The OpenAI-compatible HTTP API over our engine (docs/serving.md), with vLLM's paths and shapes:
`openclaw serve` runs it alone, the daemon beside its agent on the model it already loaded.

app.py: the aiohttp application, its middlewares and APIServer; protocol.py: the request bodies;
chat.py, completions.py, tokens.py, models.py, metrics.py: the endpoints; reply.py: an answer,
whole or streamed; generation.py: running a request's choices on the engine; state.py: what the
handlers share; errors.py: OpenAI's error shape.
"""

from openclaw.serve.app import APIServer, build_app, serve_daemon_model
from openclaw.serve.state import DEFAULT_MAX_WAITING, ServeState

__all__ = ["DEFAULT_MAX_WAITING", "APIServer", "ServeState", "build_app", "serve_daemon_model"]
