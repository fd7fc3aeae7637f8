"""The Discord connector end to end: the real daemon (real SQLite store, gateway, agent) with a
scripted model, the real discord.py client, and a fake Discord on loopback that speaks the REST and
gateway protocols (tests/fakes/discord_api.py). Nothing of discord.py or the daemon is mocked."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest

from connectors.discord import DiscordConnector, DiscordLoginError
from openclaw.channels import configured_connectors
from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.gateway.contract import InboundMessage
from openclaw.gateway.outbox import chunk_text
from tests.fakes.discord_api import FakeDiscord, Upload
from tests.helpers.replies import answer, answers
from tests.helpers.scripted_model import ScriptedModel, echo, history_echo, last_user
from tests.helpers.waiting import until

ADA = 1_300_000_000_000_000_001  # an admin
BOB = 1_300_000_000_000_000_002  # nobody the daemon knows
EVE = 1_300_000_000_000_000_003  # blocked in the config
OTHER_BOT = 1_300_000_000_000_000_009  # another bot, listed as an admin to show the bot flag wins


@pytest.fixture
async def fake():
    server = FakeDiscord()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def daemon_with(tmp_path, fake):
    """Start the daemon with the Discord connector built from its config, as `openclaw run` does."""
    daemons: list[Daemon] = []

    async def start(model: ScriptedModel, discord_extra: str = "",
                    token: str | None = None) -> tuple[Daemon, DiscordConnector]:
        path = tmp_path / "openclaw.toml"
        path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
admins = ["discord:{ADA}", "discord:{OTHER_BOT}"]
blocked = ["discord:{EVE}"]
dm_policy = "pairing"
[admin]
enabled = false
[agent]
temperature = 0.0
[discord]
enabled = true
token = "{token or fake.token}"
api_base = "{fake.api_base}"
gateway_url = "{fake.gateway_url}"
{discord_extra}
""")
        path.chmod(0o600)  # it holds a token
        config = load_config(path)
        connectors = configured_connectors(config)
        daemon = Daemon(config, model=model, connectors=connectors)
        daemons.append(daemon)
        await daemon.start()
        return daemon, connectors[0]

    yield start
    for daemon in daemons:
        await daemon.stop(drain_timeout=1)


async def dm(fake: FakeDiscord, user: int, text: str, **kw) -> str:
    """Send a DM and wait for the bot's next message in that chat."""
    channel = fake.dm_channel_id(user)
    before = len(fake.texts(channel))
    fake.send_dm(user, text, **kw)
    await until(lambda: len(fake.texts(channel)) > before)
    return fake.texts(channel)[-1]


def workspace(daemon: Daemon, user: int) -> Path:
    return daemon.config.policy().principal(f"discord:{user}").workspace


# ---- conversations ------------------------------------------------------------------------------


async def test_a_dm_conversation_over_two_turns(fake, daemon_with):
    daemon, _ = await daemon_with(ScriptedModel(history_echo))
    assert await dm(fake, ADA, "my name is Ada") == "you said 1 things: my name is Ada"
    assert await dm(fake, ADA, "what is my name?") == (
        "you said 2 things: my name is Ada | what is my name?")
    channel = fake.dm_channel_id(ADA)
    assert channel in fake.typing  # the typing indicator was shown while it answered
    conv = await daemon.store.active_conversation(f"discord:{ADA}", str(channel), "discord")
    assert [m.content for m in await daemon.store.list_messages(conv.id) if m.role == "user"] == [
        "my name is Ada", "what is my name?"]


async def test_unknown_user_gets_a_pairing_code_and_after_approval_a_reply(fake, daemon_with):
    model = ScriptedModel(lambda m: "hello friend")
    daemon, _ = await daemon_with(model)
    first = await dm(fake, BOB, "hi")
    codes = await daemon.store.list_pairing_codes()
    assert [c.user for c in codes] == [f"discord:{BOB}"]
    assert "pairing code" in first and codes[0].code in first
    assert model.prompts == []  # nothing reached the model
    assert await daemon.store.approve_pairing(codes[0].code) is not None
    assert await dm(fake, BOB, "hi again") == "hello friend"


async def test_in_a_guild_channel_only_mentions_are_answered_without_the_mention(fake, daemon_with):
    model = ScriptedModel(echo)
    await daemon_with(model)
    channel = fake.guild_channel_id
    fake.send_guild_message(ADA, "just chatting with friends")
    fake.send_guild_message(BOB, "hey bot, pair me", mention=True)  # a group: no pairing code there
    fake.send_guild_message(ADA, "what is 2+2?", mention=True)
    await until(lambda: fake.texts(channel))
    assert fake.texts(channel) == ["re: what is 2+2?"]
    assert [last_user(p) for p in model.prompts] == ["what is 2+2?"]


async def test_the_bot_ignores_its_own_and_other_bots_messages(fake, daemon_with):
    model = ScriptedModel(echo)
    await daemon_with(model)
    assert await dm(fake, ADA, "hello") == "re: hello"  # Discord echoes this reply to the bot
    fake.send_dm(OTHER_BOT, "I am a bot, answer me", bot=True)
    fake.send_guild_message(OTHER_BOT, "bots talking to bots", mention=True, bot=True)
    # messages are handed over in arrival order, so once this is answered the others were seen
    assert await dm(fake, ADA, "still there?") == "re: still there?"
    assert [last_user(p) for p in model.prompts] == ["hello", "still there?"]
    assert fake.texts(fake.dm_channel_id(OTHER_BOT)) == []
    assert fake.texts(fake.guild_channel_id) == []


async def test_a_10000_character_reply_with_code_is_sent_in_pieces_of_at_most_2000(fake, daemon_with):
    code = "\n".join(f"    total += step({i})  # accumulate the {i}th term of the series" for i in range(90))
    prose = " ".join(f"Sentence {i} explains one more detail of the answer." for i in range(90))
    reply = f"{prose}\n\n```python\ndef compute():\n    total = 0\n{code}\n    return total\n```\n\n{prose}"
    assert len(reply) > 10_000
    await daemon_with(ScriptedModel(lambda m: reply, chunk=500))
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "explain with code")
    expected = len(chunk_text(reply, 2000))
    await until(lambda: len(fake.texts(channel)) == expected)
    pieces = fake.texts(channel)
    assert expected >= 6 and all(len(p) <= 2000 for p in pieces)
    for piece in pieces:  # each renders on its own: every opened fence is closed
        assert sum(line.strip().startswith("```") for line in piece.split("\n")) % 2 == 0
    squash = lambda s: re.sub(r"```\w*|\s+", "", s)  # noqa: E731 - text without fences and spacing
    assert squash("\n".join(pieces)) == squash(reply)  # nothing lost, nothing reordered


# ---- files and media ----------------------------------------------------------------------------


async def test_a_file_is_saved_in_the_senders_workspace_and_the_agent_is_told_its_name(
        fake, daemon_with):
    daemon, _ = await daemon_with(ScriptedModel(echo))
    first = Upload("report v1.pdf", b"%PDF first", "application/pdf")
    assert await dm(fake, ADA, "summarise this", files=[first]) == (
        "re: summarise this\n\n[attached files, in your workspace: report v1.pdf]")
    second = Upload("report v1.pdf", b"%PDF second", "application/pdf")
    assert await dm(fake, ADA, "", files=[second]) == (  # a file alone, without a word
        "re: [attached files, in your workspace: report v1-1.pdf]")
    files = workspace(daemon, ADA)
    assert (files / "report v1.pdf").read_bytes() == b"%PDF first"  # never overwritten
    assert (files / "report v1-1.pdf").read_bytes() == b"%PDF second"
    assert len(fake.cdn_requests) == 2


async def test_in_a_guild_only_a_file_sent_with_a_mention_is_downloaded(fake, daemon_with):
    daemon, _ = await daemon_with(ScriptedModel(echo))
    fake.send_guild_message(ADA, "look at this", files=[Upload("chatter.txt", b"not for the bot")])
    fake.send_guild_message(ADA, "", mention=True, files=[Upload("notes.txt", b"for the bot", "text/plain")])
    await until(lambda: fake.texts(fake.guild_channel_id))
    assert fake.texts(fake.guild_channel_id) == ["re: [attached files, in your workspace: notes.txt]"]
    assert sorted(p.name for p in workspace(daemon, ADA).iterdir()) == ["notes.txt"]
    assert len(fake.cdn_requests) == 1


async def test_a_strangers_file_is_never_downloaded_and_they_get_a_pairing_code(
        fake, daemon_with, tmp_path):
    model = ScriptedModel(echo)
    daemon, _ = await daemon_with(model)
    files = [Upload("payload.bin", b"x" * 100), Upload("face.png", b"\x89PNG", "image/png")]
    assert "pairing code" in await dm(fake, BOB, "", files=files)
    await daemon.gateway.outbox.wait_delivered()
    assert len(fake.texts(fake.dm_channel_id(BOB))) == 1  # no "cannot open an image" after it
    assert fake.cdn_requests == [] and model.prompts == []
    assert list(tmp_path.rglob("payload.bin")) == []


async def test_a_file_over_the_size_limit_is_not_downloaded_and_the_agent_is_told(
        fake, daemon_with, tmp_path):
    # The limit comes from the config: 10 bytes, written in MB (exact: a power-of-two fraction).
    daemon, _ = await daemon_with(ScriptedModel(echo), discord_extra=f"max_file_mb = {10 / 2**20!r}")
    assert await dm(fake, ADA, "", files=[Upload("big.bin", b"x" * 11)]) == (
        "re: [The user sent the file 'big.bin' (11 bytes), too big for me to download: the limit "
        "is 10 bytes.]")
    assert fake.cdn_requests == [] and list(tmp_path.rglob("big.bin")) == []
    assert await dm(fake, ADA, "", files=[Upload("fits.bin", b"x" * 10)]) == (
        "re: [attached files, in your workspace: fits.bin]")  # the limit itself is allowed
    assert (workspace(daemon, ADA) / "fits.bin").read_bytes() == b"x" * 10


async def test_images_sound_and_video_are_answered_as_not_supported_yet(fake, daemon_with):
    model = ScriptedModel(echo)
    daemon, _ = await daemon_with(model)
    assert await dm(fake, ADA, "", files=[Upload("cat.png", b"\x89PNG", "image/png")]) == (
        "Sorry, I cannot open an image yet: I read text messages and documents. "
        "Please type your message.")
    assert await dm(fake, ADA, "", sticker="wave") == (
        "Sorry, I cannot open a sticker yet: I read text messages and documents. Please type your message.")
    assert await dm(fake, ADA, "hi", sticker="wave") == (
        "re: [The user sent a sticker, which I cannot open yet.]\n\nhi")
    voice = Upload("voice-message.ogg", b"OggS", "audio/ogg", voice=True)
    assert (await dm(fake, ADA, "", files=[voice])).startswith("Sorry, I cannot open a voice note yet")
    clip = Upload("clip.mp4", b"\x00\x00\x00\x18ftyp", "video/mp4")
    assert await dm(fake, ADA, "what is this?", files=[clip]) == (  # the text is still answered
        "re: [The user sent a video, which I cannot open yet.]\n\nwhat is this?")
    mixed = [Upload("a.jpg", b"\xff\xd8", "image/jpeg"), Upload("song.mp3", b"ID3", "audio/mpeg"),
             Upload("notes.txt", b"hello", "text/plain; charset=utf-8")]
    assert await dm(fake, ADA, "", files=mixed) == (  # the document beside them is still fetched
        "re: [The user sent an image and an audio file, which I cannot open yet.]\n\n"
        "[attached files, in your workspace: notes.txt]")
    assert len(model.prompts) == 3  # the notices cost no model turn
    assert [r.path.rsplit("/", 1)[-1] for r in fake.cdn_requests] == ["notes.txt"]
    assert [p.name for p in workspace(daemon, ADA).iterdir()] == ["notes.txt"]


async def test_hostile_file_names_land_inside_the_workspace(fake, daemon_with, tmp_path):
    daemon, _ = await daemon_with(ScriptedModel(echo))
    names = ["../../etc/passwd", "..\\..\\boot.ini", "a/b/c.txt", "nul\x00byte.txt", "é" * 300 + ".txt",
             "..", "passwd"]
    uploads = [Upload(name, f"file {i}".encode()) for i, name in enumerate(names)]
    reply = await dm(fake, ADA, "", files=uploads)
    files = workspace(daemon, ADA)
    saved = {path.read_bytes(): path.name for path in files.iterdir() if path.is_file()}
    assert len(saved) == len(names) and list(files.rglob("*/*")) == []  # all there, all flat
    found = [saved[f"file {i}".encode()] for i in range(len(names))]
    assert found[:4] == ["passwd", "boot.ini", "c.txt", "nulbyte.txt"]
    assert found[4].startswith("éé") and found[4].endswith(".txt") and len(found[4].encode()) <= 120
    assert found[5].startswith("attachment-") and found[6] == "passwd-1"  # nothing overwritten
    assert reply == f"re: [attached files, in your workspace: {', '.join(found)}]"
    assert sorted(p for p in tmp_path.rglob("*") if p.name in ("passwd", "boot.ini")) == [
        files / "boot.ini", files / "passwd"]  # none landed outside


async def test_a_download_that_fails_leaves_no_file_and_the_agent_is_told_why(
        fake, daemon_with, tmp_path):
    await daemon_with(ScriptedModel(echo))
    fake.fail("GET /attachments/*", 404)  # an expired or deleted attachment
    reply = await dm(fake, ADA, "read this", files=[Upload("gone.pdf", b"%PDF", "application/pdf")])
    assert reply == ("re: read this\n\n[The user sent the file 'gone.pdf', but downloading it "
                     "failed: Discord's CDN answered 404 Not Found]")
    assert len(fake.cdn_requests) == 1 and list(tmp_path.rglob("gone.pdf")) == []


async def test_a_file_served_larger_than_its_stated_size_is_cut_off_at_the_limit(
        fake, daemon_with, tmp_path):
    # The message says 5 bytes; the CDN serves 3 MiB. The limit (64 KiB) holds for what is
    # received, not for what was declared, and nothing of it is kept.
    await daemon_with(ScriptedModel(echo), discord_extra="max_file_mb = 0.0625")
    big = Upload("big.bin", b"x" * (3 << 20), declared_size=5)
    assert await dm(fake, ADA, "", files=[big]) == (
        "re: [The user sent the file 'big.bin', too big for me to download: it is over the limit "
        "of 65536 bytes.]")
    assert len(fake.cdn_requests) == 1 and list(tmp_path.rglob("big.bin")) == []


async def test_a_file_whose_link_expired_is_not_fetched_and_the_agent_asks_for_it_again(
        fake, daemon_with, tmp_path):
    await daemon_with(ScriptedModel(echo))
    fake.attachment_url_lifetime = -60  # as for a message answered more than a day after it came
    reply = await dm(fake, ADA, "read this", files=[Upload("old.txt", b"old", "text/plain")])
    assert reply == ("re: read this\n\n[The user sent the file 'old.txt', but downloading it failed: "
                     "its link expired (Discord's file links last about a day); ask the user to "
                     "send the file again.]")
    assert fake.cdn_requests == [] and list(tmp_path.rglob("old.txt")) == []


async def test_a_file_in_a_message_recovered_after_a_restart_is_fetched_before_login(
        fake, daemon_with):
    model = ScriptedModel(echo)
    model.gate = asyncio.Event()  # the first answer never ends: the daemon stops in the middle
    daemon, _ = await daemon_with(model)
    fake.send_dm(ADA, "first")
    await until(lambda: model.prompts)
    fake.send_dm(ADA, "second", files=[Upload("notes.txt", b"hello", "text/plain")])
    await until(lambda: daemon.gateway.queue_length() == 2)  # stored, waiting behind "first"
    await daemon.stop(drain_timeout=0.2)  # both stay unanswered, to be recovered
    # Logging in takes a while (here a 429 on the first try, over the internet hundreds of ms):
    # the recovered turns start before it is done, and the CDN needs no logged-in client.
    fake.fail("GET /users/@me", 429, retry_after=1.0)
    daemon, _ = await daemon_with(ScriptedModel(echo))
    channel = fake.dm_channel_id(ADA)
    await until(lambda: len(fake.texts(channel)) == 2, timeout=15)
    assert fake.texts(channel) == ["re: first",
                                   "re: second\n\n[attached files, in your workspace: notes.txt]"]
    assert (workspace(daemon, ADA) / "notes.txt").read_bytes() == b"hello"


async def test_a_saved_file_belongs_to_the_senders_sandbox_uid_and_their_commands_can_append(
        fake, daemon_with):
    def reply(messages: list[dict]) -> str:
        if messages[-1]["role"] == "tool":
            return "RESULT: " + messages[-1]["content"]
        return ('<tool_call>{"name": "shell", "arguments": {"command": '
                '"echo appended >> notes.txt && cat notes.txt"}}</tool_call>')

    daemon, _ = await daemon_with(ScriptedModel(reply), '[skills]\nenabled = ["shell"]\n')
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "add a line", files=[Upload("notes.txt", b"hello\n", "text/plain")])
    await until(lambda: any(t.startswith("RESULT: ") for t in answers(fake.texts(channel))),
                timeout=15)
    assert answer(fake.texts(channel)[-1]).startswith("RESULT: exit status 0\nstdout:\nhello\nappended")
    principal = daemon.config.policy().principal(f"discord:{ADA}")
    saved = principal.workspace / "notes.txt"
    assert saved.read_bytes() == b"hello\nappended\n"
    if os.geteuid() == 0:  # the daemon wrote it as root: it was handed to the user's sandbox uid
        assert (saved.stat().st_uid, saved.stat().st_gid) == (principal.scope.uid, principal.scope.uid)


# ---- commands -----------------------------------------------------------------------------------


async def test_new_and_stop_typed_as_text(fake, daemon_with):
    model = ScriptedModel(history_echo)
    await daemon_with(model)
    await dm(fake, ADA, "one")
    assert await dm(fake, ADA, "/new") == "Started a new conversation."
    assert await dm(fake, ADA, "two") == "you said 1 things: two"
    model.reply = lambda m: "a long answer " * 20
    model.gate = asyncio.Event()  # the stream stalls after its first chunk
    fake.send_dm(ADA, "tell me everything")
    await until(lambda: len(model.prompts) == 3)
    assert await dm(fake, ADA, "/stop") == "Stopped."
    assert model.aborted
    fake.send_guild_message(ADA, "/new", mention=True)  # in a guild, after the mention
    await until(lambda: fake.texts(fake.guild_channel_id) == ["Started a new conversation."])


async def test_slash_commands_are_registered_and_answered_in_their_interaction(fake, daemon_with):
    model = ScriptedModel(history_echo)
    await daemon_with(model)
    assert sorted(c["name"] for c in fake.commands) == [
        "approve", "audit", "bad", "deny", "good", "heartbeat", "help", "jobs", "memory", "new",
        "private", "remind", "reminders", "run", "sh", "status", "stop"]
    channel = fake.dm_channel_id(ADA)
    await dm(fake, ADA, "one")
    new = fake.slash(ADA, "new")
    await until(lambda: len(fake.texts(channel)) == 2)
    answer = fake.messages[channel][-1]
    assert answer["content"] == "Started a new conversation."
    assert answer["interaction_metadata"]["id"] == new["id"]  # the "thinking..." response, edited
    assert fake.interactions[int(new["id"])]["callback"] == 5  # deferred at once
    assert await dm(fake, ADA, "two") == "you said 1 things: two"
    help_ = fake.slash(ADA, "help", guild=True)  # in a guild, no mention needed
    await until(lambda: fake.texts(fake.guild_channel_id))
    assert "/new" in fake.texts(fake.guild_channel_id)[0]
    assert fake.messages[fake.guild_channel_id][0]["interaction_metadata"]["id"] == help_["id"]
    fake.slash(ADA, "audit")
    await until(lambda: len(fake.texts(channel)) == 4)
    assert fake.texts(channel)[-1] == "No tool calls of yours are on record."
    assert model.prompts and all(last_user(p) in ("one", "two") for p in model.prompts)


async def test_slash_remind_sets_a_reminder_without_the_model(fake, daemon_with):
    model = ScriptedModel(history_echo)
    await daemon_with(model, '[skills]\nenabled = ["clock", "reminders"]\n'
                             '[skills.reminders]\ntimezone = "UTC"')
    remind = next(c for c in fake.commands if c["name"] == "remind")
    assert [(o["name"], o["type"]) for o in remind["options"]] == [("what", 3)]  # a string
    channel = fake.dm_channel_id(ADA)
    fake.slash(ADA, "remind", options={"what": "in 2 hours water the plants"})
    await until(lambda: fake.texts(channel))
    assert fake.texts(channel)[0].startswith("Reminder #1 set for ")
    assert fake.texts(channel)[0].endswith("(in 2 h): water the plants")
    fake.slash(ADA, "reminders")
    await until(lambda: len(fake.texts(channel)) == 2)
    assert fake.texts(channel)[1].splitlines()[1].endswith("UTC: water the plants")
    reminders = next(c for c in fake.commands if c["name"] == "reminders")
    assert [(o["name"], o["type"], o.get("required", False)) for o in reminders["options"]] == [
        ("cancel", 4, False)]  # an optional integer
    fake.slash(ADA, "reminders", options={"cancel": 1})
    await until(lambda: len(fake.texts(channel)) == 3)
    assert fake.texts(channel)[2] == "Cancelled reminder #1: water the plants"
    assert model.prompts == []  # the model was not asked


async def test_slash_sh_and_run_call_skills_without_the_model(fake, daemon_with):
    model = ScriptedModel(history_echo)
    daemon, _ = await daemon_with(model, '[skills]\nenabled = ["clock", "shell"]')
    run = next(c for c in fake.commands if c["name"] == "run")
    assert [(o["name"], o["type"], o.get("required", False)) for o in run["options"]] == [
        ("skill", 3, True), ("arguments", 3, False)]
    channel = fake.dm_channel_id(ADA)
    fake.slash(ADA, "sh", options={"command": "echo from discord > made.txt; cat made.txt"})
    await until(lambda: fake.texts(channel))
    assert "exit status 0" in fake.texts(channel)[0] and "from discord" in fake.texts(channel)[0]
    assert (workspace(daemon, ADA) / "made.txt").read_text() == "from discord\n"
    fake.slash(ADA, "run", options={"skill": "clock", "arguments": "timezone=Asia/Tokyo"})
    await until(lambda: len(fake.texts(channel)) == 2)
    assert "Asia/Tokyo" in fake.texts(channel)[1]
    fake.slash(ADA, "run", options={"skill": "clock"})
    await until(lambda: len(fake.texts(channel)) == 3)
    assert [(r.skill, r.arguments) for r in reversed(await daemon.store.list_audit())] == [
        ("shell", {"command": "echo from discord > made.txt; cat made.txt"}),
        ("clock", {"timezone": "Asia/Tokyo"}), ("clock", {})]
    assert model.prompts == []


async def test_a_late_slash_command_is_answered_in_the_channel_and_its_words_not_logged(
        fake, daemon_with, caplog):
    await daemon_with(ScriptedModel(history_echo), '[skills]\nenabled = ["clock", "reminders"]\n'
                                                   '[skills.reminders]\ntimezone = "UTC"')
    caplog.set_level(logging.INFO)
    fake.expire_interactions = True  # acknowledged too late: Discord forgot the interaction
    channel = fake.dm_channel_id(ADA)
    fake.slash(ADA, "remind", options={"what": "in 2 hours call the dentist"})
    await until(lambda: fake.texts(channel))
    assert fake.texts(channel)[0].endswith("(in 2 h): call the dentist")
    assert "could not acknowledge /remind" in caplog.text
    assert "dentist" not in caplog.text


async def test_slash_stop_aborts_the_answer_and_its_draft_is_not_reused(fake, daemon_with):
    model = ScriptedModel(lambda m: "a long answer " * 20)
    await daemon_with(model, "stream_edits = true")
    model.gate = asyncio.Event()  # the stream stalls after its first chunk, shown as a draft
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "tell me everything")
    await until(lambda: fake.texts(channel) == ["a lo"])
    stop = fake.slash(ADA, "stop")
    await until(lambda: "Stopped." in fake.texts(channel))
    assert fake.interactions[int(stop["id"])]["response_id"] == int(fake.messages[channel][-1]["id"])
    assert model.aborted
    model.gate, model.reply = None, (lambda m: "fresh answer")
    assert await dm(fake, ADA, "again") == "fresh answer"  # a new message, below the others
    assert fake.texts(channel) == ["a lo", "Stopped.", "fresh answer"]


async def test_a_slash_command_nobody_may_answer_leaves_no_thinking_message(fake, daemon_with):
    await daemon_with(ScriptedModel(echo))
    eve = fake.slash(EVE, "status")  # blocked: the gateway drops it without a word
    await until(lambda: fake.interactions[int(eve["id"])].get("deleted"))
    assert fake.texts(fake.dm_channel_id(EVE)) == []


# ---- failures -----------------------------------------------------------------------------------


async def test_a_429_on_sending_is_waited_out_and_the_reply_arrives_once(fake, daemon_with):
    await daemon_with(ScriptedModel(echo))
    fake.fail("POST /channels/*/messages", 429, retry_after=0.8)
    assert await dm(fake, ADA, "hello") == "re: hello"
    refused, sent = fake.requests_to("POST", "/channels/*/messages")
    assert sent.at - refused.at >= 0.8  # it honoured retry-after, then sent the same message
    assert refused.body["content"] == sent.body["content"] == "re: hello"
    assert fake.texts(fake.dm_channel_id(ADA)) == ["re: hello"]


async def test_one_channels_rate_limit_holds_up_no_other_channel(fake, daemon_with):
    """A stranger's pairing code, sent while their message is handed over, waits out a 429 of
    4 s inside discord.py: messages are handed over per channel, so the owner's, in another
    channel, is taken and answered meanwhile; before, every channel waited behind it."""
    await daemon_with(ScriptedModel(echo))
    fake.fail("POST /channels/*/messages", 429, retry_after=4)
    fake.send_dm(BOB, "hi")
    await until(lambda: fake.requests_to("POST", "/channels/*/messages"))  # the code met the 429
    assert await dm(fake, ADA, "hello") == "re: hello"
    assert fake.texts(fake.dm_channel_id(BOB)) == []  # the stranger's code still waits
    await until(lambda: fake.texts(fake.dm_channel_id(BOB)), timeout=20)
    assert "pairing code" in fake.texts(fake.dm_channel_id(BOB))[0]


async def test_a_dropped_websocket_resumes_and_the_message_sent_meanwhile_is_answered_once(
        fake, daemon_with):
    model = ScriptedModel(echo)
    await daemon_with(model)
    assert await dm(fake, ADA, "before") == "re: before"
    fake.drop_websocket()
    fake.send_dm(ADA, "while you were away")  # waits in the session until the client resumes
    channel = fake.dm_channel_id(ADA)
    await until(lambda: len(fake.texts(channel)) == 2)
    assert await dm(fake, ADA, "after") == "re: after"
    assert fake.texts(channel) == ["re: before", "re: while you were away", "re: after"]
    assert (fake.identifies, fake.resumes) == (1, 1)  # a RESUME, not a new session
    assert [last_user(p) for p in model.prompts] == ["before", "while you were away", "after"]


async def test_a_session_discord_forgot_is_replaced_by_a_new_one(fake, daemon_with):
    await daemon_with(ScriptedModel(echo))
    assert await dm(fake, ADA, "before") == "re: before"
    fake.forget_sessions()  # the client's RESUME is refused; it must IDENTIFY again
    await until(lambda: fake.identifies == 2, timeout=15)  # discord.py waits 5 s first, by design
    assert await dm(fake, ADA, "after") == "re: after"


async def test_discord_going_away_and_coming_back(fake, daemon_with, caplog):
    daemon, connector = await daemon_with(ScriptedModel(echo))
    assert await dm(fake, ADA, "before") == "re: before"
    caplog.set_level(logging.INFO, logger="discord")
    await fake.stop()
    await until(lambda: not connector.connected)
    with pytest.raises(Exception):  # noqa: B017 - whichever network error: the gateway retries
        await connector.send_text(str(fake.dm_channel_id(ADA)), "nobody is listening")
    await until(lambda: "Attempting a reconnect" in caplog.text)  # it tried, failed, backs off
    await fake.start()
    await until(lambda: connector.connected, timeout=20)
    assert await dm(fake, ADA, "after") == "re: after"
    assert fake.identifies == 1 and fake.resumes >= 1


async def test_start_does_not_wait_for_discord_and_connects_once_it_is_up(fake, daemon_with):
    await fake.stop()  # the port is known, nothing listens
    started = time.monotonic()
    _, connector = await daemon_with(ScriptedModel(echo))
    assert time.monotonic() - started < 5 and not connector.connected
    await fake.start()
    await until(lambda: connector.connected, timeout=15)
    assert await dm(fake, ADA, "hello") == "re: hello"


async def test_a_server_error_at_login_is_retried(fake, daemon_with):
    fake.fail("GET /users/@me", 503)
    _, connector = await daemon_with(ScriptedModel(echo))
    await until(lambda: connector.connected, timeout=15)
    assert len(fake.requests_to("GET", "/users/@me")) == 2
    assert await dm(fake, ADA, "hello") == "re: hello"


async def test_a_rejected_token_stops_the_start_with_a_clear_error(fake, daemon_with):
    with pytest.raises(DiscordLoginError, match="token was rejected.*discord.token"):
        await daemon_with(ScriptedModel(echo), token="not-the-token")
    assert len(fake.requests_to("GET", "/users/@me")) == 1  # no retrying a bad token
    assert fake.identifies == 0


async def test_a_bot_without_the_message_content_intent_stops_the_start_clearly(fake, daemon_with):
    fake.message_content_intent = False
    with pytest.raises(DiscordLoginError, match="Message Content intent"):
        await daemon_with(ScriptedModel(echo))


# ---- streaming, stopping, endpoints -------------------------------------------------------------


async def test_a_streamed_draft_is_edited_at_most_once_a_second_and_becomes_the_reply(
        fake, daemon_with):
    reply = " ".join(f"word{i}" for i in range(60))
    await daemon_with(ScriptedModel(lambda m: reply, chunk=4, delay=0.03), "stream_edits = true")
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "stream it")
    await until(lambda: fake.texts(channel) == [reply])  # one message: the draft, finished
    draft_id = int(fake.messages[channel][-1]["id"])
    edits = [(text, at) for mid, text, at in fake.edits if mid == draft_id]
    assert len(edits) >= 2 and edits[-1][0] == reply
    for (_, earlier), (_, later) in zip(edits[:-2], edits[1:-1], strict=True):
        assert later - earlier >= 0.95  # rate-limited; only the final edit may come sooner
    assert len(fake.requests_to("POST", "/channels/*/messages")) == 1


async def test_a_draft_discord_refuses_does_not_cost_the_reply(fake, daemon_with):
    model = ScriptedModel(lambda m: "the full answer", chunk=4, delay=0.03)
    await daemon_with(model, "stream_edits = true")
    fake.fail("POST /channels/*/messages", 403)  # the draft's first message is refused
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "stream it")
    await until(lambda: fake.texts(channel) == ["the full answer"])
    assert len(model.prompts) == 1  # one turn, answered, no apology


async def test_a_draft_deleted_before_the_reply_is_sent_anew(fake, daemon_with):
    model = ScriptedModel(lambda m: "the full answer", chunk=4)
    model.gate = asyncio.Event()  # the reply stalls after its first chunk: the draft is shown
    await daemon_with(model, "stream_edits = true")
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "stream it")
    await until(lambda: fake.texts(channel))
    fake.delete_message(channel, int(fake.messages[channel][-1]["id"]))
    model.gate.set()
    await until(lambda: fake.texts(channel) == ["the full answer"])
    assert len(model.prompts) == 1


async def test_a_dm_discord_refuses_for_good_is_not_retried_and_ends_its_reminders(
        fake, daemon_with):
    daemon, _ = await daemon_with(ScriptedModel(echo), '[skills]\nenabled = ["clock", "reminders"]')
    channel = fake.dm_channel_id(ADA)
    now = daemon.store.now()
    elsewhere = await daemon.reminders.add(f"discord:{ADA}", str(fake.guild_channel_id), "standup",
                                           now + timedelta(hours=1), repeat="daily", timezone="UTC")
    daily = await daemon.reminders.add(f"discord:{ADA}", str(channel), "pills",
                                       now + timedelta(hours=2), repeat="daily", timezone="UTC")
    fake.refuse_channel(channel)  # Ada closed her DMs: 403, code 50007
    fake.send_dm(ADA, "hello")
    await until(lambda: fake.requests_to("POST", f"/channels/{channel}/messages"))
    await daemon.gateway.wait_idle()
    assert daemon.gateway.outbox.backlog == 0  # marked failed, no retry scheduled
    assert await daemon.store.pending_outbound() == []
    active = await daemon.store.active_reminders()
    assert [r.id for r in active] == [elsewhere.id] and daily.id != elsewhere.id
    await asyncio.sleep(0.3)
    assert len(fake.requests_to("POST", f"/channels/{channel}/messages")) == 1


@pytest.mark.parametrize("status, code", [
    (400, 50035),  # this message is invalid, the chat is fine
    (403, 50013),  # Missing Permissions: a moderator's time-out, for a while
])
async def test_a_message_discord_refuses_leaves_the_chats_reminders_alone(fake, daemon_with, status,
                                                                          code):
    daemon, connector = await daemon_with(ScriptedModel(echo), '[skills]\nenabled = ["clock", "reminders"]')
    channel = fake.dm_channel_id(ADA)
    daily = await daemon.reminders.add(f"discord:{ADA}", str(channel), "pills",
                                       daemon.store.now() + timedelta(hours=2), repeat="daily",
                                       timezone="UTC")
    fake.refuse_channel(channel, status, code, "refused")
    fake.send_dm(ADA, "hello")
    await until(lambda: fake.requests_to("POST", f"/channels/{channel}/messages"))
    await daemon.gateway.wait_idle()
    assert daemon.gateway.outbox.backlog == 0 and await daemon.store.pending_outbound() == []
    assert [r.id for r in await daemon.store.active_reminders()] == [daily.id]
    del fake.refused[channel]
    assert await dm(fake, ADA, "again") == "re: again"  # and the chat still works


async def test_stop_closes_the_client_promptly(fake, daemon_with):
    daemon, connector = await daemon_with(ScriptedModel(echo))
    assert await dm(fake, ADA, "hello") == "re: hello"
    started = time.monotonic()
    await connector.stop()
    assert time.monotonic() - started < 2
    assert not connector.connected
    await until(lambda: fake.connections == 0, timeout=2)


async def test_two_connectors_in_one_process_each_use_their_own_server(fake):
    other = FakeDiscord(token="other-token")
    await other.start()
    connectors = []

    def answering(connector: DiscordConnector, label: str):
        async def handler(msg: InboundMessage) -> None:
            await connector.send_text(msg.chat_id, f"{label} got {msg.text}")
        return handler

    try:
        for server, label in ((fake, "first"), (other, "second")):
            connector = DiscordConnector(server.token, api_base=server.api_base,
                                         gateway_url=server.gateway_url)
            connectors.append(connector)
            await connector.start(answering(connector, label))
        fake.send_dm(ADA, "ping")
        other.send_dm(ADA, "pong")
        await until(lambda: fake.texts(fake.dm_channel_id(ADA)) and other.texts(other.dm_channel_id(ADA)))
        assert fake.texts(fake.dm_channel_id(ADA)) == ["first got ping"]
        assert other.texts(other.dm_channel_id(ADA)) == ["second got pong"]
    finally:
        for connector in connectors:
            await connector.stop()
        await other.stop()


async def test_a_tool_call_is_approved_with_the_slash_command(fake, daemon_with, tmp_path):
    def reply(messages: list[dict]) -> str:
        if messages[-1]["role"] == "tool":
            return "RESULT: " + messages[-1]["content"]
        return '<tool_call>{"name": "shell", "arguments": {"command": "echo ok > proof.txt"}}</tool_call>'

    daemon, _ = await daemon_with(ScriptedModel(reply), '[skills]\nenabled = ["shell"]\n'
                                  '[roles.admin]\napproval = ["shell"]\n')
    approve = next(c for c in fake.commands if c["name"] == "approve")
    assert [o["name"] for o in approve["options"]] == ["number"] and approve["options"][0]["type"] == 4
    channel = fake.dm_channel_id(ADA)
    fake.send_dm(ADA, "make a proof")
    await until(lambda: any("/approve" in t for t in fake.texts(channel)))
    number = int(fake.texts(channel)[-1].split("/approve ")[1].split()[0])
    fake.slash(ADA, "approve", options={"number": number})
    await until(lambda: answer(fake.texts(channel)[-1]).startswith("RESULT: exit status 0"))
    assert (daemon.config.policy().principal(f"discord:{ADA}").workspace / "proof.txt").exists()


async def test_discord_slash_commands_in_two_channels_each_answered_in_their_interaction(
        fake):
    """Each channel's hand-over runs in a context of its own: the slash command being answered
    (`_replying`) is its channel's. Shared, A's reset wiped B's interaction (both answers went
    out plainly, both "thinking..." responses deleted) and left A's stale one behind."""
    connector = DiscordConnector(fake.token, api_base=fake.api_base, gateway_url=fake.gateway_url)
    gates: dict[str, asyncio.Event] = {}
    entered: set[str] = set()

    async def handler(msg: InboundMessage) -> None:
        gate = gates.setdefault(msg.chat_id, asyncio.Event())
        entered.add(msg.chat_id)
        await gate.wait()
        await connector.send_text(msg.chat_id, f"answer for {msg.user_id}")

    await connector.start(handler)
    try:
        chat_a, chat_b = str(fake.dm_channel_id(ADA)), str(fake.dm_channel_id(BOB))
        a = fake.slash(ADA, "help")
        await until(lambda: chat_a in entered)
        b = fake.slash(BOB, "help")
        await until(lambda: chat_b in entered)
        gates[chat_a].set()
        await until(lambda: fake.texts(int(chat_a)))
        await asyncio.sleep(0.1)
        gates[chat_b].set()
        await until(lambda: fake.texts(int(chat_b)))
        await asyncio.sleep(0.3)  # the hand-over's close() of B's reply
        answered = {name: [m for m in fake.messages[int(chat)]
                           if m.get("interaction_metadata", {}).get("id") == slash["id"]]
                    for name, chat, slash in (("A", chat_a, a), ("B", chat_b, b))}
        deleted = {name: bool(fake.interactions[int(slash["id"])].get("deleted"))
                   for name, slash in (("A", a), ("B", b))}
        # Each answer edits its own command's "thinking..." response, which stays.
        assert {k: len(v) for k, v in answered.items()} == {"A": 1, "B": 1}, (answered, deleted)
        assert deleted == {"A": False, "B": False}
    finally:
        await connector.stop()


async def test_messages_taken_but_not_yet_handed_over_are_handed_over_at_stop(fake):
    """Discord never delivers a message again: those still queued in a channel's inbox when the
    connector stops are handed over first (the gateway keeps them, even while it stops), not
    dropped with the inbox."""
    connector = DiscordConnector(fake.token, api_base=fake.api_base, gateway_url=fake.gateway_url)
    handed: list[str] = []
    first = asyncio.Event()

    async def handler(msg: InboundMessage) -> None:  # as slow as a busy store
        first.set()
        await asyncio.sleep(0.05)
        handed.append(msg.text)

    await connector.start(handler)
    try:
        for n in range(8):
            fake.send_dm(ADA, f"message {n}")
        await until(lambda: first.is_set())
        await until(lambda: len(connector._inboxes.get(str(fake.dm_channel_id(ADA)), [])) >= 3)
    finally:
        await connector.stop()
    assert handed == [f"message {n}" for n in range(8)]
