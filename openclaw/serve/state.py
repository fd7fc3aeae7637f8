"""What every handler of the API shares: the engine, the model's name and limits, and the count of
sequences in flight that bounds the queue."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from openclaw.serve.errors import NOT_FOUND, SERVER_ERROR, APIError
from openclaw.serve.logprobs import TokenTexts

if TYPE_CHECKING:
    from engine import AsyncLLM

# Sequences allowed to wait for a place in the batch, beyond the max_num_seqs running.
DEFAULT_MAX_WAITING = 256


def default_model_name(model: str | None) -> str:
    """The model's file or folder name; the embedded model's own name."""
    return Path(model).name if model else "SmolLM2-135M-Instruct"


@dataclass
class ServeState:
    llm: AsyncLLM
    model_name: str
    api_key: str | None = None
    max_waiting: int = DEFAULT_MAX_WAITING
    in_flight: int = 0  # engine sequences the API has running or waiting
    stopping: bool = False  # the server is closing: new requests are refused
    # Each request's queue of outputs (generation.run_jobs): how a stop ends them all at once.
    outputs: set[asyncio.Queue] = field(default_factory=set, repr=False)
    created: int = field(default_factory=lambda: int(time.time()))
    _ids: itertools.count = field(default_factory=itertools.count, repr=False)
    token_texts: TokenTexts = field(init=False, repr=False)  # for logprobs

    def __post_init__(self) -> None:
        self.token_texts = TokenTexts(self.llm.engine)

    @property
    def max_model_len(self) -> int:
        """The longest sequence a request may make: the model's context, or what the KV pool
        holds when that is less (the engine refuses a prompt beyond either)."""
        engine = self.llm.engine
        pool = engine.block_manager.num_blocks * engine.config.block_size
        return min(self.llm.max_model_len, pool)

    @property
    def capacity(self) -> int:
        return self.llm.engine.config.max_num_seqs + self.max_waiting

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                           f"{self.model_name!r} (GET /v1/models)", type=NOT_FOUND,
                           param="model", code="model_not_found")

    def request_id(self, prefix: str) -> str:
        # Random, so an id seen in one response says nothing of other clients' requests; the
        # counter keeps two ids of this process apart whatever the randomness.
        return f"{prefix}-{secrets.token_hex(8)}{next(self._ids):x}"

    def admit(self, sequences: int) -> None:
        """Count `sequences` more in flight, or refuse them with a 503 when the queue is full:
        more than max_num_seqs running and max_waiting waiting. Release them with `release`."""
        if self.stopping:
            raise shutting_down()
        if self.in_flight + sequences > self.capacity:
            raise APIError(503, f"the server is busy: {self.in_flight} sequences are running or "
                           f"waiting, and it takes at most {self.capacity}; retry later",
                           type=SERVER_ERROR, code="queue_full", headers={"Retry-After": "1"})
        self.in_flight += sequences

    def release(self, sequences: int) -> None:
        self.in_flight -= sequences

    def stop(self) -> None:
        """Refuse new requests and end the ones in flight: each gets the shutdown's error (a
        stream's last event), and ending it aborts its engine requests."""
        self.stopping = True
        for outputs in self.outputs:
            outputs.put_nowait((-1, shutting_down()))


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; the request was ended", type=SERVER_ERROR,
                    code="server_shutting_down")


STATE = web.AppKey("openclaw_serve_state", ServeState)
