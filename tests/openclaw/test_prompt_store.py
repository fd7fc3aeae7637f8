"""The prompt library's store (openclaw/store/prompts.py) and labels (openclaw/prompts/labels.py):
versions immutable and chained by parent, settings and pins checked against what is stored, the
snapshot a turn reads kept without a store round trip. A real store on SQLite (and PostgreSQL
where the machine runs one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy
from alembic import command
from sqlalchemy import event

from openclaw.prompts import make_label, parse_label
from openclaw.store import Store
from openclaw.store.migrate import alembic_config
from openclaw.store.prompts import (
    PromptSetting,
    PromptVersionConflict,
    UnknownPromptVersion,
    version_key,
)
from tests.helpers.store import fresh_store, left_at_revision

ADA = "telegram:1001"


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path):
    async with fresh_store(request, tmp_path) as opened:
        yield opened


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}"


# -- labels ---------------------------------------------------------------------------------------

def test_a_label_names_each_prompt_sorted_and_parses_back():
    label = make_label({"tools": "builtin", "system": "v3"})
    assert label == "system=v3;tools=builtin"
    assert parse_label(label) == {"system": "v3", "tools": "builtin"}
    assert parse_label("") == {}


@pytest.mark.parametrize("bad", ["system", "system=", "=v3", "system=v3;system=v4", "a=b=c",
                                 "system=v3;"])
def test_text_that_is_not_a_label_is_refused(bad: str):
    with pytest.raises(ValueError, match="not a prompt label"):
        parse_label(bad)


def test_a_version_that_would_break_the_label_is_refused():
    with pytest.raises(ValueError, match="'='"):
        make_label({"system": "v=3"})


# -- versions -------------------------------------------------------------------------------------

async def test_versions_chain_to_the_latest_earlier_one_in_natural_order(store: Store):
    added = await store.add_prompt_versions(
        [("system", "v10", "ten"), ("system", "v2", "two"), ("system", "v1", "one"),
         ("tools", "v1", "tools {tools}")], author="ada")
    assert all(new for _, new in added)
    by = {(v.name, v.version): v for v, _ in added}
    assert by["system", "v1"].parent_id is None
    assert by["system", "v2"].parent_id == by["system", "v1"].id
    assert by["system", "v10"].parent_id == by["system", "v2"].id
    assert by["tools", "v1"].parent_id is None  # another name's versions are not its parents
    assert [v.version for v in await store.prompt_versions("system")] == ["v1", "v2", "v10"]
    assert {v.author for v in await store.prompt_versions()} == {"ada"}
    # A version added later between two stored ones chains to the one before it.
    (v3, _), = await store.add_prompt_versions([("system", "v3", "three")], author="bob")
    assert v3.parent_id == by["system", "v2"].id


async def test_the_same_text_again_is_a_no_op_and_another_text_is_refused_storing_nothing(
        store: Store):
    await store.add_prompt_versions([("system", "v1", "be brief")], author="ada")
    again = await store.add_prompt_versions([("system", "v1", "be brief")], author="bob")
    assert [(v.author, new) for v, new in again] == [("ada", False)]
    with pytest.raises(PromptVersionConflict, match="system v1 is stored already"):
        await store.add_prompt_versions([("system", "v2", "new"), ("system", "v1", "changed")],
                                        author="bob")
    versions = await store.prompt_versions()
    assert [(v.version, v.text) for v in versions] == [("v1", "be brief")]  # v2 not stored either


@pytest.mark.parametrize(("name", "version"), [("System", "v1"), ("system", "v;1"),
                                               ("system", "v=1"), ("system", ""), ("", "v1")])
async def test_names_and_versions_a_label_cannot_hold_are_refused(store: Store, name, version):
    with pytest.raises(ValueError, match="prompt (name|version)"):
        await store.add_prompt_versions([(name, version, "text")], author="ada")
    assert await store.prompt_versions() == []


@pytest.mark.parametrize("author", ["", "a" * 129])
async def test_an_author_the_column_cannot_hold_is_refused(store: Store, author: str):
    with pytest.raises(ValueError, match="author is 1 to 128 characters"):
        await store.add_prompt_versions([("system", "v1", "text")], author=author)
    assert await store.prompt_versions() == []


def test_natural_version_order():
    assert sorted(["v10", "v9", "v1b", "v1", "beta"], key=version_key) == \
        ["beta", "v1", "v1b", "v9", "v10"]


# -- settings and pins ----------------------------------------------------------------------------

async def test_activate_ab_and_pins_name_only_stored_versions(store: Store):
    await store.add_prompt_versions([("system", "v1", "one"), ("system", "v2", "two")], "ada")
    with pytest.raises(UnknownPromptVersion, match=r"no version v9 \(stored: v1, v2\)"):
        await store.activate_prompt("system", "v9")
    with pytest.raises(UnknownPromptVersion, match="no version v3"):
        await store.set_prompt_variants("system", {"v1": 50, "v3": 50})
    with pytest.raises(UnknownPromptVersion, match=r"stored: none"):
        await store.pin_prompt(ADA, "tools", "v1")
    for weights in ({"v1": 0, "v2": 1}, {"v1": -1, "v2": 1}, {"v1": 1.5, "v2": 1}, {}):
        with pytest.raises(ValueError, match="positive whole numbers"):
            await store.set_prompt_variants("system", weights)
    with pytest.raises(ValueError, match="not of the form"):
        await store.pin_prompt("ada", "system", "v1")
    assert await store.prompt_settings() == {}
    assert await store.prompt_pins() == {}


async def test_activating_ends_the_split_and_keeps_the_pins(store: Store):
    await store.add_prompt_versions([("system", "v1", "one"), ("system", "v2", "two")], "ada")
    assert await store.activate_prompt("system", "v1") == PromptSetting("system")
    assert await store.set_prompt_variants("system", {"v1": 1, "v2": 3}) == \
        PromptSetting("system", "v1")
    assert await store.pin_prompt(ADA, "system", "v2") is None
    assert (await store.prompt_settings())["system"] == PromptSetting("system", "v1",
                                                                      {"v1": 1, "v2": 3})
    before = await store.activate_prompt("system", "v2")
    assert before == PromptSetting("system", "v1", {"v1": 1, "v2": 3})
    assert (await store.prompt_settings())["system"] == PromptSetting("system", "v2")
    assert await store.prompt_pins() == {(ADA, "system"): "v2"}
    snapshot = await store.prompt_snapshot(max_age_s=0)  # on either backend
    assert snapshot.texts == {("system", "v2"): "two"}  # only the version in use
    assert snapshot.pins == {(ADA, "system"): "v2"}
    assert await store.pin_prompt(ADA, "system", "v1") == "v2"
    assert await store.unpin_prompt(ADA, "system") is True
    assert await store.unpin_prompt(ADA, "system") is False
    await store.set_prompt_variants("system", {"v1": 1, "v2": 1})
    await store.set_prompt_variants("system", None)  # `ab NAME off`
    assert (await store.prompt_settings())["system"] == PromptSetting("system", "v2")


# -- the snapshot a turn reads --------------------------------------------------------------------

def count_statements(store: Store) -> list[str]:
    seen: list[str] = []
    event.listen(store.engine.sync_engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: seen.append(statement))
    return seen


async def test_the_snapshot_is_kept_and_this_processs_writes_drop_it(sqlite_url: str):
    async with await Store.open(sqlite_url) as daemon, await Store.open(sqlite_url) as cli:
        await cli.add_prompt_versions([("system", "v1", "one"), ("system", "v2", "two")], "ada")
        await cli.activate_prompt("system", "v1")
        first = await daemon.prompt_snapshot()
        assert first.settings["system"].active == "v1"
        assert first.texts == {("system", "v1"): "one"}  # only the versions in use

        statements = count_statements(daemon)
        await cli.pin_prompt(ADA, "system", "v2")  # another process's write
        assert await daemon.prompt_snapshot() is first  # kept: no round trip for the turn
        assert statements == []
        fresh = await daemon.prompt_snapshot(max_age_s=0)  # once old enough, read again
        assert statements and fresh.pins == {(ADA, "system"): "v2"}
        assert fresh.texts == {("system", "v1"): "one", ("system", "v2"): "two"}

        await daemon.activate_prompt("system", "v2")  # its own write: seen at once
        assert (await daemon.prompt_snapshot()).settings["system"].active == "v2"
        daemon.forget_prompt_snapshot()  # what a reload does
        assert await daemon.prompt_snapshot() is not fresh


# -- messages and the migration -------------------------------------------------------------------

async def test_an_assistant_message_keeps_its_label(store: Store):
    await store.ensure_user("telegram", "1001")
    conv = await store.active_conversation(ADA, "1001")
    await store.add_message(conv.id, "user", "hi")
    stored = await store.add_message(conv.id, "assistant", "hello",
                                     prompt_version="system=v1;tools=builtin")
    assert stored.prompt_version == "system=v1;tools=builtin"
    assert [m.prompt_version for m in await store.list_messages(conv.id)] == \
        [None, "system=v1;tools=builtin"]


async def test_upgrade_to_0012_keeps_the_messages_and_a_downgrade_removes_the_library(
        sqlite_url: str):
    await left_at_revision(sqlite_url, "0011", (
        "INSERT INTO users (channel, external_id, status, created_at, updated_at) "
        "VALUES ('telegram', '1001', 'allowed', '2025-01-01 00:00:00', '2025-01-01 00:00:00')", ()),
        ("INSERT INTO conversations (user_id, channel, chat_id, status, created_at, updated_at) "
         "VALUES (1, 'telegram', '1001', 'active', '2025-01-01 00:00:00', "
         "'2025-01-01 00:00:00')", ()),
        ("INSERT INTO messages (conversation_id, role, content, created_at) "
         "VALUES (1, 'assistant', 'an old answer', '2025-01-01 00:00:00')", ()))
    async with await Store.open(sqlite_url) as store:
        old, = await store.list_messages(1)
        assert (old.content, old.prompt_version) == ("an old answer", None)
        await store.add_prompt_versions([("system", "v1", "one")], "ada")
    await asyncio.to_thread(command.downgrade, alembic_config(sqlite_url), "0011")
    engine = sqlalchemy.create_engine(f"sqlite:///{sqlite_url.split(':///')[1]}")
    try:
        with engine.connect() as conn:
            inspector = sqlalchemy.inspect(conn)
            assert not {"prompt_versions", "prompt_settings", "prompt_pins"} & set(
                inspector.get_table_names())
            assert "prompt_version" not in {c["name"] for c in inspector.get_columns("messages")}
            assert conn.exec_driver_sql("SELECT content FROM messages").all() == [("an old answer",)]
    finally:
        engine.dispose()


async def test_forgetting_a_user_takes_their_pins_and_no_one_elses(store: Store):
    await store.add_prompt_versions([("system", "v1", "One."), ("system", "v2", "Two.")], "ada")
    for user in (ADA, "telegram:1002"):
        await store.pin_prompt(user, "system", "v2")
    assert (await store.forget_user(ADA, dry_run=True))["prompt pins"] == 1
    assert (await store.forget_user(ADA))["prompt pins"] == 1
    assert await store.prompt_pins() == {("telegram:1002", "system"): "v2"}
