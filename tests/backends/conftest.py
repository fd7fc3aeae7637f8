"""Fixtures the backend tests share: a fake OpenAI-compatible server, and retries that do not
make a test wait."""

from __future__ import annotations

import pytest

from openclaw.backends import http
from tests.fakes.openai_api import FakeOpenAI


@pytest.fixture
async def fake():
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(http, "BACKOFF_S", 0.01)
