"""The whole daemon with `[engine] backend = "openai"` against the real `openclaw serve`, in a
process of its own on the embedded model: a conversation with a tool call, token counts and the
context as the server's engine has them, /stop aborting the request in that engine, and the
server killed mid-answer and started again.

The model (SmolLM2-135M) is too weak to choose a tool on its own, so the test makes the requests
ask for one: `a_call_first` has the backend send tool_choice "required" on a turn's first request
(the server's constrained decoder then makes a call to the one tool the role has, clock) and
"none" on the one after the call's result. Everything else is as the daemon sends it."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from openclaw.agent.loop import APOLOGY
from openclaw.backends.openai import OpenAIBackend
from openclaw.gateway import turn
from openclaw.gateway.turn import MODEL_AWAY
from tests.helpers.daemon import msg, say, started
from tests.helpers.waiting import eventually, until

pytestmark = pytest.mark.slow

SERVED = "smol"
STARTUP_S = 120  # the model loads in seconds; a loaded machine may take longer
PR_SET_PDEATHSIG = 1


class Served:
    """`openclaw serve` on the embedded model, in a process of its own; started again after a kill
    on the same port, so the daemon's url still finds it."""

    def __init__(self, home: Path) -> None:
        self.home, self.port = home, 0
        self.proc: subprocess.Popen | None = None
        self.url = ""  # the API's base, ".../v1"

    def start(self) -> None:
        """Start it and wait until it says it listens (the model is loaded by then)."""
        self.launch()
        self.wait_up()

    def launch(self) -> None:
        """Start it, in this (the main) thread: it is killed when the thread that started it ends,
        so that a test run killed midway leaves no server behind."""
        log = (self.home / "serve.log").open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "openclaw.cli", "serve", "--port", str(self.port),
             "--served-model-name", SERVED, "--max-model-len", "2048"],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=self.home,
            env={**os.environ, "HOME": str(self.home)}, preexec_fn=_killed_with_parent)
        log.close()

    def wait_up(self) -> None:
        line = self.proc.stdout.readline()
        assert line.startswith(f"serving {SERVED} at http://127.0.0.1:"), (
            line, (self.home / "serve.log").read_text()[-3000:])
        self.url = line.split(" at ")[1].split()[0]
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])

    def kill(self) -> None:
        """As a crash: SIGKILL, no time to end anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    async def numbers(self) -> dict[str, float]:
        """What its /metrics states now: requests running and waiting, tokens generated, KV
        blocks held (round 1's names or the daemon's)."""
        async with aiohttp.ClientSession() as session, session.get(f"{self.root}/metrics") as got:
            text = await got.text()
        found = {s.name: s.value for family in text_string_to_metric_families(text)
                 for s in family.samples}
        names = {"running": ("openclaw_engine_running", "openclaw_engine_num_running"),
                 "waiting": ("openclaw_engine_waiting", "openclaw_engine_num_waiting"),
                 "generated": ("openclaw_generated_tokens", "openclaw_engine_generated_tokens"),
                 "kv_blocks_used": ("openclaw_engine_kv_blocks_used",)}
        return {key: next(found[n] for n in options if n in found)
                for key, options in names.items() if any(n in found for n in options)}


def _killed_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server = Served(tmp_path_factory.mktemp("serve-home"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(autouse=True)
def quick_turn_retries(monkeypatch):
    monkeypatch.setattr(turn, "MODEL_RETRY_S", 0.05)
    monkeypatch.setattr(turn, "MODEL_RETRY_MAX_S", 0.5)


@pytest.fixture
def a_call_first(monkeypatch):
    """The tool_choice each next request sends, in order (see the module's doc); the bodies sent."""
    plan: list[str] = []
    sent: list[dict] = []
    chat_body = OpenAIBackend.chat_body

    def steered(self, prompt, params, tools, cache_salt, *rest):
        body = chat_body(self, prompt, params, tools, cache_salt, *rest)
        if plan and "tools" in body:
            body["tool_choice"] = plan.pop(0)
        sent.append(body)
        return body

    monkeypatch.setattr(OpenAIBackend, "chat_body", steered)
    return plan, sent


def on(served: Served, reply_max_tokens: int, skills: str = "") -> str:
    return (f"reply_max_tokens = {reply_max_tokens}\n"
            f"[roles.admin]\nskills = [{skills}]\n"
            f'[engine]\nbackend = "openai"\nurl = "{served.url}"\nmodel = "{SERVED}"\n')


async def conversation(daemon):
    conv = await daemon.store.active_conversation("terminal:local", "local")
    return await daemon.store.list_messages(conv.id)


async def mid_answer(served: Served, tokens: int = 3) -> None:
    """Until the server runs a request and has generated `tokens` more since this was called."""
    before = (await served.numbers()).get("generated", 0)
    await eventually(served.numbers, lambda now: now.get("running") == 1
                     and now.get("generated", 0) >= before + tokens, timeout=60)


async def test_a_conversation_with_a_tool_call_counted_as_the_servers_engine_counts(
        tmp_path, served, a_call_first):
    plan, sent = a_call_first
    plan += ["required", "none", "none"]
    daemon, conn = await started(tmp_path, None, on(served, 40, '"clock"'))
    client = openai.AsyncOpenAI(base_url=served.url, api_key="-", max_retries=0, timeout=120)
    # The context is the one the server states.
    [card] = (await client.models.list()).data
    assert daemon.model.max_model_len == card.max_model_len == 2048
    first = await say(daemon, conn, "What time is it in UTC?")
    second = await say(daemon, conn, "Thank you.")
    assert first and second and APOLOGY not in (first, second)
    assert conn.texts() == [first, second]
    asked, after_call, next_turn = sent
    assert [t["function"]["name"] for t in asked["tools"]] == ["clock"]
    # The server's decoder made the call; the daemon ran it and sent the result back.
    call, result = after_call["messages"][-2:]
    [made] = call["tool_calls"]
    assert made["function"]["name"] == "clock"
    assert result["role"] == "tool" and result["tool_call_id"] == made["id"]
    assert not result["content"].startswith("error")
    assert next_turn["messages"][:len(after_call["messages"])] == after_call["messages"]
    assert next_turn["messages"][-1] == {"role": "user", "content": "Thank you."}
    stored = await conversation(daemon)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "user",
                                        "assistant"]
    # Counted by the server's /tokenize as its engine counts a prompt: the same number its chat
    # completions report for the same messages and tools, tool calls and results among them.
    for body in (asked, after_call):
        counted = await daemon.model.count_chat(body["messages"], body["tools"])
        engine = await client.chat.completions.create(
            model=SERVED, messages=body["messages"], tools=body["tools"], tool_choice="auto",
            max_tokens=1, temperature=0)
        assert counted == engine.usage.prompt_tokens
    assert daemon.model.server_count.available
    # The server's KV pool, as its /metrics states it: the embedded model's 1 GiB CPU pool.
    await until(lambda: "kv_pool_tokens" in daemon.model.server_load)
    assert ("KV pool: 46,080 bytes/token; pool 1,456 blocks of 16 = 23,296 tokens (1.00 GiB); "
            "11 conversations of 2,048 tokens fit at once") in await say(daemon, conn, "/status")
    await client.close()
    await daemon.stop()


async def test_stop_mid_answer_aborts_the_request_in_the_servers_engine(tmp_path, served):
    daemon, conn = await started(tmp_path, None, on(served, 400))
    await conn.handler(msg("Tell me a long story about a dragon and a knight."))
    await mid_answer(served)
    await conn.handler(msg("/stop"))
    await asyncio.wait_for(daemon.gateway.wait_idle(), 10)
    assert conn.texts() == ["Stopped."]
    # Hundreds of tokens were left to make: the engine stops at once, its blocks freed.
    numbers = await eventually(served.numbers,
                               lambda now: now["running"] == 0 and now["waiting"] == 0, timeout=5)
    assert numbers.get("kv_blocks_used", 0) == 0
    assert await daemon.store.pending_inbound() == []
    await daemon.stop()


async def test_the_server_killed_mid_answer_and_started_again_answers_once(tmp_path, served):
    daemon, conn = await started(tmp_path, None, on(served, 32))
    hello = await say(daemon, conn, "Hello!")
    await conn.handler(msg("Tell me about the sea."))
    await mid_answer(served)
    served.kill()
    await until(lambda: len(conn.texts()) == 2, timeout=30)
    away = conn.texts()[1]
    # The owner hears why.
    assert away.startswith(MODEL_AWAY) and f"{served.url}: the answer broke off: the server " \
        "closed the connection before the answer's end" in away
    await asyncio.sleep(1)  # tries go on meanwhile, and tell no one again
    assert len(conn.texts()) == 2
    served.launch()
    await asyncio.to_thread(served.wait_up)
    await asyncio.wait_for(daemon.gateway.wait_idle(), STARTUP_S)
    assert conn.texts()[:2] == [hello, away]
    [answer] = conn.texts()[2:]
    assert answer and answer != APOLOGY and MODEL_AWAY not in answer
    stored = await conversation(daemon)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "Hello!"), ("assistant", hello), ("user", "Tell me about the sea."),
        ("assistant", answer)]
    assert await daemon.store.pending_inbound() == []
    await daemon.stop()
