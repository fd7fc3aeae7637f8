"""Crash recovery: the daemon (`openclaw run`'s own entry point, `openclaw.cli.main`) runs in a child
process against the fake Telegram server, is killed with SIGKILL at chosen points, and is started
again on the same data_dir. What must hold afterwards:

- a message acknowledged to Telegram is answered, exactly once (also when Telegram delivers it
  again because the crash came before the acknowledgement);
- a reply is sent once; the one exception is a crash after Telegram took a message and before the
  daemon recorded that: sendMessage has no idempotency key, so the outbox sends it again (a
  duplicate beats a lost reply; see openclaw/gateway/outbox.py). A streamed draft (stream_edits) of an
  answer cut short by the crash stays in the chat as it was, and the answer follows it;
- a turn is not run a second time: one whose answer was stored sends that answer;
- a tool call that ran is not run again without anyone knowing: the model is told the truth (it
  may have run), and the audit table has a row for it;
- a call waiting for approval is asked again under a new number; the old request, void with the
  run that asked it, is not sent (again) after the restart;
- reminders, pairing codes and summaries are not lost;
- the SQLite file passes `PRAGMA integrity_check` after every crash, and a crash while the schema
  is made leaves one the next start can open.

The model is scripted (tests/helpers/scripted_model.py) and behaves as a careful model would: it
repeats a tool call only when told the call did not run, or that it may be called again. Crash
points are set with files in the test's folder: `hold-<point>` makes the child wait there (and say
so with `at-<point>`) until the test kills it; `crash_once` kills the child itself, once, at a
point no outside observer could hit exactly; the fake server kills it while it serves a call.

The children are forked from a multiprocessing fork server that imported the daemon once: a fresh
interpreter per start would spend about 4 s importing torch and the rest, and this file starts the
daemon about 25 times.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import shutil
import signal
import sqlite3
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from openclaw.agent.context import SUMMARY_INSTRUCTIONS
from openclaw.gateway.approvals import STALE_REQUEST
from openclaw.scheduler.agent_job import JOB_NOTE
from skills.base import Skill, SkillContext
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers.scripted_model import ScriptedModel

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

DIR_ENV = "OPENCLAW_CRASH_TEST_DIR"
ADMIN = 1001  # the owner, in [access] admins
STRANGER = 2002
START_S = 30.0  # a start, on a busy 2-core machine
WAIT_S = 20.0

_CTX = multiprocessing.get_context("forkserver")
# Imported once in the fork server, not at every start of the daemon.
_CTX.set_forkserver_preload(["engine", "openclaw.cli", "openclaw.daemon", "connectors.telegram",
                             "openclaw.store.migrate", "alembic.command", __name__])


# ---- what runs in the child ---------------------------------------------------------------------


def _dir() -> Path:
    return Path(os.environ[DIR_ENV])


def crash_once(point: str) -> None:
    """SIGKILL this process here, the first time only (a file remembers it across restarts)."""
    marker = _dir() / f"crashed-{point}"
    if not marker.exists():
        marker.write_text("")
        os.kill(os.getpid(), signal.SIGKILL)


async def hold(point: str) -> None:
    """Wait here while the test holds this point (the file hold-<point>), saying so (at-<point>)."""
    if (_dir() / f"hold-{point}").exists():
        (_dir() / f"at-{point}").write_text("")
        while (_dir() / f"hold-{point}").exists():
            await asyncio.sleep(0.02)


def _note(entry: dict) -> None:
    with open(_dir() / "model.log", "a") as log:
        log.write(json.dumps(entry) + "\n")


def _turn_of(messages: list[dict]) -> tuple[str, list[str]]:
    """The last user message (a scheduled job's prompt without its note), and the tool results
    after it."""
    at = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return (messages[at]["content"].removeprefix(JOB_NOTE),
            [m["content"] for m in messages[at + 1:] if m["role"] == "tool"])


def script(messages: list[dict]) -> str:
    """"tool TAG" calls the side-effect tool with TAG and then reports its result; "hang ..." and
    anything else is echoed. A result that says the call did not run, or may be called again, is
    answered by calling it again; any other result (an error too) is reported as it is."""
    if messages[0]["content"] == SUMMARY_INSTRUCTIONS:
        return f"summary of {messages[-1]['content'].count(chr(10)) + 1} messages"
    user, results = _turn_of(messages)
    if user.startswith("tool "):
        tag = user.split()[1]
        if not results or re.search(r"not run|call it again", results[-1], re.IGNORECASE):
            return "<tool_call>" + json.dumps({"name": "sidefx", "arguments": {"tag": tag}}) + \
                "</tool_call>"
        return f"done {tag}: {results[-1]}"
    if user.startswith("sh "):  # "sh COMMAND": the shell skill
        if not results or re.search(r"not run|call it again", results[-1], re.IGNORECASE):
            return "<tool_call>" + json.dumps({"name": "shell", "arguments": {
                "command": user.removeprefix("sh ")}}) + "</tool_call>"
        return f"done sh: {results[-1]}"
    return f"echo: {user}"


class CrashModel(ScriptedModel):
    """The scripted model, with the crash points of a model call."""

    def __init__(self) -> None:
        super().__init__(script)

    async def generate(self, prompt: list[dict], params: Any = None, request_id: str | None = None,
                       **kw: Any):
        streaming = False
        if prompt[0]["content"] == SUMMARY_INSTRUCTIONS:
            _note({"call": "summary"})
            await hold("summary")
        else:
            user, results = _turn_of(prompt)
            _note({"call": "turn", "user": user, "results": results})
            if user.startswith("hang"):
                await hold("turn")
            if user.startswith("tool res") and results:  # the result is stored, the answer not yet
                crash_once("after-result")
            streaming = user.startswith("stream")
        async for out in super().generate(prompt, params, request_id, **kw):
            yield out
            if streaming:  # a draft of the answer is in the chat now
                await hold("stream")


class SideEffect(Skill):
    """Test only: appends its tag to effects.log (an action in the world: a mail sent, a file
    written), then, for "die..." tags, the daemon dies before the result is stored."""

    name = "sidefx"
    description = "Test only: does something that cannot be undone."
    parameters = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
    untrusted_output = False  # "did TAG": its own words

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        tag = args["tag"]
        with open(_dir() / "effects.log", "a") as log:
            log.write(tag + "\n")
        if tag.startswith("die"):
            crash_once(f"tool-{tag}")
        return f"did {tag}"


REPLY_CRASHES = ("done final",)  # a reply holding this: the daemon dies just before storing it


def child_main(config: str, test_dir: str) -> None:
    """`openclaw run --config CONFIG`, with the scripted model instead of the engine."""
    log = os.open(Path(test_dir) / "daemon.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ[DIR_ENV] = test_dir
    import openclaw.daemon
    from openclaw.cli import main
    from openclaw.store import Store

    async def scripted_backend(*args, **kwargs) -> CrashModel:
        return CrashModel()

    openclaw.daemon.open_backend = scripted_backend  # what the daemon makes its model with
    add_reply = Store.add_reply

    async def add_reply_or_die(self, channel, chat_id, pieces, **kw):
        # The turn's answer is stored in the conversation; the reply is not stored yet.
        for point in REPLY_CRASHES:
            if any(point in piece for piece in pieces):
                crash_once(f"reply-{point}")
        return await add_reply(self, channel, chat_id, pieces, **kw)

    Store.add_reply = add_reply_or_die
    add_message = Store.add_message

    async def add_message_or_die(self, conversation_id, role, content, *args, **kw):
        # A call ended ("late" tags); the daemon dies as its result is to be stored.
        if role == "tool" and content.startswith("did late"):
            crash_once("result-late")
        return await add_message(self, conversation_id, role, content, *args, **kw)

    Store.add_message = add_message_or_die
    if (Path(test_dir) / "crash-in-migration").exists():  # the first start dies as it makes tables
        from alembic.operations import Operations

        create_table, made = Operations.create_table, []

        def create_table_or_die(self, *args, **kwargs):
            made.append(args[0])
            if len(made) == 3:
                crash_once("migration")
            return create_table(self, *args, **kwargs)

        Operations.create_table = create_table_or_die
    os._exit(main(["--config", config, "run"]))


# ---- the test's side ----------------------------------------------------------------------------


class CrashingTelegram(FakeTelegram):
    """The fake Telegram, which can kill the daemon while it serves a call."""

    def __init__(self) -> None:
        super().__init__()
        self.victim: Callable[[], Awaitable[None]] | None = None
        self.kill_on_send: str | None = None  # once Telegram took a message holding this
        self.kill_before_confirming: int | None = None  # an update id

    async def _m_sendMessage(self, params: dict) -> dict:
        result = await super()._m_sendMessage(params)  # in the chat now
        if self.kill_on_send and self.kill_on_send in str(params.get("text")):
            self.kill_on_send = None
            await self.victim()  # before the daemon hears that it was sent
        return result

    async def _m_getUpdates(self, params: dict) -> list[dict]:
        wanted = self.kill_before_confirming
        if wanted is not None and int(params.get("offset") or 0) > wanted:
            self.kill_before_confirming = None
            await self.victim()  # stored by the daemon, never confirmed to Telegram
            return []
        return await super()._m_getUpdates(params)


async def until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S,
                daemon: Daemon | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" +
                                 (f"\n--- daemon log ---\n{daemon.log_tail()}" if daemon else ""))
        await asyncio.sleep(0.02)
    return value


class Daemon:
    """The daemon in a child process, on one data_dir, started and killed as the test says."""

    def __init__(self, tmp_path: Path, fake: CrashingTelegram, extra: str = "",
                 agent: str = "", skills: tuple[str, ...] = (), telegram: str = "") -> None:
        self.dir, self.fake = tmp_path, fake
        self.data = tmp_path / "data"
        self.config = tmp_path / "openclaw.toml"
        self.config.touch(mode=0o600)  # it holds a token
        self.config.write_text(f"""
data_dir = "{self.data}"
[access]
admins = ["telegram:{ADMIN}"]
dm_policy = "pairing"
[admin]
enabled = false
[agent]
temperature = 0.0
{agent}
[telegram]
enabled = true
token = "{fake.token}"
base_url = "{fake.base_url}"
base_file_url = "{fake.base_file_url}"
{telegram}
[skills]
enabled = {json.dumps(["clock", "reminders", f"{__name__}:SideEffect", *skills])}
{extra}
""")
        self.proc: Any = None
        fake.victim = self.kill

    async def start(self) -> None:
        connected = len(self.fake.calls_to("setMyCommands"))
        self.proc = _CTX.Process(target=child_main, args=(str(self.config), str(self.dir)))
        self.proc.start()
        # Connected to Telegram: by then it recovered what the last run left (both come first).
        await until(lambda: len(self.fake.calls_to("setMyCommands")) > connected
                    or not self.proc.is_alive(), "the daemon to start", START_S, self)
        assert self.proc.is_alive(), f"the daemon did not start:\n{self.log_tail()}"

    async def kill(self) -> None:
        """SIGKILL, and wait until it is gone."""
        self.proc.kill()
        await self.dead()

    async def dead(self) -> None:
        """Until the child is gone (it killed itself, or was killed); its lock is free then."""
        await until(lambda: not self.proc.is_alive(), "the daemon to die", WAIT_S, self)
        self.proc.join()
        assert self.proc.exitcode == -signal.SIGKILL, self.log_tail()
        assert integrity(self.data) == "ok"

    async def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            await until(lambda: not self.proc.is_alive(), "the daemon to die")
            self.proc.join()

    def log_tail(self, lines: int = 40) -> str:
        path = self.dir / "daemon.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else "(no log)"

    def log(self) -> str:
        return (self.dir / "daemon.log").read_text()

    def hold(self, point: str) -> None:
        (self.dir / f"at-{point}").unlink(missing_ok=True)
        (self.dir / f"hold-{point}").write_text("")

    def release(self, point: str) -> None:
        (self.dir / f"hold-{point}").unlink(missing_ok=True)

    async def at(self, point: str) -> None:
        await until(lambda: (self.dir / f"at-{point}").exists(), f"the daemon at {point}",
                    daemon=self)

    def effects(self) -> list[str]:
        path = self.dir / "effects.log"
        return path.read_text().split() if path.exists() else []

    def model_calls(self, user: str) -> int:
        path = self.dir / "model.log"
        calls = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return sum(1 for c in calls if c.get("user") == user)

    def query(self, sql: str, *args: Any) -> list[tuple]:
        with sqlite3.connect(self.data / "openclaw.db") as db:
            return db.execute(sql, args).fetchall()


def integrity(data: Path) -> str:
    with sqlite3.connect(data / "openclaw.db") as db:
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        return db.execute("PRAGMA integrity_check").fetchone()[0]


@pytest.fixture(scope="module", autouse=True)
def _fork_server():
    """The fork server holds the daemon's imports (some 300 MB): not for the rest of the run."""
    yield
    import multiprocessing.forkserver

    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)  # private, in 3.11+
    if stop is not None:
        stop()


@pytest.fixture
async def fake():
    server = CrashingTelegram()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def daemon(tmp_path, fake):
    d = Daemon(tmp_path, fake)
    yield d
    await d.close()


def texts(fake: FakeTelegram, chat: int = ADMIN) -> list[str]:
    return fake.texts(chat)


async def reply(fake: CrashingTelegram, daemon: Daemon, text: str, chat: int = ADMIN) -> None:
    """Until a message showing `text` is in the chat."""
    await until(lambda: any(text in t for t in texts(fake, chat)), f"a reply {text!r}", daemon=daemon)


# ---- messages and replies -----------------------------------------------------------------------


async def test_a_message_is_answered_once_whether_or_not_its_acknowledgement_came_before_the_crash(
        daemon, fake):
    # Stored and acknowledged (Telegram was asked for the next offset), not answered: killed while
    # the model works on it.
    daemon.hold("turn")
    await daemon.start()
    fake.send("hang one")
    await daemon.at("turn")
    await until(lambda: fake.confirmed > 10_001, "the update to be acknowledged", daemon=daemon)
    await daemon.kill()
    assert daemon.query("SELECT status FROM inbound_events") == [("received",)]

    # Stored, never acknowledged: Telegram delivers it again after the restart.
    daemon.release("turn")
    await daemon.start()
    await reply(fake, daemon, "echo: hang one")
    # Recorded as sent, too: killed between Telegram taking it and that, it would be sent again
    # (the one duplicate a crash can make; its own test is below).
    await until(lambda: daemon.query(
        "SELECT status FROM outbound_messages WHERE text = 'echo: hang one'") == [("sent",)],
        "the reply to be recorded as sent", daemon=daemon)
    daemon.hold("turn")
    fake.send("hang two")
    two = fake.kill_before_confirming = fake.updates[-1]["update_id"]
    await daemon.dead()
    assert [u["update_id"] for u in fake.updates] == [two]  # stored, not confirmed

    daemon.release("turn")
    await daemon.start()
    await reply(fake, daemon, "echo: hang two")
    await until(lambda: not fake.updates, "the redelivered update to be confirmed", daemon=daemon)
    fake.send("three")
    await reply(fake, daemon, "echo: three")
    assert texts(fake) == ["echo: hang one", "echo: hang two", "echo: three"]
    assert "ignoring redelivered message telegram:" in daemon.log()
    assert daemon.query("SELECT text, status FROM inbound_events ORDER BY id") == [
        ("hang one", "processed"), ("hang two", "processed"), ("three", "processed")]
    # Each user message once in the conversation, though "hang one" reached the model twice.
    assert daemon.query("SELECT content FROM messages WHERE role = 'user' ORDER BY id") == [
        ("hang one",), ("hang two",), ("three",)]
    assert daemon.model_calls("hang one") == 2


async def test_a_reply_telegram_took_just_before_the_crash_is_sent_again_and_only_that_one(
        daemon, fake):
    await daemon.start()
    fake.send("first")
    await reply(fake, daemon, "echo: first")
    fake.kill_on_send = "echo: second"
    fake.send("second")
    await daemon.dead()  # Telegram has it; the daemon never heard back
    assert texts(fake) == ["echo: first", "echo: second"]
    assert daemon.query("SELECT text, status FROM outbound_messages ORDER BY id") == [
        ("echo: first", "sent"), ("echo: second", "pending")]

    await daemon.start()
    await until(lambda: len(texts(fake)) == 3, "the pending reply to be sent again", daemon=daemon)
    fake.send("third")
    await reply(fake, daemon, "echo: third")
    await until(lambda: daemon.query("SELECT status FROM outbound_messages") == [("sent",)] * 3,
                "every reply recorded as sent", daemon=daemon)
    # The forced duplicate (sendMessage has no idempotency key), nothing else twice.
    assert texts(fake) == ["echo: first", "echo: second", "echo: second", "echo: third"]
    assert daemon.model_calls("second") == 1  # the turn was not run again


async def test_a_draft_streamed_before_the_crash_stays_and_the_answer_comes_after_it(tmp_path,
                                                                                        fake):
    """With stream_edits the answer grows in a message of its own (a draft) until it becomes the
    reply. Nothing records that message's id, so after a crash it stays as it was, cut short, and
    the answer worked out again comes as a new message after it."""
    daemon = Daemon(tmp_path, fake, telegram="stream_edits = true")
    try:
        daemon.hold("stream")
        await daemon.start()
        fake.send("stream this answer")
        await daemon.at("stream")
        await until(lambda: texts(fake), "a draft", daemon=daemon)
        await daemon.kill()
        daemon.release("stream")
        await daemon.start()
        await reply(fake, daemon, "echo: stream this answer")
        draft, answer = texts(fake)
        assert "echo: stream this answer".startswith(draft) and draft != answer
        assert answer == "echo: stream this answer"
    finally:
        await daemon.close()


# ---- tool calls ---------------------------------------------------------------------------------


async def test_a_tool_call_that_ran_before_the_crash_is_not_run_again_unknowingly(daemon, fake):
    # 1. The tool did its work; the daemon died before its result was stored.
    await daemon.start()
    fake.send("tool die-1")
    await daemon.dead()
    assert daemon.effects() == ["die-1"]
    await daemon.start()
    await reply(fake, daemon, "done die-1")
    assert daemon.effects() == ["die-1"], "the call ran again after the restart"
    answer = next(t for t in texts(fake) if "die-1" in t)
    assert "may have" in answer  # the model was told the truth, and passed it on
    audited = daemon.query("SELECT skill, decision, detail FROM audit_log WHERE skill = 'sidefx'")
    assert [row[:2] for row in audited] == [("sidefx", "interrupted")], audited

    # 2. The result was stored; the daemon died before the model's next call.
    fake.send("tool res-1")
    await daemon.dead()
    await daemon.start()
    await reply(fake, daemon, "done res-1: did res-1")
    assert daemon.effects() == ["die-1", "res-1"]

    fake.send("still there?")
    await reply(fake, daemon, "echo: still there?")
    assert [t for t in texts(fake) if t.startswith("done")] == [answer, "done res-1: did res-1"]
    assert daemon.query("SELECT content FROM messages WHERE role = 'user' ORDER BY id") == [
        ("tool die-1",), ("tool res-1",), ("still there?",)]


async def test_a_call_that_ended_as_the_daemon_died_has_one_audit_row_not_two(daemon, fake):
    # The call did its work and ended; the daemon died as its result was to be stored. Its audit
    # row goes in that transaction, so the row the next start writes (interrupted) is its only
    # one: never "allowed" and "interrupted" for one call.
    await daemon.start()
    fake.send("tool late-1")
    await daemon.dead()
    assert daemon.effects() == ["late-1"]
    await daemon.start()
    await reply(fake, daemon, "done late-1: error: interrupted")
    assert daemon.effects() == ["late-1"], "the call ran again after the restart"
    assert daemon.query("SELECT decision FROM audit_log WHERE skill = 'sidefx'") == [
        ("interrupted",)]


async def test_a_message_with_a_file_is_taken_up_as_it_was_stored(daemon, fake):
    # Its file was saved and the tool ran; the daemon died before the result was stored. Taken
    # up again, the message is the one stored (the file is not fetched and saved a second time,
    # under another name), so the call is still seen for what it was.
    await daemon.start()
    fake.send_document("notes.txt", b"some notes", caption="tool die-2")
    await daemon.dead()
    await daemon.start()
    await reply(fake, daemon, "done die-2: error: interrupted")
    assert daemon.effects() == ["die-2"]
    assert [p.name for p in (daemon.data / "workspaces").rglob("*.txt")] == ["notes.txt"]
    (stored,) = daemon.query("SELECT content FROM messages WHERE role = 'user'")
    assert stored[0].startswith("tool die-2\n\n[attached files, in your workspace: notes.txt]")


async def test_an_answer_stored_just_before_the_crash_is_sent_not_worked_out_again(daemon, fake):
    # The tool ran, the model answered, the answer is in the conversation; the daemon died before
    # the reply was stored (which would have marked the message answered).
    await daemon.start()
    fake.send("tool final-1")
    await daemon.dead()
    assert daemon.effects() == ["final-1"]
    await daemon.start()
    await reply(fake, daemon, "done final-1: did final-1")
    fake.send("still there?")
    await reply(fake, daemon, "echo: still there?")
    assert texts(fake) == ["done final-1: did final-1", "echo: still there?"]
    assert daemon.effects() == ["final-1"], "the turn ran again, and its tool with it"
    assert daemon.model_calls("tool final-1") == 2  # its two steps, each once
    assert daemon.query("SELECT role, content FROM messages ORDER BY id") == [
        ("user", "tool final-1"), ("assistant", ""), ("tool", "did final-1"),
        ("assistant", "done final-1: did final-1"),
        ("user", "still there?"), ("assistant", "echo: still there?")]


async def test_a_call_waiting_for_approval_is_asked_again_after_the_crash(tmp_path, fake):
    daemon = Daemon(tmp_path, fake, "[roles.admin]\napproval = [\"sidefx\"]\n")
    try:
        await daemon.start()
        fake.kill_on_send = "Approval needed (sidefx)"  # in the chat; the daemon never heard so
        fake.send("tool appr-1")
        await daemon.dead()
        old = re.search(r"/approve (\d+)", texts(fake)[-1])[1]

        await daemon.start()
        await until(lambda: len(texts(fake)) >= 2, "the request to be asked again", daemon=daemon)
        fake.send("/status")  # something after, so a stale request sent late would be seen
        await reply(fake, daemon, "Model: scripted")
        # Asked again under a new number; the old request, void with the run that asked it, is
        # not sent again though it was pending.
        requests = [t for t in texts(fake) if "Approval needed (sidefx)" in t]
        assert len(requests) == 2, texts(fake)
        new = re.search(r"/approve (\d+)", requests[-1])[1]
        assert new != old
        assert daemon.query("SELECT status, error FROM outbound_messages WHERE id = 1") == [
            ("failed", STALE_REQUEST)]
        fake.send(f"/approve {old}")
        await reply(fake, daemon, f"There is no request {old} waiting for you")
        assert daemon.effects() == []
        fake.send(f"/approve {new}")
        await reply(fake, daemon, "done appr-1: did appr-1")
        assert daemon.effects() == ["appr-1"]
    finally:
        await daemon.close()


# ---- reminders, pairing codes, summaries --------------------------------------------------------


async def add_reminder(data: Path, text: str, due_at: datetime) -> None:
    from openclaw.store import Store

    store = await Store.open(f"sqlite:///{data / 'openclaw.db'}")
    try:
        await store.add_reminder(f"telegram:{ADMIN}", str(ADMIN), text, due_at)
    finally:
        await store.close()


async def test_reminders_and_pairing_codes_survive_a_crash(daemon, fake):
    now = datetime.now(UTC)
    await add_reminder(daemon.data, "pills", now - timedelta(minutes=10))  # due while down
    await add_reminder(daemon.data, "stretch", now - timedelta(seconds=1))
    fake.kill_on_send = "Reminder: stretch"  # due, sent, and the daemon dies before it knows
    await daemon.start()
    await daemon.dead()

    await daemon.start()
    await until(lambda: sum("stretch" in t for t in texts(fake)) == 2, "stretch again", daemon=daemon)
    await reply(fake, daemon, "Reminder: pills")
    pills = [t for t in texts(fake) if "pills" in t]
    assert len(pills) == 1 and "I could not send it then" in pills[0]
    assert daemon.query("SELECT text, status, fired_count FROM reminders ORDER BY id") == [
        ("pills", "done", 1), ("stretch", "done", 1)]

    # A stranger's pairing code outlives a crash, and still admits them.
    fake.send("hello", user=STRANGER)
    await reply(fake, daemon, "Your pairing code is", chat=STRANGER)
    code = re.search(r"pairing code is (\w+)", texts(fake, STRANGER)[-1])[1]
    await daemon.kill()
    await daemon.start()
    fake.send("hello again", user=STRANGER)
    # At least: the code's piece may go again after the kill, if it was sent but not yet marked
    # (the outbox was sending the owner's notice of the request beside it).
    await until(lambda: len(texts(fake, STRANGER)) >= 2, "a second answer", daemon=daemon)
    assert f"pairing code is {code}" in texts(fake, STRANGER)[-1]  # the same code
    fake.send(f"/pairing approve {code}")
    await reply(fake, daemon, "Approved telegram:2002")
    fake.send("now?", user=STRANGER)
    await reply(fake, daemon, "echo: now?", chat=STRANGER)


async def test_a_crash_during_compaction_loses_no_message(tmp_path, fake):
    daemon = Daemon(tmp_path, fake, agent="context_tokens = 400\nreply_max_tokens = 64\n"
                    "compaction_keep_messages = 2")
    try:
        daemon.hold("summary")
        await daemon.start()
        words = " ".join(["word"] * 30)
        sent = 0
        compacting = daemon.dir / "at-summary"
        while not compacting.exists():
            sent += 1
            assert sent < 20, "no compaction"
            fake.send(f"m{sent} {words}")
            await until(lambda n=sent: len(texts(fake)) == n or compacting.exists(),
                        f"the answer to m{sent}", daemon=daemon)
        await daemon.kill()
        assert daemon.query("SELECT count(*) FROM summaries") == [(0,)]
        daemon.release("summary")
        await daemon.start()
        await until(lambda: len(texts(fake)) == sent, f"the answer to m{sent}", daemon=daemon)
        assert texts(fake) == [f"echo: m{i} {words}" for i in range(1, sent + 1)]
        (summary_up_to,) = daemon.query("SELECT max(up_to_message_id) FROM summaries")[0]
        assert summary_up_to is not None
        # Nothing deleted: every message is still stored, the summary only shortens the prompt.
        users = daemon.query("SELECT content FROM messages WHERE role = 'user' ORDER BY id")
        assert [u[0].split()[0] for u in users] == [f"m{i}" for i in range(1, sent + 1)]
    finally:
        await daemon.close()


def processes_running(word: str) -> list[int]:
    """Pids whose command line holds `word`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and word.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
async def test_a_sandboxed_command_dies_with_the_daemon_and_is_not_run_again(tmp_path, fake):
    # No network: no slirp4netns per command (and none needed).
    daemon = Daemon(tmp_path, fake, "[roles.admin]\nnetwork = false\n", skills=("shell",))
    marker = "sleep 37.25"  # a command line no other process has
    try:
        await daemon.start()
        fake.send(f"sh echo ran >> ran.txt; {marker}")
        ran = daemon.data / "workspaces"
        await until(lambda: list(ran.rglob("ran.txt")) and processes_running(marker),
                    "the command to run", daemon=daemon)
        await daemon.kill()
        # bwrap --die-with-parent: nothing of the command outlives the daemon.
        await until(lambda: not processes_running(marker), "the command to die with the daemon")
        await daemon.start()
        await reply(fake, daemon, "done sh: error: interrupted")
        (log,) = ran.rglob("ran.txt")
        assert log.read_text() == "ran\n", "the command ran again"
        assert daemon.query("SELECT skill, decision FROM audit_log") == [("shell", "interrupted")]
    finally:
        await daemon.close()


async def test_a_crash_while_the_schema_is_made_leaves_a_database_the_next_start_opens(
        daemon, fake):
    (daemon.dir / "crash-in-migration").write_text("")
    daemon.proc = _CTX.Process(target=child_main, args=(str(daemon.config), str(daemon.dir)))
    daemon.proc.start()
    await daemon.dead()
    assert (daemon.dir / "crashed-migration").exists()
    await daemon.start()
    fake.send("hello")
    await reply(fake, daemon, "echo: hello")


async def test_a_reply_stored_as_its_sender_is_cancelled_is_still_sent(tmp_path, monkeypatch):
    """Not a crash, its cousin: /stop (or a drain) cancels a turn while its reply is being stored.
    The store finishes the call, so the reply is stored, pending, and its message marked answered;
    it used to wait for the next start, as no retry had been started for it. In process."""
    from openclaw.store import Store
    from tests.helpers.outbox import SlowConnector, start

    conn = SlowConnector()
    daemon = await start(tmp_path, conn)
    outbox = daemon.gateway.outbox
    add = Store._add_outbound

    async def slowly(self, *args, **kwargs):  # within the store call, which a cancel leaves be
        await asyncio.sleep(0.3)
        return await add(self, *args, **kwargs)

    monkeypatch.setattr(Store, "_add_outbound", slowly)
    try:
        sending = asyncio.create_task(outbox.send("terminal", "local", ["the reply"],
                                                  conversation_id=None, answers=None))
        await asyncio.sleep(0.05)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        assert outbox.backlog == 1
        conn.release.set()
        await asyncio.wait_for(outbox.wait_delivered(), WAIT_S)
        assert conn.texts("local") == ["the reply"]
    finally:
        await daemon.stop()


# ---- scheduled jobs ---------------------------------------------------------------------------


async def test_a_job_killed_during_its_run_is_not_run_again_after_the_restart(tmp_path, fake):
    """Its run is recorded before it starts: after the kill the restart finds it, marks it
    interrupted, tells the user, and does not run it a second time for that due time."""
    from openclaw.store import Store

    daemon = Daemon(tmp_path, fake, skills=("schedule",))
    try:
        await _killed_during_a_job(daemon, fake, Store)
    finally:
        await daemon.close()


async def _killed_during_a_job(daemon: Daemon, fake: CrashingTelegram, Store: Any) -> None:
    async with await Store.open(f"sqlite+aiosqlite:///{daemon.data / 'openclaw.db'}") as store:
        due = datetime.now(UTC) + timedelta(seconds=2)
        await store.add_job(f"telegram:{ADMIN}", str(ADMIN), "agent", f"once {due.isoformat()}",
                            "tool die-job", timezone="UTC")
    daemon.proc = _CTX.Process(target=child_main, args=(str(daemon.config), str(daemon.dir)))
    daemon.proc.start()
    await daemon.dead()  # the job's tool call killed it, mid-run
    assert daemon.effects() == ["die-job"]
    assert daemon.query("SELECT outcome, finished_at FROM job_runs") == [("running", None)]

    await daemon.start()
    await reply(fake, daemon, "was cut short by a restart")
    assert daemon.query("SELECT outcome FROM job_runs") == [("interrupted",)]
    assert daemon.query("SELECT status FROM jobs") == [("done",)]
    assert daemon.effects() == ["die-job"], "the job ran again after the restart"
