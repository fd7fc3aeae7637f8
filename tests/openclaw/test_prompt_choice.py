"""Which prompt versions a user gets (openclaw/prompts/choice.py): pin > A/B variant > active >
the config's; a variant is stable per user, in every process, and the variants' shares follow
their weights. And the import of a prompt folder (openclaw/prompts/library.py). A real SQLite
store."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from openclaw.prompts import PromptChoice, choose
from openclaw.prompts.choice import variant
from openclaw.prompts.library import PromptImportError, import_prompts
from openclaw.store import Store

USERS = [f"telegram:{100000 + n}" for n in range(10_000)]
FALLBACK = "You are the config's assistant."


@pytest.fixture
async def store(tmp_path: Path):
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}") as opened:
        yield opened


def prompt_dir(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# -- precedence -----------------------------------------------------------------------------------

async def test_without_a_library_the_config_and_the_builtin_template_answer(store: Store):
    assert await choose(store, "telegram:1", FALLBACK) == PromptChoice(
        FALLBACK, None, {"system": "config", "tools": "builtin"}, "system=config;tools=builtin")


async def test_pin_beats_split_beats_active(store: Store):
    await store.add_prompt_versions([("system", v, f"system {v}") for v in ("v1", "v2", "v3")]
                                    + [("tools", "v1", "T {tools}")], "ada")
    await store.activate_prompt("system", "v1")
    await store.activate_prompt("tools", "v1")
    choice = await choose(store, "telegram:1", FALLBACK)
    assert (choice.system, choice.tools, choice.label) == ("system v1", "T {tools}",
                                                           "system=v1;tools=v1")
    await store.set_prompt_variants("system", {"v2": 1, "v3": 1})
    split = {u: (await choose(store, u, FALLBACK)).versions["system"] for u in USERS[:200]}
    assert set(split.values()) == {"v2", "v3"}  # the active v1 waits while the split runs
    await store.pin_prompt("telegram:1", "system", "v1")
    pinned = await choose(store, "telegram:1", FALLBACK)
    assert (pinned.system, pinned.label) == ("system v1", "system=v1;tools=v1")
    await store.set_prompt_variants("system", None)  # the split ends: the active version again
    assert (await choose(store, USERS[0], FALLBACK)).versions["system"] == "v1"


# -- the split ------------------------------------------------------------------------------------

@pytest.mark.parametrize("weights", [{"v3": 50, "v4": 50}, {"v1": 1, "v2": 3},
                                     {"v1": 20, "v2": 30, "v10": 50}])
def test_shares_follow_the_weights_over_ten_thousand_users(weights: dict[str, int]):
    """Each share within 3 standard deviations of its weight: a binomial share p over n users
    has sd sqrt(p(1-p)/n), 0.005 at p=0.5 and n=10,000, so a fair hash lands inside 99.7% of
    the time per share (and this one is fixed: it passes or fails the same on every run)."""
    counts = Counter(variant(u, "system", weights) for u in USERS)
    total = sum(weights.values())
    for version, weight in weights.items():
        p = weight / total
        assert abs(counts[version] / len(USERS) - p) <= 3 * math.sqrt(p * (1 - p) / len(USERS)), \
            (version, counts)


def test_a_users_variant_does_not_depend_on_their_other_prompts_variant():
    both = Counter((variant(u, "system", {"a": 1, "b": 1}), variant(u, "tools", {"a": 1, "b": 1}))
                   for u in USERS)
    for pair in [("a", "a"), ("a", "b"), ("b", "a"), ("b", "b")]:  # each near a quarter
        assert abs(both[pair] / len(USERS) - 0.25) <= 3 * math.sqrt(0.25 * 0.75 / len(USERS))


def test_a_user_keeps_their_variant_in_every_process():
    """Another interpreter, with another hash seed (Python's own hash() differs between runs)."""
    code = ("from openclaw.prompts.choice import variant\n"
            "print(','.join(variant(f'telegram:{100000 + n}', 'system', {'v3': 50, 'v4': 50}) "
            "for n in range(200)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345",
                              "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.strip()
    assert out.split(",") == [variant(u, "system", {"v3": 50, "v4": 50}) for u in USERS[:200]]


def test_the_order_the_variants_are_named_in_does_not_move_anyone():
    """`ab system v3=50 v4=50` and `ab system v4=50 v3=50` are one split."""
    assert [variant(u, "system", {"v3": 50, "v4": 50}) for u in USERS] == \
        [variant(u, "system", {"v4": 50, "v3": 50}) for u in USERS]


# -- import ---------------------------------------------------------------------------------------

async def test_import_stores_each_version_with_author_and_parent_and_again_is_a_no_op(
        store: Store, tmp_path: Path):
    folder = prompt_dir(tmp_path / "prompts", {
        "README.md": "not a prompt", ".git/config": "neither",
        "system/v1.md": "Be brief.\n\n", "system/v2.txt": "Be brief and kind.\n",
        "system/v10.md": "Be kind.", "tools/v1.md": "Tools:\n{tools}\nUse them well.\n"})
    first = await import_prompts(store, folder, "ada")
    assert sorted((i.file.name, i.file.version, i.added) for i in first) == [
        ("system", "v1", True), ("system", "v10", True), ("system", "v2", True),
        ("tools", "v1", True)]
    stored = {(v.name, v.version): v for v in await store.prompt_versions()}
    assert stored["system", "v1"].text == "Be brief."  # the trailing newlines are the editor's
    assert stored["system", "v10"].parent_id == stored["system", "v2"].id
    assert {v.author for v in stored.values()} == {"ada"}
    again = await import_prompts(store, folder, "bob")
    assert not any(i.added for i in again)
    assert {v.author for v in await store.prompt_versions()} == {"ada"}


async def test_a_changed_text_under_a_stored_version_is_refused_naming_the_file(
        store: Store, tmp_path: Path):
    folder = prompt_dir(tmp_path / "p", {"system/v1.md": "Be brief."})
    await import_prompts(store, folder, "ada")
    prompt_dir(folder, {"system/v1.md": "Be long-winded.", "system/v2.md": "new"})
    with pytest.raises(PromptImportError, match=rf"{folder}/system/v1.md: system v1 is stored "
                                                r"already with a different text.*nothing was "
                                                r"imported"):
        await import_prompts(store, folder, "ada")
    assert [(v.version, v.text) for v in await store.prompt_versions()] == [("v1", "Be brief.")]


@pytest.mark.parametrize(("files", "error"), [
    ({"sytem/v1.md": "x"}, r"sytem: not a prompt name; the library has system and tools"),
    ({"system/v1.json": "x"}, r"system/v1.json: not a prompt file"),
    ({"system/v;1.md": "x"}, r"system/v;1.md: prompt version 'v;1'"),
    ({"system/v1.md": "x", "system/v1.txt": "y"}, r"system/v1.txt: system v1 is also in"),
    ({"system/v1.md": " \n"}, r"system/v1.md: empty"),
    ({"tools/v1.md": "no placeholder"}, r"tools/v1.md: a tool-instruction template holds"),
    ({"README.md": "only this"}, r"no prompt files in"),
])
async def test_a_bad_folder_is_refused_naming_what_and_storing_nothing(
        store: Store, tmp_path: Path, files: dict[str, str], error: str):
    folder = prompt_dir(tmp_path / "p", {"system/v0.md": "fine", **files})
    if "README.md" in files:
        (folder / "system/v0.md").unlink()
        (folder / "system").rmdir()
    with pytest.raises(PromptImportError, match=error):
        await import_prompts(store, folder, "ada")
    assert await store.prompt_versions() == []


async def test_text_that_is_not_utf8_is_refused(store: Store, tmp_path: Path):
    folder = tmp_path / "p"
    (folder / "system").mkdir(parents=True)
    (folder / "system" / "v1.md").write_bytes(b"caf\xe9")
    with pytest.raises(PromptImportError, match="v1.md: not UTF-8 text"):
        await import_prompts(store, folder, "ada")
