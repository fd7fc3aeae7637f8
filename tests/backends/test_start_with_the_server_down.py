"""The daemon started while its model server is down: on what it remembers of that server (the
model and its context length, kept in data_dir whenever the server answered), or, the first time,
waiting for the server while telling systemd it is still starting."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import stat

import pytest

from openclaw.backends import openai
from openclaw.backends.remembered import FILE, ServerMemory
from openclaw.gateway import turn
from openclaw.gateway.turn import MODEL_AWAY
from tests.fakes.openai_api import MODEL
from tests.helpers.daemon import msg, started

from .test_daemon_on_a_server import last_user, on


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(turn, "MODEL_RETRY_S", 0.05)
    monkeypatch.setattr(openai, "START_RETRY_FIRST_S", 0.01)


@pytest.fixture
def systemd_socket(tmp_path, monkeypatch):
    """A datagram socket named by NOTIFY_SOCKET, as systemd gives a Type=notify service."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


async def heard(sock: socket.socket, wanted: str) -> list[str]:
    """The notifications up to the first that holds `wanted`."""
    loop, notes = asyncio.get_running_loop(), []
    while not any(wanted in note for note in notes):
        notes.append((await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)).decode())
    return notes


def waiting_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "waiting for the model's server" in r.getMessage()]


async def test_a_first_start_waits_for_the_server_telling_systemd_and_remembers_it(
        tmp_path, fake, systemd_socket, caplog):
    caplog.set_level(logging.WARNING, "openclaw.backends.openai")
    fake.max_model_len = 3000
    await fake.stop()
    starting = asyncio.create_task(started(tmp_path, None, on(fake)))
    notes = await heard(systemd_socket, "EXTEND_TIMEOUT_USEC=")
    notes += await heard(systemd_socket, "EXTEND_TIMEOUT_USEC=")  # each look at the server
    status = next(n for n in notes if n.startswith("STATUS="))
    assert "waiting for the model's server" in status and fake.url in status
    extension = next(n for n in notes if n.startswith("EXTEND_TIMEOUT_USEC="))
    assert int(extension.split("=")[1]) >= 10_000_000  # longer than one look takes
    assert not starting.done()
    assert len(waiting_lines(caplog)) == 1  # once a minute, not once a look
    await fake.start()
    daemon, _ = await asyncio.wait_for(starting, 10)
    assert "READY=1" in (await heard(systemd_socket, "READY=1"))[-1]
    assert daemon.model.max_model_len == 3000
    # What the server said is kept for the next start, for the owner alone.
    kept = tmp_path / "data" / FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert json.loads(kept.read_text()) == {fake.url: {"model": MODEL, "context_length": 3000}}
    await daemon.stop()


async def test_a_restart_with_the_server_down_starts_on_what_it_remembers(tmp_path, fake, caplog):
    fake.max_model_len = 3000
    fake.reply = lambda body: f"re: {last_user(body)}"
    daemon, _ = await started(tmp_path, None, on(fake))
    await daemon.stop()
    await fake.stop()
    caplog.set_level(logging.WARNING, "openclaw.backends.openai")
    daemon, conn = await asyncio.wait_for(started(tmp_path, None, on(fake)), 10)
    assert daemon.model.max_model_len == 3000
    assert any("not reachable" in r.getMessage() and "3000" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)
    await conn.handler(msg("hello"))  # the turn waits for the server, saying so
    await asyncio.wait_for(until_sent(conn, 1), 10)
    assert conn.texts()[0].startswith(MODEL_AWAY)
    await fake.start()
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts()[1:] == ["re: hello"]
    await daemon.stop()


async def until_sent(conn, n: int) -> None:
    while len(conn.sent) < n:
        conn.new_message.clear()
        await conn.new_message.wait()


async def test_the_model_remembered_is_used_when_the_config_names_none(tmp_path, fake):
    config = f'[engine]\nbackend = "openai"\nurl = "{fake.url}"\n'
    daemon, _ = await started(tmp_path, None, config)
    await daemon.stop()
    await fake.stop()
    daemon, _ = await asyncio.wait_for(started(tmp_path, None, config), 10)
    assert daemon.model.model == MODEL and daemon.model.max_model_len == 4096
    await daemon.stop()


def test_what_is_remembered_is_per_url_and_per_model(tmp_path):
    memory = ServerMemory(tmp_path)
    assert memory.recall("http://a:1/v1", None) is None
    memory.remember("http://a:1/v1", "m1", 8192)
    memory.remember("http://user:secret@b:1/v1?key=k", "m2", 4096)
    assert memory.recall("http://a:1/v1", None) == ("m1", 8192)
    assert memory.recall("http://a:1/v1", "m1") == ("m1", 8192)
    assert memory.recall("http://a:1/v1", "other") is None  # its length is another model's
    assert memory.recall("http://user:secret@b:1/v1?key=k", None) == ("m2", 4096)
    assert "secret" not in (tmp_path / FILE).read_text()  # a credential in the url is not kept
    assert stat.S_IMODE((tmp_path / FILE).stat().st_mode) == 0o600


def test_a_damaged_file_is_as_good_as_none(tmp_path, caplog):
    (tmp_path / FILE).write_text("{not json")
    memory = ServerMemory(tmp_path)
    assert memory.recall("http://a:1/v1", None) is None
    memory.remember("http://a:1/v1", "m1", 8192)  # and is replaced by the next that answers
    assert memory.recall("http://a:1/v1", None) == ("m1", 8192)
