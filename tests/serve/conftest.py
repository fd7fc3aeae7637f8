"""The serve tests' engine: one AsyncLLM over a random-weight chat model for the whole session,
each test module with its API server over it."""

from __future__ import annotations

import pytest

from tests.helpers.chat_model import random_chat_model
from tests.helpers.serve_thread import ServerThread

# The pool holds 4096 tokens (256 blocks of 16) at most: small enough that a leak shows.
ENGINE_ARGS = dict(kv_cache_gib=0.004, max_model_len=1024, max_num_batched_tokens=512,
                   max_num_seqs=32)


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory) -> str:
    return str(random_chat_model(tmp_path_factory.mktemp("chat-model")))


@pytest.fixture(scope="session")
def llm(chat_model):
    from engine import AsyncLLM

    engine = AsyncLLM(chat_model, **ENGINE_ARGS)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def api(llm, request):
    """The module's API server over the session's engine; a module's `SERVER` dict, if any, holds
    its settings (ServerThread's keywords)."""
    server = ServerThread(llm, **getattr(request.module, "SERVER", {}))
    yield server
    server.close()


@pytest.fixture
def client(api):
    yield api.client()
    api.wait_idle()  # every test leaves the engine as it found it: nothing running, blocks free
