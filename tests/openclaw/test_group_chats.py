"""Two admitted users and a stranger in one group chat (real daemon, gateway, agent and SQLite,
scripted model): each user's turn, approval, /stop, /new and reminders stay their own, and the
stranger gets nothing at all."""

from __future__ import annotations

import re

from openclaw.config import load_config
from openclaw.daemon import Daemon
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.replies import answers
from tests.helpers.scripted_model import ScriptedModel
from tests.helpers.waiting import until

GROUP = "group-7"


def group(text: str, user: str):
    """`text` from Telegram user `user` (a numeric id) in the group."""
    return msg(text, user=user, chat=GROUP, channel="telegram", is_group=True)


def reply(prompt: list[dict]) -> str:
    last = prompt[-1]
    if last["role"] == "user" and "SECRET-A" in last["content"]:
        return ('<tool_call>{"name": "files", "arguments": {"action": "write", "path": "a.txt", '
                '"content": "from A"}}</tool_call>')
    return "seen: " + " | ".join(m["content"] for m in prompt if m["role"] == "user")


async def test_users_in_one_group_cannot_act_for_each_other(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(f"""
data_dir = "{tmp_path / 'data'}"
[access]
allow = ["telegram:1", "telegram:2"]
[admin]
enabled = false
[skills]
enabled = ["clock", "files", "reminders"]
[skills.reminders]
timezone = "UTC"
[roles.user]
approval = ["files"]
""")
    model = ScriptedModel(reply)
    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(path), model=model, connectors=[conn])
    await daemon.start()
    try:
        async def answer(text: str, user: str) -> str:
            before = len(conn.sent)
            await conn.handler(group(text, user))
            await until(lambda: len(conn.sent) > before)
            return conn.sent[-1][1]

        prompt = await answer("please SECRET-A", "1")  # A's turn now waits for A's approval
        number = re.search(r"/approve (\d+)", prompt)[1]
        for text in (f"/approve {number}", f"/deny {number}"):
            assert "waiting for you" in await answer(text, "2")
        assert await answer("/stop", "2") == "Nothing to stop."
        await daemon.store.add_usage("telegram:2", 1, 1)
        assert "everyone" not in await answer("/status", "2")
        before = len(conn.sent)
        for text in (f"/approve {number}", "/status", "hello"):  # a stranger: not even a code
            await conn.handler(group(text, "3"))
        await answer("/remind in 20 minutes B-PRIVATE-THING", "2")
        assert [t for _, t in conn.sent[before:]] == [conn.sent[-1][1]]  # only B's reminder
        assert "B-PRIVATE-THING" in conn.sent[-1][1]
        assert await daemon.store.list_pairing_codes() == []

        await conn.handler(group(f"/approve {number}", "1"))
        await until(lambda: any(t.startswith("seen: please SECRET-A")
                                 for t in answers(conn.texts(GROUP))))
        written = list((tmp_path / "data").rglob("a.txt"))
        assert [p.read_text() for p in written] == ["from A"] and written[0].parent.name == "telegram-1"

        assert "B-PRIVATE-THING" not in await answer("/reminders", "1")
        a_conversation = (await daemon.store.active_conversation("telegram:1", GROUP, "telegram")).id
        await answer("/new", "2")
        assert (await daemon.store.active_conversation("telegram:1", GROUP, "telegram")).id == \
            a_conversation  # B's /new archived B's conversation only
        assert (await answer("hello from B", "2")) == "seen: hello from B"
        assert "seen: please SECRET-A | hello again" == await answer("hello again", "1")
        assert not any("SECRET-A" in m["content"] for p in model.prompts
                       if any("from B" in m["content"] for m in p) for m in p)
    finally:
        await daemon.stop()
