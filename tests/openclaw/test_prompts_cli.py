"""`openclaw prompts import|list|show|diff|activate|ab|pin|unpin`, in-process through main()
against a real SQLite store; one run as a user runs it, in a process of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from openclaw.cli import main
from openclaw.store import Store
from openclaw.store.prompts import PromptSetting
from tests.helpers.cli import run


class Admin:
    """A config, a prompt folder under version control, and the commands an admin types."""

    def __init__(self, tmp_path: Path) -> None:
        self.data = tmp_path / "data"
        self.config = tmp_path / "c.toml"
        self.config.write_text(f'data_dir = "{self.data}"\n')
        self.url = f"sqlite+aiosqlite:///{self.data}/openclaw.db"
        self.folder = tmp_path / "prompts"

    def write(self, rel: str, text: str) -> None:
        path = self.folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def cli(self, *argv: str) -> int:
        return main(["--config", str(self.config), "prompts", *argv])

    def read(self, work):
        async def go():
            async with await Store.open(self.url) as store:
                return await work(store)
        return asyncio.run(go())


@pytest.fixture
def admin(tmp_path: Path) -> Admin:
    a = Admin(tmp_path)
    a.write("system/v1.md", "Be brief.\n")
    a.write("system/v2.md", "Be brief.\nBe kind.\n")
    a.write("tools/v1.md", "Tools:\n{tools}\n")
    return a


def test_looks_and_changes_on_a_fresh_install_create_nothing(tmp_path, capsys):
    a = Admin(tmp_path)
    assert a.cli("list") == 0
    out = capsys.readouterr().out
    assert "active:   none (the config's [agent] system_prompt)" in out
    assert "no prompt versions stored yet" in out
    assert a.cli("activate", "system", "v1") == 1
    assert "no prompt versions stored yet" in capsys.readouterr().err
    assert a.cli("show", "system") == 1
    assert not a.data.exists()


def test_import_says_what_it_stored_and_again_stores_nothing(admin: Admin, capsys):
    assert admin.cli("import", str(admin.folder), "--author", "ada") == 0
    out = capsys.readouterr().out
    assert "added      system v2 (after v1)" in out and "added      tools v1" in out
    assert "3 added, 0 unchanged" in out
    assert admin.cli("import", str(admin.folder)) == 0
    assert "0 added, 3 unchanged" in capsys.readouterr().out
    assert {v.author for v in admin.read(lambda s: s.prompt_versions())} == {"ada"}


def test_a_changed_file_under_a_stored_version_is_refused(admin: Admin, capsys):
    assert admin.cli("import", str(admin.folder)) == 0
    admin.write("system/v1.md", "Be verbose.\n")
    assert admin.cli("import", str(admin.folder)) == 1
    err = capsys.readouterr().err
    assert f"{admin.folder}/system/v1.md: system v1 is stored already with a different text" in err
    assert [v.text for v in admin.read(lambda s: s.prompt_versions("system"))] == \
        ["Be brief.", "Be brief.\nBe kind."]


def test_an_author_too_long_is_refused_in_a_line(admin: Admin, capsys):
    assert admin.cli("import", str(admin.folder), "--author", "a" * 129) == 1
    assert "author is 1 to 128 characters" in capsys.readouterr().err


def test_a_folder_that_is_not_a_prompt_folder_makes_no_database(admin: Admin, capsys):
    admin.write("sytem/v3.md", "typo")
    assert admin.cli("import", str(admin.folder)) == 1
    assert "sytem: not a prompt name" in capsys.readouterr().err
    assert not admin.data.exists()


def test_show_diff_and_list(admin: Admin, capsys):
    admin.cli("import", str(admin.folder), "--author", "ada")
    admin.cli("activate", "system", "v1")
    capsys.readouterr()
    assert admin.cli("show", "system") == 0
    out = capsys.readouterr().out
    assert out.startswith("# system v1 (active), by ada, ") and out.endswith("\nBe brief.\n")
    assert admin.cli("show", "system", "v2") == 0
    assert ", after v1\nBe brief.\nBe kind.\n" in capsys.readouterr().out
    assert admin.cli("diff", "system", "v1", "v2") == 0
    assert capsys.readouterr().out == ("--- system/v1\n+++ system/v2\n@@ -1 +1,2 @@\n"
                                       "-Be brief.\n+Be brief.\n+Be kind.\n")
    assert admin.cli("diff", "system", "v1", "v9") == 1
    assert "system has no version v9 (stored: v1, v2)" in capsys.readouterr().err
    admin.cli("ab", "system", "v1=30", "v2=70")
    admin.cli("pin", "telegram:1001", "system", "v2")
    capsys.readouterr()
    assert admin.cli("list") == 0
    assert capsys.readouterr().out == (
        "system\n  versions: v1, v2\n  active:   v1\n"
        "  A/B:      v1=30 v2=70 (the active version waits until `ab system off`)\n"
        "  pins:     1 user\n"
        "tools\n  versions: v1\n  active:   none (the engine's built-in template)\n")


def test_activate_ab_pin_and_their_refusals(admin: Admin, capsys):
    admin.cli("import", str(admin.folder))
    assert admin.cli("activate", "system", "v9") == 1
    assert "system has no version v9 (stored: v1, v2)" in capsys.readouterr().err
    for bad, says in ((["v1=50"], "needs two versions"), (["v1=50", "v2=0"], "positive whole"),
                      (["v1=50", "v2=x"], "positive whole"), (["v1", "v2"], "VERSION=WEIGHT"),
                      (["v1=1", "v1=2"], "named twice")):
        assert admin.cli("ab", "system", *bad) == 2
        assert says in capsys.readouterr().err
    assert admin.cli("ab", "system", "v1=50", "v3=50") == 1
    assert "system has no version v3" in capsys.readouterr().err
    assert admin.read(lambda s: s.prompt_settings()) == {}  # nothing changed by a refusal

    assert admin.cli("ab", "system", "v1=1", "v2=3") == 0
    assert "users split v1 25%, v2 75%" in capsys.readouterr().out
    assert admin.cli("activate", "system", "v2") == 0
    assert "ended the A/B split v1=1 v2=3" in capsys.readouterr().out
    assert admin.read(lambda s: s.prompt_settings()) == {"system": PromptSetting("system", "v2")}
    assert admin.cli("ab", "system", "off") == 0
    assert "no A/B split was running" in capsys.readouterr().out

    assert admin.cli("pin", "ada", "system", "v1") == 2
    assert 'expected a user "channel:id"' in capsys.readouterr().err
    assert admin.cli("pin", "telegram:1001", "system", "v1") == 0
    assert admin.read(lambda s: s.prompt_pins()) == {("telegram:1001", "system"): "v1"}
    assert admin.cli("unpin", "telegram:1001", "system") == 0
    assert admin.cli("unpin", "telegram:1001", "system") == 1
    assert "telegram:1001 has no pin of system" in capsys.readouterr().err


def test_import_as_a_user_runs_it(admin: Admin, tmp_path):
    done = run(["--config", str(admin.config), "prompts", "import", str(admin.folder)], tmp_path,
               LOGNAME="someone", USER="someone")
    assert done.returncode == 0, done.stderr
    assert "3 added" in done.stdout
    assert {v.author for v in admin.read(lambda s: s.prompt_versions())} == {"someone"}


@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_link_out_of_the_folder_is_refused_and_nothing_imported(tmp_path, capsys, link):
    """A prompt folder may be someone else's repository: a link in it must not make a file the
    admin can read (here a token) a system prompt the model would repeat."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "v1.md").write_text("TELEGRAM_BOT_TOKEN=123:SECRET\n")
    a = Admin(tmp_path)
    a.write("tools/v1.md", "Tools:\n{tools}\n")
    if link == "file":
        (a.folder / "system").mkdir()
        (a.folder / "system" / "v1.md").symlink_to(outside / "v1.md")
    else:
        (a.folder / "system").symlink_to(outside)
    assert a.cli("import", str(a.folder)) == 1
    assert "a symbolic link" in capsys.readouterr().err
    assert not a.data.exists()  # refused before the store was opened: nothing imported
