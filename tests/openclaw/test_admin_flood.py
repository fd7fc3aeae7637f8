"""The daemon under a flood of connections to its admin port, and with its descriptors used up: it
keeps answering /healthz, running shell and files calls and polling Telegram, and its log does not
fill. Also the pieces: the health rule for a connector that stays disconnected, accept failures
said once per interval, and the open-files limit raised at start."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from openclaw import health as health_module
from openclaw.descriptors import ACCEPT_FAILED, AcceptFailureLog
from openclaw.health import ConnectorWatch
from tests.helpers import telegram_env
from tests.helpers.daemon import RecordingConnector, config
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

REPO = Path(__file__).resolve().parents[2]
ADA = 1001  # the admin, in config
fake = telegram_env.fake  # the fake Bot API, as a fixture
LIMIT = 256  # the daemon's hard RLIMIT_NOFILE in the flood test (its soft one starts at 128)
FLOOD = 1100  # half-sent connections held open at once, as in the report that found the problem


# ---- the health rule ----------------------------------------------------------------------------


class Link(RecordingConnector):
    """A connector whose connection a test cuts and restores."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.connected = True


def test_a_connector_disconnected_past_the_grace_is_named_and_not_before() -> None:
    now = [0.0]
    telegram = Link("telegram")
    watch = ConnectorWatch([telegram], grace_s=120, clock=lambda: now[0])
    watch.sample()
    telegram.connected = False
    now[0] = 10.0
    watch.sample()  # the outage began here
    now[0] = 100.0
    telegram.connected = True  # a reconnect within the grace: never reported
    assert watch.down() == {}
    telegram.connected = False
    now[0] = 110.0
    watch.sample()
    now[0] = 230.0
    assert watch.down() == {}  # 120 s: not yet past the grace
    now[0] = 230.5
    assert watch.down() == {"telegram": 120.5}


async def test_the_daemon_is_unhealthy_while_an_enabled_connector_stays_disconnected(
        tmp_path, monkeypatch) -> None:
    from openclaw.daemon import Daemon

    monkeypatch.setattr(health_module, "CONNECTOR_GRACE_S", 0.3)
    telegram, terminal = Link("telegram"), Link("terminal")
    terminal.connected = False  # a console nobody attached to: no fault
    cfg = config(tmp_path, '[telegram]\nenabled = true\ntoken = "123456:TEST"')
    daemon = Daemon(cfg, model=ScriptedModel(lambda m: "fine"), connectors=[terminal, telegram])
    await daemon.start()
    try:
        assert daemon.health()["status"] == "ok"
        telegram.connected = False
        await asyncio.sleep(0.1)
        assert daemon.health()["status"] == "ok"  # within the grace: a reconnect may follow
        await until(lambda: daemon.health()["status"] == "disconnected", timeout=5)
        report = daemon.health()
        assert list(report["disconnected_s"]) == ["telegram"] and report["disconnected_s"]["telegram"] >= 0.3
        assert report["connectors"] == {"terminal": False, "telegram": False}
        telegram.connected = True
        assert daemon.health()["status"] == "ok" and "disconnected_s" not in daemon.health()
    finally:
        await daemon.stop()


# ---- accepts that fail for want of a descriptor -------------------------------------------------


def test_failed_accepts_are_reported_once_per_interval_and_other_reports_pass_through(caplog) -> None:
    now, passed = [0.0], []
    handler = AcceptFailureLog(lambda loop, context: passed.append(context["message"]), every_s=60,
                               clock=lambda: now[0])
    failed = {"message": ACCEPT_FAILED, "exception": OSError(errno.EMFILE, "Too many open files")}
    loop = asyncio.new_event_loop()
    try:
        caplog.set_level(logging.INFO, logger="openclaw.descriptors")
        for second in range(180):  # asyncio retries the accept every second
            now[0] = float(second)
            handler(loop, failed)
        handler(loop, {"message": "Task exception was never retrieved"})
    finally:
        loop.close()
    said = [r.getMessage() for r in caplog.records if r.name == "openclaw.descriptors"]
    assert len(said) == 3  # at 0, 60 and 120 s
    assert said[0].startswith("cannot accept connections: Too many open files (open-files limit ")
    assert "1 accept(s) failed" in said[0] and "60 accept(s) failed" in said[1]
    assert passed == ["Task exception was never retrieved"]


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    code = ("import resource; from openclaw.descriptors import raise_open_files_limit; "
            "print(raise_open_files_limit(), resource.getrlimit(resource.RLIMIT_NOFILE), "
            "raise_open_files_limit())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (100, 300)))
    assert done.stdout.strip() == "(100, 300) (300, 300) None", done.stderr


# ---- the flood, against a daemon in its own process ---------------------------------------------


def reply(messages: list[dict]) -> str:
    """A shell call for "shell", a files call for "files", then the tool's result as the answer."""
    last = messages[-1]
    if last["role"] == "tool":
        return "RESULT: " + last["content"]
    if "shell" in last["content"]:
        return '<tool_call>{"name": "shell", "arguments": {"command": "echo flood-ok"}}</tool_call>'
    return ('<tool_call>{"name": "files", "arguments": {"action": "write", "path": "flood.txt", '
            '"content": "written under the flood"}}</tool_call>')


class DescriptorHog:
    """What a leak elsewhere in the daemon does: SIGUSR1 takes every free descriptor, SIGUSR2
    gives them back."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def take(self) -> None:
        try:
            while True:
                self.held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass

    def give_back(self) -> None:
        for fd in self.held:
            os.close(fd)
        self.held.clear()


def _serve(config_path: str) -> None:
    """The daemon process: connectors from the config, the scripted model above."""
    from openclaw.channels import configured_connectors
    from openclaw.config import load_config
    from openclaw.daemon import Daemon

    async def main() -> None:
        cfg = load_config(Path(config_path))
        daemon = Daemon(cfg, model=ScriptedModel(reply), connectors=configured_connectors(cfg))
        hog = DescriptorHog()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, hog.take)
        loop.add_signal_handler(signal.SIGUSR2, hog.give_back)
        await daemon.start()
        await daemon.run_until_stopped(drain_timeout=2)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main())


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Flood:
    """Keeps `size` half-sent connections open to the port, opening a new one for each the daemon
    closes, until stopped."""

    def __init__(self, port: int, size: int) -> None:
        self.port, self.size = port, size
        self.opened = 0
        self.refused = 0  # connects that failed outright (a full accept queue, say)
        self.held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._task: asyncio.Task | None = None

    async def open_one(self) -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 5)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # ...and never the end
        except (OSError, TimeoutError):
            self.refused += 1
            return
        self.opened += 1
        self.held.append((reader, writer))

    async def keep_up(self) -> None:
        while True:
            # Closed by the daemon: a reset, or its FIN (which leaves our side open, at EOF).
            self.held = [(r, w) for r, w in self.held if not (w.transport.is_closing() or r.at_eof())]
            missing = self.size - len(self.held)
            for _ in range(0, missing, 100):
                await asyncio.gather(*(self.open_one() for _ in range(min(100, missing))))
            await asyncio.sleep(0.2)

    def start(self) -> None:
        self._task = asyncio.create_task(self.keep_up())

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        for _, writer in self.held:
            writer.transport.abort()


async def get(port: int, path: str, timeout: float = 5) -> tuple[int, dict]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body) if path == "/healthz" else {}


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_a_flood_of_half_sent_connections_leaves_the_daemon_working(tmp_path, fake):
    port = free_port()
    path = tmp_path / "openclaw.toml"
    path.touch(mode=0o600)
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
admins = ["telegram:{ADA}"]
[admin]
port = {port}
[skills]
enabled = ["shell", "files"]
[roles.admin]
approve_after_untrusted = false  # the write follows the shell's output, and nobody answers here
[telegram]
enabled = true
token = "{fake.token}"
base_url = "{fake.base_url}"
base_file_url = "{fake.base_file_url}"
""")
    log_file = tmp_path / "daemon.log"
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tests.openclaw.test_admin_flood", str(path)], cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=log_file.open("ab"),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, LIMIT)))
    flood = Flood(port, FLOOD)
    numbers: dict[str, object] = {}

    def log_lines() -> list[str]:
        return log_file.read_text().splitlines()

    async def answered(text: str, needle: str) -> None:
        before = len(fake.texts(ADA))
        fake.send(text)
        await until(lambda: any(needle in t for t in fake.texts(ADA)[before:]), timeout=30)

    try:
        await until(lambda: fake.polls_waiting, timeout=60)
        assert f"raised the open-files limit from 128 to {LIMIT}, the hard limit" in log_file.read_text()
        numbers["descriptors_at_rest"] = descriptors(daemon.pid)
        at_rest = len(log_lines())

        # 1. The flood: over four times the daemon's descriptors, half-sent, held and renewed.
        flood.start()
        peak = [0]

        async def sample() -> None:
            while True:
                peak[0] = max(peak[0], descriptors(daemon.pid))
                await asyncio.sleep(0.02)

        sampling = asyncio.create_task(sample())
        await until(lambda: flood.opened >= FLOOD, timeout=60)
        slowest = 0.0
        for _ in range(10):
            began = time.monotonic()
            status, report = await get(port, "/healthz")
            slowest = max(slowest, time.monotonic() - began)
            assert (status, report["status"]) == (200, "ok")
            await asyncio.sleep(0.1)
        polls = len(fake.calls_to("getUpdates"))
        await answered("run shell", "flood-ok")
        await answered("write files", "RESULT")
        assert (tmp_path / "data/workspaces/telegram-1001/flood.txt").read_text() == "written under the flood"
        assert len(fake.calls_to("getUpdates")) > polls  # still polled: each message ended a poll
        # At the ceiling the gate may displace a connection whose head it has not read yet (a
        # real one among them, under load): it promises that a request gets in, as a scraper's
        # next try does, not that none is ever dropped.
        status = None
        for _ in range(3):
            with contextlib.suppress(IndexError):  # dropped unanswered: nothing came back
                status, _ = await get(port, "/metrics")
                break
        assert status == 200
        sampling.cancel()
        numbers.update(opened=flood.opened, refused=flood.refused, most_descriptors=peak[0],
                       slowest_healthz_s=round(slowest, 3),
                       log_lines_during_flood=len(log_lines()) - at_rest)
        assert peak[0] < LIMIT - 64  # the cap bounds what the flood costs: 64 at most, briefly
        flooded = log_lines()[at_rest:]
        assert not [line for line in flooded if "admin" in line or "Traceback" in line], flooded
        assert len(flooded) <= 5, flooded  # nothing per connection (an answered message logs none)

        # 2. The descriptors used up by something else: accepts fail, said once; then it recovers.
        before_hog = len(log_lines())
        daemon.send_signal(signal.SIGUSR1)
        await until(lambda: "cannot accept connections" in log_file.read_text(), timeout=10)
        await asyncio.sleep(3)  # asyncio retries the accept every second, the flood keeps coming
        starved = log_lines()[before_hog:]
        numbers["log_lines_while_out_of_descriptors"] = len(starved)
        assert sum("cannot accept connections" in line for line in starved) == 1, starved
        assert not [line for line in starved if "Traceback" in line], starved
        daemon.send_signal(signal.SIGUSR2)
        await until(lambda: descriptors(daemon.pid) < LIMIT - 32, timeout=10)
        status, report = await get(port, "/healthz", timeout=10)
        assert (status, report["status"]) == (200, "ok")
        await answered("run shell again", "flood-ok")
        numbers["opened"] = flood.opened
    finally:
        await flood.stop()
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(20)
        finally:
            daemon.kill()
        print("flood numbers:", numbers)  # for the record: pytest -s shows them
    assert code == 0, log_file.read_text()[-3000:]
    assert fake.token not in log_file.read_text()


if __name__ == "__main__":
    _serve(sys.argv[1])
