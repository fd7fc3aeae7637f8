"""Many users at once, on Telegram and Discord together: the real daemon (real SQLite store,
gateway, agent), the real python-telegram-bot and discord.py clients against the local fakes, and
a scripted model. Every message is answered exactly once, in its own chat, in order per chat;
nobody's prompt holds anyone else's words; a restart in the middle of it loses nothing and
answers nothing twice."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from connectors.telegram import Backoff, TelegramConnector
from openclaw.channels import configured_connectors
from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.telegram_api import FakeTelegram
from tests.helpers.scripted_model import ScriptedModel

pytestmark = pytest.mark.filterwarnings("ignore:.*retry_after.*:DeprecationWarning")

TG_USERS = [3001 + i for i in range(12)]
DC_USERS = [1_400_000_000_000_000_001 + i for i in range(12)]
TG_GROUP = -100700
TAG = re.compile(r"<(\w+@-?\w+)#(\d+)>")


async def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def reply(prompt: list[dict]) -> str:
    """Names every message of the prompt's history by its tag: what the model was shown."""
    tags = [t for m in prompt if m["role"] == "user" for t in TAG.findall(m["content"])]
    last = tags[-1]
    return f"answer to <{last[0]}#{last[1]}> having seen " + ",".join(f"{w}#{n}" for w, n in tags)


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.tg, self.dc = FakeTelegram(), FakeDiscord()
        self.daemon: Daemon | None = None

    async def start(self, model: ScriptedModel) -> Daemon:
        path = self.tmp_path / "openclaw.toml"
        path.touch(mode=0o600)
        users = [f'"telegram:{u}"' for u in TG_USERS] + [f'"discord:{u}"' for u in DC_USERS]
        path.write_text(f"""
data_dir = "{self.tmp_path / 'data'}"
[access]
allow = [{", ".join(users)}]
[admin]
enabled = false
[telegram]
enabled = true
token = "{self.tg.token}"
base_url = "{self.tg.base_url}"
base_file_url = "{self.tg.base_file_url}"
[discord]
enabled = true
token = "{self.dc.token}"
api_base = "{self.dc.api_base}"
gateway_url = "{self.dc.gateway_url}"
""")
        config = load_config(path)
        connectors = [c for c in configured_connectors(config) if c.name == "discord"]
        connectors.append(TelegramConnector(self.tg.token, base_url=self.tg.base_url,
                                            base_file_url=self.tg.base_file_url, poll_timeout=5,
                                            backoff=Backoff(0.05, 0.4)))
        self.daemon = Daemon(config, model=model, connectors=connectors)
        await self.daemon.start()
        await until(lambda: self.tg.polls_waiting)
        return self.daemon


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    await w.tg.start()
    await w.dc.start()
    yield w
    if w.daemon is not None:
        await w.daemon.stop(drain_timeout=1)
    await w.dc.stop()
    await w.tg.stop()


def send_all(w: World, rounds: range) -> dict[tuple[str, int], list[str]]:
    """Each user writes in their DM and in the group, `rounds` times; the tags sent, per chat."""
    sent: dict[tuple[str, int], list[str]] = defaultdict(list)
    for n in rounds:
        for u in TG_USERS:
            tag = f"t{u}@dm#{n}"
            w.tg.send(f"hello <{tag}>", user=u)
            sent[("tg", u)].append(tag)
            tag = f"t{u}@grp#{n}"
            w.tg.send(f"@{w.tg.username} hi <{tag}>", user=u, chat=TG_GROUP)
            sent[("tg", TG_GROUP)].append(tag)
        for u in DC_USERS:
            tag = f"d{u}@dm#{n}"
            w.dc.send_dm(u, f"hello <{tag}>")
            sent[("dc", w.dc.dm_channel_id(u))].append(tag)
            tag = f"d{u}@grp#{n}"
            w.dc.send_guild_message(u, f"hi <{tag}>", mention=True)
            sent[("dc", w.dc.guild_channel_id)].append(tag)
    return sent


def answers(w: World) -> dict[tuple[str, int], list[str]]:
    got: dict[tuple[str, int], list[str]] = {}
    for u in TG_USERS + [TG_GROUP]:
        got[("tg", u)] = w.tg.texts(u)
    for u in DC_USERS:
        got[("dc", w.dc.dm_channel_id(u))] = w.dc.texts(w.dc.dm_channel_id(u))
    got[("dc", w.dc.guild_channel_id)] = w.dc.texts(w.dc.guild_channel_id)
    return got


def check(sent, got, model: ScriptedModel) -> None:
    for chat, tags in sent.items():
        answered = [TAG.search(t).group(0)[1:-1] for t in got[chat]]
        # Exactly once each, in this chat, and per sender in the order sent.
        assert Counter(answered) == Counter(tags), (chat, answered, tags)
        by_sender = defaultdict(list)
        for tag in answered:
            by_sender[tag.split("#")[0]].append(int(tag.split("#")[1]))
        for numbers in by_sender.values():
            assert numbers == sorted(numbers), (chat, answered)
    # Nobody's prompt held another conversation's words.
    for prompt in model.prompts:
        tags = {w for m in prompt if m["role"] == "user" for w, _ in TAG.findall(m["content"])}
        assert len(tags) == 1, tags
    for chat, texts in got.items():  # and nobody's answer named another's history
        for text in texts:
            seen = {w.split("#")[0] for w in text.split("having seen ")[1].split(",")}
            assert len(seen) == 1, (chat, text)


async def test_many_users_on_two_services_each_answered_once_in_their_own_chat(world):
    model = ScriptedModel(reply, delay=0.001)
    await world.start(model)
    sent = send_all(world, range(2))
    total = sum(map(len, sent.values()))
    await until(lambda: sum(map(len, answers(world).values())) >= total)
    await world.daemon.gateway.wait_idle()
    check(sent, answers(world), model)


async def test_a_restart_in_the_middle_of_many_users_loses_and_repeats_nothing(world):
    slow = ScriptedModel(reply)
    slow.gate = asyncio.Event()  # every answer hangs after its first chunk: the stop cuts them
    await world.start(slow)
    sent = send_all(world, range(2))
    await until(lambda: len(slow.prompts) >= 20)
    await world.daemon.stop(drain_timeout=0.2)
    model = ScriptedModel(reply)
    await world.start(model)
    more = send_all(world, range(2, 3))
    for chat, tags in more.items():
        sent[chat] += tags
    total = sum(map(len, sent.values()))
    await until(lambda: sum(map(len, answers(world).values())) >= total)
    await world.daemon.gateway.wait_idle()
    check(sent, answers(world), model)


async def test_a_discord_message_that_comes_while_the_daemon_drains_is_answered_after_the_restart(
        world):
    """Discord never delivers a message again: one refused while the daemon drains its running
    turns (up to 30 s at a `systemctl restart`) was lost. It is stored, and answered after it."""
    held = ScriptedModel(reply)
    held.gate = asyncio.Event()
    await world.start(held)
    first, late = DC_USERS[0], DC_USERS[1]
    world.dc.send_dm(first, f"hello <d{first}@dm#0>")
    await until(lambda: held.prompts)  # a turn runs, and holds the drain
    stopping = asyncio.create_task(world.daemon.stop(drain_timeout=30))
    await until(lambda: not world.daemon.gateway.lanes.accepting)
    world.dc.send_dm(late, f"hello <d{late}@dm#0>")
    store = world.daemon.store

    async def stored() -> bool:
        return any(e.user == f"discord:{late}" for e in await store.pending_inbound())

    deadline = time.monotonic() + 10
    while not await stored():
        assert time.monotonic() < deadline, "the message that came during the drain was not stored"
        await asyncio.sleep(0.02)
    held.gate.set()
    await stopping
    model = ScriptedModel(reply)
    await world.start(model)
    channel = world.dc.dm_channel_id(late)
    await until(lambda: world.dc.texts(channel))
    await world.daemon.gateway.wait_idle()
    assert world.dc.texts(channel) == [f"answer to <d{late}@dm#0> having seen d{late}@dm#0"]
    assert len(world.dc.texts(world.dc.dm_channel_id(first))) == 1
