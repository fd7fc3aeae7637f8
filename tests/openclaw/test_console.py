"""`openclaw chat` attached to a running daemon through its console socket."""

from __future__ import annotations

import io
import stat

from connectors.console_socket import ConsoleSocketConnector, attach
from openclaw.cli.chat import console_connector
from openclaw.daemon import Daemon
from tests.helpers.daemon import config
from tests.helpers.scripted_model import ScriptedModel, last_user


async def start(tmp_path, model):
    daemon = Daemon(config(tmp_path), model=model)
    sock = tmp_path / "openclaw.sock"
    daemon.connectors.append(console_connector(sock, daemon))  # as `openclaw run` makes it
    await daemon.start()
    return daemon, sock


def feeder(lines: list[str]):
    pending = iter(lines)

    async def next_line() -> str:
        return next(pending, "")

    return next_line


async def test_attached_chat_gets_each_reply_before_sending_the_next_line(tmp_path):
    model = ScriptedModel(lambda m: "echo: " + last_user(m), chunk=3, delay=0.001)
    daemon, sock = await start(tmp_path, model)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600  # only the daemon's own user may attach
    out = io.StringIO()
    ok = await attach(sock, feeder(["first\n", "\n", "second\n"]), out.write, interactive=False)
    assert ok
    assert out.getvalue() == "echo: first\necho: second\n"
    # the same conversation as the in-process console: terminal:local, kept in the store
    conv = await daemon.store.active_conversation("terminal:local", "local")
    assert [m.content for m in await daemon.store.list_messages(conv.id)] == [
        "first", "echo: first", "second", "echo: second"]
    await daemon.stop()


async def test_interactive_attach_streams_drafts_without_repeating_them(tmp_path):
    model = ScriptedModel(lambda m: "a streamed answer", chunk=2, delay=0.001)
    daemon, sock = await start(tmp_path, model)
    out = io.StringIO()
    assert await attach(sock, feeder(["hi\n"]), out.write, interactive=True)
    assert out.getvalue() == "a streamed answer\n"
    await daemon.stop()


async def test_no_daemon_means_no_attach(tmp_path):
    out = io.StringIO()
    assert not await attach(tmp_path / "missing.sock", feeder(["hi\n"]), out.write, False)
    assert out.getvalue() == ""
    assert not (tmp_path / "missing.sock").exists()


async def test_the_socket_is_removed_when_the_daemon_stops(tmp_path):
    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: "x"))
    await daemon.stop()
    assert not sock.exists()


async def test_a_reply_finishing_during_shutdown_still_reaches_the_console(tmp_path):
    import asyncio
    import json

    from tests.helpers.waiting import until

    model = ScriptedModel(lambda m: "the answer", chunk=1, delay=0.02)
    daemon, sock = await start(tmp_path, model)
    reader, writer = await asyncio.open_unix_connection(str(sock))
    writer.write(b'{"text": "question"}\n')
    await writer.drain()
    await until(lambda: model.prompts)
    await daemon.stop(drain_timeout=10)
    received = [json.loads(line) async for line in reader]
    assert {"type": "reply", "text": "the answer"} in received


async def test_a_second_daemon_refuses_to_take_over_a_live_console(tmp_path):
    import pytest

    from openclaw.gateway.contract import ConnectorStartError

    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: "x"))
    second = ConsoleSocketConnector(sock, lambda: None)
    with pytest.raises(ConnectorStartError, match="another openclaw daemon is running"):
        await second.start(lambda m: None)
    out = io.StringIO()
    assert await attach(sock, feeder(["hi\n"]), out.write, False)  # the first one still answers
    assert out.getvalue() == "x\n"
    await daemon.stop()


async def test_a_person_can_stop_a_reply_while_it_streams(tmp_path):
    import asyncio

    from tests.helpers.waiting import until

    model = ScriptedModel(lambda m: "a very long story " * 50, chunk=4)
    model.gate = asyncio.Event()  # the reply streams one chunk, then waits: only /stop ends it
    daemon, sock = await start(tmp_path, model)
    out: list[str] = []
    typed = iter(["tell me a story\n", "/stop\n"])

    async def person() -> str:
        line = next(typed, None)
        if line == "/stop\n":
            await until(lambda: out)  # typed while the draft is on screen
        elif line is None:
            return ""
        return line

    try:
        assert await asyncio.wait_for(attach(sock, person, out.append, interactive=True), 10)
        assert "".join(out).endswith("Stopped.\n") and model.aborted
    finally:
        model.gate.set()
        await daemon.stop()


async def test_the_client_ends_when_the_daemon_goes_away_while_it_waits_for_a_line(tmp_path):
    import asyncio

    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: "x"))
    out: list[str] = []
    never = asyncio.Event()

    typed: list[str] = []

    async def person() -> str:  # types one line, then nothing more
        if not typed:
            typed.append("hi\n")
            return "hi\n"
        await never.wait()
        return ""

    client = asyncio.create_task(attach(sock, person, out.append, interactive=True))
    from tests.helpers.waiting import until

    await until(lambda: "".join(out) == "x\n")
    await daemon.stop()
    assert await asyncio.wait_for(client, 5)
    assert out[-1] == "[daemon] disconnected: the daemon stopped, or dropped this console\n"


async def test_a_reply_left_for_a_console_reaches_the_next_one_before_its_own(tmp_path):
    import asyncio
    import json

    from tests.helpers.waiting import until

    model = ScriptedModel(lambda m: "echo: " + last_user(m), chunk=3)
    model.gate = asyncio.Event()
    daemon, sock = await start(tmp_path, model)
    daemon.gateway.outbox.first_delay_s = 30  # its retry would come long after the next attach
    try:
        reader, writer = await asyncio.open_unix_connection(str(sock))
        writer.write(json.dumps({"text": "first question"}).encode() + b"\n")
        await until(lambda: model.prompts)
        writer.close()  # the console goes away before the reply is done
        model.gate.set()
        await until(lambda: daemon.gateway.outbox.backlog == 1)  # kept for the next console
        out = io.StringIO()
        assert await asyncio.wait_for(attach(sock, feeder(["second question\n"]), out.write, False), 10)
        assert out.getvalue() == "echo: first question\necho: second question\n"
        assert await daemon.store.pending_outbound() == []
    finally:
        await daemon.stop()


async def test_a_person_gets_the_prompt_only_when_nothing_is_being_answered(tmp_path):
    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: "x"))
    events: list[str] = []
    try:
        assert await attach(sock, feeder(["hi\n"]), events.append, interactive=True,
                            prompt=lambda: events.append("> "))
        assert events == ["> ", "x", "\n", "> "]  # the prompt, the reply, the prompt again
    finally:
        await daemon.stop()


async def test_a_script_whose_daemon_goes_away_unanswered_does_not_pass_for_answered(tmp_path):
    import asyncio

    import pytest

    from tests.helpers.waiting import until

    model = ScriptedModel(lambda m: "never finished")
    model.gate = asyncio.Event()
    daemon, sock = await start(tmp_path, model)
    script = asyncio.create_task(attach(sock, feeder(["a question\n", "another\n"]), io.StringIO().write,
                                        interactive=False))
    await until(lambda: model.prompts)
    await daemon.stop(drain_timeout=0)
    with pytest.raises(ConnectionError, match="went away before"):
        await asyncio.wait_for(script, 5)


async def test_chat_started_while_the_daemon_loads_waits_for_its_console(tmp_path):
    import asyncio
    import os
    import sys

    from tests.helpers.daemon import config as config_of

    cfg = config_of(tmp_path)
    daemon = Daemon(cfg, model=ScriptedModel(lambda m: "hello from the daemon"))
    await daemon.start()  # holds data_dir, but has no console yet (as while its model loads)
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("NOTIFY_SOCKET", None)
    console = None
    chat = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "openclaw.cli", "--config", str(tmp_path / "openclaw.toml"), "chat",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    try:
        chat.stdin.write(b"hi\n")
        chat.stdin.close()
        waiting = await asyncio.wait_for(chat.stderr.readline(), 60)
        assert b"waiting for its console" in waiting
        from openclaw.cli.chat import console_connector, console_socket

        console = console_connector(console_socket(cfg.data_dir), daemon)
        daemon.gateway.add_connector(console)
        await console.start(daemon.gateway.handle)  # the console opens: the chat attaches
        out, _ = await asyncio.wait_for(chat.communicate(), 60)
        assert chat.returncode == 0 and out == b"hello from the daemon\n"
    finally:
        if chat.returncode is None:
            chat.kill()
        await daemon.stop()
        if console is not None:
            await console.stop()


async def test_a_console_that_reads_nothing_does_not_hold_up_the_others(tmp_path, monkeypatch):
    import asyncio

    from connectors import console_socket

    monkeypatch.setattr(console_socket, "SEND_TIMEOUT_S", 0.5)
    long_reply = "word " * 40_000  # drafts of it fill a socket that is never read many times over
    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: long_reply, chunk=2_000))
    try:
        _, stuck = await asyncio.open_unix_connection(str(sock))  # attached, never reads
        out = io.StringIO()
        assert await asyncio.wait_for(attach(sock, feeder(["go\n"]), out.write, False), 20)
        assert out.getvalue() == long_reply.strip() + "\n"
        stuck.close()
    finally:
        await daemon.stop()


def stopping_after_the_last_answer(daemon, out: list[str], first: str, then: str):
    """Lines for attach(): `first`, then (as SIGTERM right after its answer would) the daemon stops
    and the input's next read (`then`; "" is its end) comes only once attach has seen it go."""
    import asyncio

    calls = []

    async def next_line() -> str:
        calls.append(1)
        if len(calls) == 1:
            return first
        await daemon.stop()
        while not any(o.startswith("[daemon] disconnected") for o in out):
            await asyncio.sleep(0)
        for _ in range(20):  # a read from a pipe is slower than the socket's end
            await asyncio.sleep(0)
        return then

    return next_line


async def test_a_script_whose_input_was_all_answered_passes_when_the_daemon_stops_after(tmp_path):
    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: "answered"))
    out: list[str] = []
    lines = stopping_after_the_last_answer(daemon, out, "the only line\n", "")
    assert await attach(sock, lines, out.append, interactive=False)
    assert out[0] == "answered\n"


async def test_a_script_with_lines_left_when_the_daemon_stops_says_they_were_not_sent(tmp_path):
    import pytest

    daemon, sock = await start(tmp_path, ScriptedModel(lambda m: "answered"))
    out: list[str] = []
    lines = stopping_after_the_last_answer(daemon, out, "first\n", "second\n")
    with pytest.raises(ConnectionError, match="before the input was all sent"):
        await attach(sock, lines, out.append, interactive=False)


async def run_chat(tmp_path, line: bytes) -> tuple[int, bytes, bytes]:
    """`openclaw chat` as a person runs it, in a process of its own, fed `line`."""
    import asyncio
    import os
    import sys

    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("NOTIFY_SOCKET", None)
    chat = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "openclaw.cli", "--config", str(tmp_path / "openclaw.toml"), "chat",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    try:
        out, err = await asyncio.wait_for(chat.communicate(line), 60)
    finally:
        if chat.returncode is None:
            chat.kill()
    return chat.returncode, out, err


async def test_chat_attaches_while_the_config_file_has_a_mistake(tmp_path):
    # The admin fixing their file keeps the console: attaching needs only the data_dir.
    from openclaw.cli.chat import console_connector, console_socket

    daemon = Daemon(config(tmp_path), model=ScriptedModel(lambda m: "still here"))
    daemon.connectors.append(console_connector(console_socket(daemon.config.data_dir), daemon))
    await daemon.start()
    try:
        path = tmp_path / "openclaw.toml"
        path.write_text(path.read_text() + "\n[roles.user]\nbogus = 1\n")
        status, out, err = await run_chat(tmp_path, b"hi\n")
        assert (status, out) == (0, b"still here\n"), err
    finally:
        await daemon.stop()


async def test_a_second_chat_beside_an_in_terminal_one_is_told_at_once(tmp_path):
    from openclaw.datadir import claim_data_dir

    cfg = config(tmp_path)
    cfg.data_dir.mkdir(parents=True)
    lock = claim_data_dir(cfg.data_dir)  # as an `openclaw chat` holds it: no console, no reloads
    try:
        status, out, err = await run_chat(tmp_path, b"hi\n")
        assert status == 1 and b"another `openclaw chat`" in err and b"waiting" not in err
    finally:
        lock.close()


async def test_a_piped_question_answered_on_a_terminal_cannot_drive_it(tmp_path):
    # `cat mail.txt | openclaw chat`: the lines come from a pipe, the reply goes to a person's
    # terminal, which the model's text (quoting the mail) must not retitle, erase or rewrite.
    import asyncio
    import os
    import pty
    import sys

    from openclaw.cli.chat import console_connector, console_socket

    hostile = "ok\x1b]0;owned\x07\x1b[2J\x1b[1Ahidden\rend"
    daemon = Daemon(config(tmp_path), model=ScriptedModel(lambda m: hostile))
    daemon.connectors.append(console_connector(console_socket(daemon.config.data_dir), daemon))
    await daemon.start()
    screen, terminal = pty.openpty()
    try:
        env = {**os.environ, "HOME": str(tmp_path)}
        env.pop("NOTIFY_SOCKET", None)
        chat = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "openclaw.cli", "--config", str(tmp_path / "openclaw.toml"),
            "chat", stdin=asyncio.subprocess.PIPE, stdout=terminal,
            stderr=asyncio.subprocess.PIPE, env=env)
        os.close(terminal)
        terminal = None
        try:
            _, err = await asyncio.wait_for(chat.communicate(b"hi\n"), 60)
        finally:
            if chat.returncode is None:
                chat.kill()
        shown = b""
        while True:
            try:
                shown += os.read(screen, 4096)
            except OSError:  # EIO: the writer is gone and all was read
                break
        assert chat.returncode == 0, err
        assert b"\x1b" not in shown and b"\x07" not in shown and b"hidden\rend" not in shown, shown
        assert b"\\x1b]0;owned" in shown
    finally:
        os.close(screen)
        if terminal is not None:
            os.close(terminal)
        await daemon.stop()
