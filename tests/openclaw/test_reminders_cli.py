"""`openclaw reminders cancel` run in-process against a real SQLite store: numbers no reminder can
have."""

from __future__ import annotations

import argparse
import asyncio
from datetime import timedelta

import pytest

from openclaw.cli.reminders import cmd_cancel, cmd_list
from openclaw.store import Store


class Book:
    """A config whose data_dir holds a store with these reminders (user, chat, text), each due in
    an hour, and what is still active in it."""

    def __init__(self, tmp_path, reminders: list[tuple[str, str, str]]) -> None:
        (tmp_path / "data").mkdir()
        self.config = tmp_path / "c.toml"
        self.config.write_text(f'data_dir = "{tmp_path}/data"\n')
        self.url = f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db"
        asyncio.run(self._add(reminders))

    async def _add(self, reminders: list[tuple[str, str, str]]) -> None:
        async with await Store.open(self.url) as store:
            for user, chat, text in reminders:
                await store.add_reminder(user, chat, text, store.now() + timedelta(hours=1))

    def active(self) -> list[str]:
        async def texts() -> list[str]:
            async with await Store.open(self.url) as store:
                return sorted(r.text for r in await store.active_reminders())

        return asyncio.run(texts())


@pytest.mark.parametrize("number", [10**20, 2**63, 0, -3])
def test_cancel_with_a_number_no_reminder_can_have_says_there_is_none(tmp_path, capsys, number):
    # 10**20 reached SQLite, which cannot hold it: a traceback instead of "no active reminder".
    book = Book(tmp_path, [("telegram:1", "1", "tea")])
    args = argparse.Namespace(config=str(book.config), user="telegram:1", number=number, chat=None)
    assert cmd_cancel(args) == 1
    assert f"telegram:1 has no active reminder #{number}" in capsys.readouterr().err
    assert book.active() == ["tea"]


def test_a_groups_forum_topics_are_part_of_the_group_for_list_and_cancel(tmp_path, capsys):
    # A Telegram forum topic is chat "-100555/7" (connectors/telegram.py): `cancel --chat` for a
    # group its owner left cancelled none of the reminders set in its topics, which kept posting.
    book = Book(tmp_path, [("telegram:1", "-100555", "general"),
                           ("telegram:1", "-100555/7", "in topic 7"),
                           ("telegram:2", "-100555/9", "in topic 9"),
                           ("telegram:2", "-1005556", "another group"),
                           ("telegram:2", "2", "private")])
    config = book.config

    def listed(chat: str) -> list[str]:
        assert cmd_list(argparse.Namespace(config=str(config), user=None,
                                                         chat=chat)) == 0
        return sorted(line.split("  ")[-1] for line in capsys.readouterr().out.splitlines())

    assert listed("telegram:-100555") == ["general", "in topic 7", "in topic 9"]
    assert listed("telegram:-100555/7") == ["in topic 7"]  # one topic alone

    topic = argparse.Namespace(config=str(config), user=None, number=None, chat="telegram:-100555/9")
    assert cmd_cancel(topic) == 0
    assert "cancelled 1 reminder(s)" in capsys.readouterr().out
    group = argparse.Namespace(config=str(config), user=None, number=None, chat="telegram:-100555")
    assert cmd_cancel(group) == 0
    assert "cancelled 2 reminder(s) delivered to telegram:-100555" in capsys.readouterr().out
    assert book.active() == ["another group", "private"]


def test_cancel_takes_the_number_as_its_user_sees_it(tmp_path, capsys):
    from openclaw.cli import main

    book = Book(tmp_path, [("telegram:1", "1", "tea"), ("telegram:1", "1", "cake")])
    assert main(["--config", str(book.config), "reminders", "cancel", "telegram:1", "#1"]) == 0
    assert "cancelled telegram:1's reminder #1: tea" in capsys.readouterr().out
    assert book.active() == ["cake"]
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, naming what it got
        main(["--config", str(book.config), "reminders", "cancel", "telegram:1", "#two"])
    assert exited.value.code == 2
    assert "'#two' is not a reminder's number (3, or #3)" in capsys.readouterr().err
    assert book.active() == ["cake"]
