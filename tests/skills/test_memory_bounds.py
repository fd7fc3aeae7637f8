"""Adversarial: in-daemon skills never build a result far bigger than the limits allow. Each attack
here made the daemon allocate many times what it then refused (a 1 MB file edited into gigabytes);
each is now refused, or cut, before the allocation. Measured with tracemalloc, which sees every
thread's allocations (the files skill works in worker threads): the peak during the call must
stay far below the size the attack would have built."""

from __future__ import annotations

import asyncio
import email.policy
import shutil
import tempfile
import tracemalloc
from collections.abc import Awaitable
from email.message import EmailMessage
from pathlib import Path

import pytest

from sandbox.policy import Policy, Role
from sandbox.runner import Sandbox
from sandbox.scope import Limits
from skills.budget import CALL_MEMORY_BYTES, CAPTURE_BYTES
from skills.builtin.email.imap import IMAP_CALL_BYTES, READ_FETCH_BYTES
from skills.builtin.email.render import MAX_NAMED_ATTACHMENTS, message_text
from skills.builtin.file_search import MAX_SEARCH_VISITS
from skills.builtin.files import MAX_READ_BYTES, FilesSkill
from skills.executor import MAX_RESULT_CHARS, Executor, Outcome
from skills.registry import load_skills
from skills.skill_md import MAX_LISTED_FILES
from tests.skills.test_files import USER, Env, make_env, mine

MB = 1 << 20


async def peak_during(call: Awaitable[Outcome]) -> tuple[Outcome, int]:
    """The call's outcome, and the most memory held at once while it ran (beyond what was held before)."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        outcome = await call
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, peak - before


def put(env: Env, name: str, data: bytes) -> None:
    """A file in the user's workspace, theirs as if their own command had made it."""
    (env.workspace / name).write_bytes(data)
    mine(env.workspace / name)


@pytest.fixture
def big(tmp_path) -> Env:
    """A role with the default file size limit (64 MiB), so that only the size of a result stops it."""
    env = make_env(tmp_path, roles={"big": Role("big", skills=frozenset({"files"}),
                                                 limits=Limits(file_size_bytes=64 * MB, wall_seconds=5))})
    env.role = "big"
    return env


async def test_an_edit_that_would_blow_up_a_file_is_refused_before_its_text_is_built(big):
    # The attack: one character replaced everywhere by a long text. 64 KiB x 2,000 would be a
    # 128 MiB result (and as much again to encode it): over the 64 MiB limit, so it is refused
    # having built nothing of it.
    put(big, "big.txt", b"a" * (64 << 10))
    outcome, peak = await peak_during(big.executor.call(
        "files", {"action": "edit", "path": "big.txt", "old": "a", "new": "b" * 2000, "all": True},
        big.policy.principal(USER, "big")))
    assert outcome.decision == "denied" and not outcome.ok, outcome.text
    assert f"would make it {64 * 1024 * 2000:,} bytes" in outcome.text
    assert f"file size limit of {64 * MB:,} bytes" in outcome.text
    assert peak < 2 * MB, f"the refused edit held {peak:,} bytes at its peak"
    assert (big.workspace / "big.txt").read_bytes() == b"a" * (64 << 10)


async def test_an_edit_within_a_generous_file_limit_is_still_held_to_the_per_call_memory_budget(tmp_path):
    # An admin's file_size_mb of 1 GiB: a 1 MB file edited into 300 MB fits it, but would hold
    # more than one call may use in the daemon.
    env = make_env(tmp_path, roles={"huge": Role("huge", skills=frozenset({"files"}),
                                                 limits=Limits(file_size_bytes=1 << 30, wall_seconds=5))})
    env.role = "huge"
    put(env, "big.txt", b"a" * MB)
    outcome, peak = await peak_during(env.call(action="edit", path="big.txt", old="a", new="b" * 300,
                                               all=True))
    assert outcome.decision == "denied", outcome.text
    assert (f"editing big.txt would need {MB + 300 * MB:,} bytes of memory, over the "
            f"{CALL_MEMORY_BYTES:,} one call may use; nothing was done") in outcome.text
    assert peak < 4 * MB, f"the refused edit held {peak:,} bytes at its peak"
    assert (env.workspace / "big.txt").read_bytes() == b"a" * MB


async def test_an_edit_checks_utf8_a_piece_at_a_time_and_names_a_bad_bytes_offset(big):
    # "é" (2 bytes) across the 1 MiB boundary of the check's pieces is text; a lone 0xff past it is not.
    text = b"x" * (MB - 1) + "é".encode() + b" old "
    put(big, "ok.txt", text)
    assert (await big.ok(action="edit", path="ok.txt", old="old", new="new")).startswith(
        "replaced 1 occurrence in ok.txt (line 1)")
    assert (big.workspace / "ok.txt").read_bytes() == text.replace(b"old", b"new")
    put(big, "bad.txt", text + b"\xff")
    await big.fails(f"bad.txt is not valid UTF-8 (at byte {len(text)})", action="edit", path="bad.txt",
                    old="old", new="new")


async def test_a_write_or_append_over_the_limit_is_refused_before_its_content_is_encoded(tmp_path):
    env = make_env(tmp_path)
    content = "x" * (8 * MB)  # the tester role's limit is 4,096 bytes
    for action in ("write", "append"):
        outcome, peak = await peak_during(env.call(action=action, path="huge.txt", content=content))
        assert outcome.decision == "denied", outcome.text
        assert f"would make it {8 * MB:,} bytes, over your file size limit of 4,096 bytes" in outcome.text
        assert peak < MB, f"the refused {action} held {peak:,} bytes at its peak"
    assert not (env.workspace / "huge.txt").exists()


def test_the_read_size_setting_is_bounded_so_one_read_cannot_hold_a_whole_big_file():
    assert FilesSkill.check_settings({"max_read_bytes": MAX_READ_BYTES}) == []
    assert FilesSkill.check_settings({"max_read_bytes": 1 << 30}) == [
        f"max_read_bytes: at most {MAX_READ_BYTES:,} (one read's result is cut to "
        f"{MAX_RESULT_CHARS:,} characters anyway), got {1 << 30:,}"]


async def test_a_read_of_a_big_file_holds_one_page_of_it(tmp_path):
    env = make_env(tmp_path, {"max_read_bytes": MAX_READ_BYTES},
                   roles={"big": Role("big", skills=frozenset({"files"}), limits=Limits(wall_seconds=5))})
    env.role = "big"
    put(env, "big.log", b"y" * (32 * MB))
    outcome, peak = await peak_during(env.call(action="read", path="big.log"))
    assert outcome.ok and outcome.text.startswith("y" * MAX_RESULT_CHARS), outcome.text[-200:]
    assert peak < 4 * MAX_READ_BYTES, f"the read held {peak:,} bytes at its peak"


async def test_a_search_holds_the_matches_it_reports_not_every_matching_line(big):
    # Half a million matching lines in one file: only max_results of them are ever reported.
    put(big, "lines.txt", b"a\n" * (MB // 2))
    outcome, peak = await peak_during(big.call(action="search", path=".", pattern="a", max_results=50))
    assert outcome.ok and outcome.text.startswith("lines.txt:1: a\n"), outcome.text
    assert "lines.txt:50: a\n[" in outcome.text and "lines.txt:51:" not in outcome.text
    assert "[more matches exist; showing the first 50" in outcome.text
    assert peak < 8 * MB, f"the search held {peak:,} bytes at its peak"


async def test_a_commands_output_is_captured_to_what_a_result_can_use_whatever_the_role_allows():
    # Not tmp_path: pytest's /tmp/pytest-of-root is 0700, which the sandbox uid cannot walk through.
    root = Path(tempfile.mkdtemp(prefix="openclaw-memory-", dir="/tmp"))
    try:
        (root / "data").mkdir(mode=0o700)
        roles = {"loud": Role("loud", skills=frozenset({"shell"}),
                              limits=Limits(output_bytes=64 * MB, wall_seconds=30))}
        policy = Policy(roles, root / "data", role_of=lambda user: "loud")
        executor = Executor(load_skills(["shell"], [], {}), Sandbox())
        outcome, peak = await peak_during(executor.call(
            "shell", {"command": "head -c 8388608 /dev/zero | tr '\\0' x"}, policy.principal(USER)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert outcome.ok and outcome.text.startswith("exit status 0\nstdout:\nxxxx"), outcome.text[:300]
    assert peak < 6 * CAPTURE_BYTES, f"the command's capture held {peak:,} bytes at its peak"


# -- email ------------------------------------------------------------------------------------------


class GreedyIMAPServer:
    """An IMAP server on 127.0.0.1 that ignores the partial fetch asked for (BODY.PEEK[]<0.N>) and
    announces a literal of `literal_bytes`, as a broken or hostile server could: whatever it
    announces, imaplib would read and hold it all. Speaks just enough IMAP4rev1 for a read."""

    def __init__(self, literal_bytes: int) -> None:
        self.literal_bytes, self.sent = literal_bytes, 0
        self.host, self.port = "127.0.0.1", 0

    async def __aenter__(self) -> GreedyIMAPServer:
        self.server = await asyncio.start_server(self._session, self.host, 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"* OK IMAP4rev1 ready\r\n")
        try:
            while line := await reader.readline():
                tag, command = line.split(b" ", 2)[:2]
                command = command.strip().upper()
                if command == b"CAPABILITY":
                    writer.write(b"* CAPABILITY IMAP4rev1 AUTH=PLAIN\r\n")
                elif command == b"EXAMINE":
                    writer.write(b"* 1 EXISTS\r\n* OK [UIDVALIDITY 1] ok\r\n")
                elif command == b"UID":
                    writer.write(b"* 1 FETCH (UID 1 RFC822.SIZE %d BODY[] {%d}\r\n"
                                 % (self.literal_bytes, self.literal_bytes))
                    chunk = b"Subject: big\r\n\r\n" + b"x" * (MB - 16)
                    while self.sent < self.literal_bytes:
                        part = chunk[:self.literal_bytes - self.sent]
                        writer.write(part)
                        self.sent += len(part)
                        await writer.drain()
                    writer.write(b")\r\n")
                elif command == b"LOGOUT":
                    writer.write(b"* BYE\r\n" + tag + b" OK bye\r\n")
                    await writer.drain()
                    break
                writer.write(tag + b" OK done\r\n")
                await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            writer.close()


async def test_an_imap_server_that_sends_more_than_was_fetched_is_cut_off_not_held(tmp_path):
    async with GreedyIMAPServer(literal_bytes=64 * MB) as server:
        roles = {"reader": Role("reader", skills=frozenset({"email"}), email_read=True)}
        policy = Policy(roles, tmp_path, role_of=lambda user: "reader")
        settings = {"imap_host": server.host, "imap_port": server.port, "imap_security": "none",
                    "imap_username": "bob", "imap_password": "pw", "timeout_s": 20}
        executor = Executor(load_skills(["email"], [], {"email": settings}), Sandbox(), timeout_s=30)
        outcome = await executor.call("email", {"action": "read", "uid": 1}, policy.principal(USER))
        assert not outcome.ok, outcome.text[:300]
        assert f"more than {IMAP_CALL_BYTES:,} bytes" in outcome.text, outcome.text[:300]
        # The client stopped reading: the server could not hand over its 64 MiB.
        assert server.sent < 64 * MB


def many_attachments(count: int) -> bytes:
    message = EmailMessage()
    message["From"], message["Subject"] = "mallory@example.org", "files"
    message.set_content("see attached")
    for i in range(count):
        message.add_attachment(b"x", maintype="application", subtype="octet-stream", filename=f"f{i}.bin")
    return message.as_bytes(policy=email.policy.SMTP)


def test_a_message_of_thousands_of_parts_is_read_as_its_first_ones():
    raw = many_attachments(2000)
    tracemalloc.start()
    try:
        text = message_text(raw, 7, len(raw))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "see attached" in text
    named = text.split("attachments (not included): ", 1)[1].split("\n", 1)[0]
    assert named.startswith("f0.bin (application/octet-stream), f1.bin (application/octet-stream)")
    assert named.count(".bin") <= MAX_NAMED_ATTACHMENTS
    assert "and more not named" in named
    assert f"of {len(raw)} bytes were read" in text
    assert peak < 4 * MB, f"rendering held {peak:,} bytes at its peak"


# -- SKILL.md ---------------------------------------------------------------------------------------


async def test_a_skill_folder_of_many_files_is_walked_to_a_bound(tmp_path):
    # Whoever can write in a skill's folder (its git checkout, a shared mount) can fill it: the
    # listing with its instructions looks at a bounded number of entries, not all of them.
    folder = tmp_path / "crowded"
    (folder / "many").mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: crowded\ndescription: d\n---\nRead a.txt.\n")
    (folder / "a.txt").write_text("the one that matters")
    for i in range(20_000):
        (folder / "many" / f"file-{i:05}-with-a-long-enough-name.txt").touch()
    executor = Executor(load_skills([], [folder], {}), Sandbox())
    roles = {"r": Role("r", skills=frozenset({"crowded"}))}
    principal = Policy(roles, tmp_path, lambda u: "r").principal("x:1")
    outcome, peak = await peak_during(executor.call("crowded", {}, principal))
    assert outcome.ok and "Other files of this skill" in outcome.text, outcome.text
    assert "a.txt" in outcome.text
    assert outcome.text.count(".txt") <= MAX_LISTED_FILES + 1
    assert peak < MB, f"the listing held {peak:,} bytes at its peak"
    read = await executor.call("crowded", {"file": "a.txt"}, principal)
    assert read.ok and read.text == "the one that matters", read.text


async def test_a_listing_of_a_crowded_folder_holds_the_entries_it_shows(big):
    # A user's command can make a folder of a million empty files (they take no disk blocks).
    crowded = big.workspace / "crowded"
    crowded.mkdir()
    for i in range(30_000):
        (crowded / f"entry-{i:05}").touch()
    outcome, peak = await peak_during(big.call(action="list", path="crowded"))
    assert outcome.ok, outcome.text
    lines = outcome.text.splitlines()
    assert lines[0] == "crowded: 30,000 entries" and lines[1] == "entry-00000  0 bytes"
    assert "more not shown" in lines[-1]
    assert peak < 2 * MB, f"the listing held {peak:,} bytes at its peak"


async def test_a_search_of_a_crowded_folder_reads_no_more_of_it_than_it_looks_at(big):
    crowded = big.workspace / "crowded"
    crowded.mkdir()
    for i in range(30_000):
        (crowded / f"entry-{i:05}").touch()
    outcome, peak = await peak_during(big.call(action="search", path="crowded", glob="entry-0000*"))
    assert outcome.ok, outcome.text
    assert f"[stopped after {MAX_SEARCH_VISITS} files and folders" in outcome.text
    assert peak < MB, f"the search held {peak:,} bytes at its peak"


async def test_a_message_bigger_than_was_fetched_is_rendered_from_the_bytes_asked_for(tmp_path):
    # Under the call's 8 MiB from the server, but three times the 2 MB a read fetches: the body
    # the model reads, and the memory rendering takes, are those of the first 2 MB.
    async with GreedyIMAPServer(literal_bytes=6 * MB) as server:
        roles = {"reader": Role("reader", skills=frozenset({"email"}), email_read=True)}
        policy = Policy(roles, tmp_path, role_of=lambda user: "reader")
        settings = {"imap_host": server.host, "imap_port": server.port, "imap_security": "none",
                    "imap_username": "bob", "imap_password": "pw", "timeout_s": 20}
        executor = Executor(load_skills(["email"], [], {"email": settings}), Sandbox(), timeout_s=30)
        outcome, peak = await peak_during(executor.call("email", {"action": "read", "uid": 1},
                                                        policy.principal(USER)))
    assert outcome.ok, outcome.text[:300]
    assert f"[only the first {READ_FETCH_BYTES} of {6 * MB} bytes were read" in outcome.text
    assert peak < 16 * READ_FETCH_BYTES, f"the read held {peak:,} bytes at its peak"


async def test_a_lone_surrogate_is_measured_for_the_prompt_and_refused_as_text(tmp_path):
    # JSON's "\ud800" reaches a skill as a str that has no UTF-8 form: said plainly, nothing written.
    env = make_env(tmp_path)
    assert "(3 bytes)" in FilesSkill().describe({"action": "edit", "path": "a", "old": "\ud800", "new": ""})
    await env.fails("'content' is not valid text (it holds a lone surrogate)", action="write",
                    path="odd.txt", content="\ud800")
    assert not (env.workspace / "odd.txt").exists()
