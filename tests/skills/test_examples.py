"""examples/skills/, the skills docs/skills.md shows: the Python skill loaded from [skills]
python_paths and run in the real sandbox through the executor a model's call goes through, the
SKILL.md folder offered where its programs are; and the docs showing both files as they are, so
neither can drift from what runs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from openclaw.config import ConfigError, load_config
from openclaw.skillset import configured_skills, executor_for
from openclaw.store import Store
from sandbox.bwrap import isolation_available
from skills import load_skills

REPO = Path(__file__).resolve().parent.parent.parent
EXAMPLES = REPO / "examples" / "skills"
CONFIG = f"""
[skills]
enabled = ["shell", "disk_usage:DiskUsageSkill"]
python_paths = ["{EXAMPLES}"]
dirs = ["{EXAMPLES}"]
[skills.disk_usage]
top = 2
[access.roles]
"telegram:1" = "dev"
[roles.dev]
skills = ["shell", "disk_usage", "log-triage"]
"""


def test_the_docs_show_the_example_files_as_they_are():
    docs = (REPO / "docs" / "skills.md").read_text()
    for name in ("disk_usage.py", "log-triage/SKILL.md"):
        text = (EXAMPLES / name).read_text()
        assert f"\n{text}```\n" in docs, f"docs/skills.md does not show examples/skills/{name} as it is"


@pytest.fixture
async def call() -> AsyncIterator:
    if shutil.which("bwrap") is None or not isolation_available()[0]:
        pytest.fail("bubblewrap is missing or cannot create namespaces: run `make setup`")
    # Not tmp_path: pytest's /tmp/pytest-of-root is 0700, which the sandbox uid cannot walk through.
    root = Path(tempfile.mkdtemp(prefix="openclaw-examples-", dir="/tmp"))
    (root / "openclaw.toml").write_text(f'data_dir = "{root}/data"\n' + CONFIG)
    config = load_config(root / "openclaw.toml")
    config.data_dir.mkdir(mode=0o700)
    store = await Store.open(config.store.url)
    executor = executor_for(config, configured_skills(config), store.add_audit)

    async def run(skill: str, args: dict):
        return await executor.call(skill, args, config.policy().principal("telegram:1"))

    yield run
    await store.close()
    shutil.rmtree(root, ignore_errors=True)


async def test_the_example_python_skill_measures_the_workspace_in_the_sandbox(call):
    made = await call("shell", {"command": "mkdir -p logs && head -c 300000 /dev/zero > logs/big.log "
                                           "&& head -c 100000 /dev/zero > small.txt && echo made"})
    assert made.ok and "made" in made.text, made.text
    out = await call("disk_usage", {})  # top = 2, from [skills.disk_usage]
    assert out.ok and out.decision == "allowed", out.text
    first, second = out.text.splitlines()
    assert first.endswith("KiB  .") and second.endswith("KiB  ./logs"), out.text
    out = await call("disk_usage", {"path": "logs", "top": 5})
    assert [line.split("KiB  ")[1] for line in out.text.splitlines()] == ["logs", "logs/big.log"]


async def test_the_example_python_skill_reports_its_errors(call):
    out = await call("disk_usage", {"path": "../other"})
    assert (out.ok, out.decision) == (False, "denied") and "give a relative path" in out.text, out.text
    out = await call("disk_usage", {"top": 0})
    assert not out.ok and "top must be from 1 to 50, got 0" in out.text, out.text
    out = await call("disk_usage", {"path": "nowhere"})
    assert not out.ok and "du failed" in out.text and "nowhere" in out.text, out.text
    out = await call("disk_usage", {"top": "3"})  # the schema, checked before run()
    assert (out.ok, out.decision) == (False, "invalid"), out.text


def test_the_example_python_skills_settings_are_checked(tmp_path):
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n' + CONFIG.replace("top = 2", 'top = "2"\nsize = 1'))
    with pytest.raises(ConfigError) as err:
        configured_skills(load_config(config))
    assert "skills.disk_usage.top: must be a whole number from 1 to 50, got '2'" in err.value.problems
    assert "skills.disk_usage.size: unknown setting (disk_usage takes: top)" in err.value.problems


async def test_the_example_skill_md_is_offered_where_its_programs_are(call, monkeypatch):
    out = await call("log-triage", {})
    assert out.ok and "uniq -c" in out.text and "patterns.md" in out.text, out.text
    out = await call("log-triage", {"file": "patterns.md"})
    assert out.ok and "Traceback" in out.text, out.text
    monkeypatch.setenv("PATH", "/nonexistent")
    registry = load_skills([], [EXAMPLES], {})
    assert "log-triage" not in registry.names
    assert "needs the program grep, not found on PATH" in registry.skipped[0]
