"""SKILL.md folders as OpenClaw gates them: `metadata.openclaw.requires` (bins, anyBins, env) and
`os` keep a skill whose program or variable is missing from the model; a folder whose front matter
is broken is left out. Either way the rest loads, and `doctor` and the daemon's log say why, one
line each."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from openclaw.config import load_config
from openclaw.daemon import Daemon
from openclaw.skillset import configured_skills
from skills import load_skills
from tests.helpers.cli import run
from tests.helpers.daemon import RecordingConnector, msg
from tests.helpers.scripted_model import ScriptedModel


def skill(base: Path, folder: str, front: str, body: str = "Do it.\n") -> Path:
    (base / folder).mkdir(parents=True, exist_ok=True)
    path = base / folder / "SKILL.md"
    path.write_text(f"---\n{textwrap.dedent(front).strip()}\n---\n{body}")
    return path


def needing(name: str, requires: str) -> str:
    """Front matter of a skill `name` with these `requires` (JSON), in OpenClaw's one-line form."""
    return f'name: {name}\ndescription: d\nmetadata: {{"openclaw": {{"requires": {requires}}}}}'


GIZMO = needing("gizmo", '{"bins": ["gizmoctl-x"]}')


def test_a_skill_whose_program_is_on_path_is_offered_and_one_whose_program_is_not_is_left_out(tmp_path):
    skill(tmp_path, "listing", """
        name: listing
        description: List files.
        metadata: {"openclaw": {"requires": {"bins": ["ls"]}}}
    """)
    skill(tmp_path, "gizmo", """
        name: gizmo
        description: Drive the gizmo.
        metadata:
          openclaw:
            requires:
              bins: [ls, gizmoctl-not-installed]
    """)
    registry = load_skills([], [tmp_path], {})
    assert registry.names == ["listing"]
    [line] = registry.skipped
    assert line.startswith(f"gizmo ({tmp_path / 'gizmo' / 'SKILL.md'}): not offered: ")
    assert "needs the program gizmoctl-not-installed, not found on PATH" in line and "\n" not in line


def test_any_bins_needs_one_of_them(tmp_path):
    skill(tmp_path, "one", needing("one", '{"anyBins": ["nope-a", "ls"]}'))
    skill(tmp_path, "none", needing("none", '{"anyBins": ["nope-a", "nope-b"]}'))
    registry = load_skills([], [tmp_path], {})
    assert registry.names == ["one"]
    assert "needs one of the programs nope-a, nope-b, none found on PATH" in registry.skipped[0]


def test_a_skill_whose_variable_is_missing_is_left_out_until_it_is_set(tmp_path, monkeypatch):
    # As OpenClaw's registry writes it: metadata a JSON string inside the YAML (clawdbot alias).
    skill(tmp_path, "todo", """
        name: todo
        description: Manage tasks.
        metadata: '{"clawdbot": {"requires": {"env": ["OPENCLAW_TEST_TODO_KEY"]}}}'
    """)
    monkeypatch.delenv("OPENCLAW_TEST_TODO_KEY", raising=False)
    registry = load_skills([], [tmp_path], {})
    assert registry.names == []
    assert "needs the environment variable OPENCLAW_TEST_TODO_KEY" in registry.skipped[0]
    monkeypatch.setenv("OPENCLAW_TEST_TODO_KEY", "")  # set but empty is missing too
    assert load_skills([], [tmp_path], {}).names == []
    monkeypatch.setenv("OPENCLAW_TEST_TODO_KEY", "k")
    registry = load_skills([], [tmp_path], {})
    assert registry.names == ["todo"] and registry.skipped == []


def test_a_skill_for_another_system_is_left_out(tmp_path):
    skill(tmp_path, "mac", 'name: mac\ndescription: d\nmetadata: {"openclaw": {"os": ["darwin"]}}')
    registry = load_skills([], [tmp_path], {})
    assert registry.names == [] and "runs on darwin only, not linux" in registry.skipped[0]


@pytest.mark.parametrize("content, problem", [
    ("# no front matter\n", "has no YAML front matter"),
    ("---\nname: [unclosed\n---\nbody\n", "front matter is not valid YAML at line 3: "),
    (b"---\nname: caf\xe9\ndescription: d\n---\n", "SKILL.md is not UTF-8 text (byte 13)"),
    ("---\nname: x\n---\nbody\n", "front matter needs a non-empty 'description'"),
    ("---\ndescription: d\n---\nbody\n", "front matter needs a non-empty 'name'"),
    ("---\nname: two words\ndescription: d\n---\n", "name 'two words' must be letters, digits, _ or -"),
    ("---\nname: x\ndescription: d\n\nSteps: run the tool\n", "front matter is not closed"),
    ('---\nname: x\ndescription: d\nmetadata: {"openclaw": {"requires": {"bins": [3]}}}\n---\n',
     "metadata.openclaw.requires.bins must be a list of names"),
    ("---\nname: x\ndescription: d\nmetadata: {openclaw: '{not json'}\n---\n",
     "metadata.openclaw is not valid JSON"),
])
def test_a_broken_skill_md_is_left_out_and_the_others_load(tmp_path, content, problem):
    skill(tmp_path, "good", "name: good\ndescription: Fine.")
    (tmp_path / "broken").mkdir()
    path = tmp_path / "broken/SKILL.md"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    registry = load_skills([], [tmp_path], {})
    assert registry.names == ["good"]
    [line] = registry.skipped
    assert str(path) in line and problem in line and "\n" not in line, line


def test_a_left_out_skill_named_in_enabled_and_a_role_is_not_an_unknown_skill(tmp_path):
    skill(tmp_path / "skills", "gizmo", GIZMO)
    (tmp_path / "skills/broken").mkdir()
    (tmp_path / "skills/broken/SKILL.md").write_text("---\nname: [\n---\n")
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[skills]\nenabled = ["clock", "gizmo", "broken"]\n'
                      'dirs = ["skills"]\n[roles.user]\nskills = ["clock", "gizmo", "broken"]\n')
    registry = configured_skills(load_config(config))  # the daemon starts
    assert registry.names == ["clock"] and len(registry.skipped) == 2


def three_skills(base: Path, broken: str) -> None:
    """gizmo (its program missing), fine, and broken (this SKILL.md)."""
    skill(base, "gizmo", GIZMO)
    skill(base, "fine", "name: fine\ndescription: d")
    (base / "broken").mkdir()
    (base / "broken/SKILL.md").write_text(broken)


def test_doctor_says_why_each_skill_is_left_out(tmp_path):
    three_skills(tmp_path / "skills", broken="---\nname: x\n---\n")
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                      '[skills]\nenabled = ["clock"]\ndirs = ["skills"]\n')
    proc = run(["--config", str(config), "doctor", "--skip-model"], tmp_path)
    lines = proc.stdout.splitlines()
    assert "✓ skills: clock, fine" in lines, proc.stdout
    assert any(line.startswith("⚠ skill gizmo (") and "gizmoctl-x, not found on PATH" in line
               for line in lines), proc.stdout
    assert any(line.startswith(f"⚠ skill broken ({tmp_path / 'skills/broken/SKILL.md'}): not offered: ")
               and "needs a non-empty 'description'" in line for line in lines), proc.stdout


async def test_the_daemon_starts_without_them_logs_why_and_offers_the_rest(tmp_path, caplog):
    three_skills(tmp_path / "skills", broken="---\nname: [\n---\n")
    config = tmp_path / "openclaw.toml"
    config.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n[access]\n'
                      'allow = ["telegram:1001"]\n[skills]\nenabled = ["clock"]\ndirs = ["skills"]\n'
                      '[roles.user]\nskills = ["*"]\n')
    offered: list[list[str]] = []

    class Recording(ScriptedModel):
        async def generate(self, prompt, params=None, request_id=None, *, tools=None, **kw):
            offered.append(sorted(t["function"]["name"] for t in tools or []))
            async for out in super().generate(prompt, params, request_id, tools=tools):
                yield out

    conn = RecordingConnector("telegram")
    daemon = Daemon(load_config(config), model=Recording(lambda messages: "ok"), connectors=[conn])
    with caplog.at_level(logging.WARNING, logger="openclaw.daemon"):
        await daemon.start()
    try:
        await conn.handler(msg("hi", user="1001", channel="telegram"))
        await daemon.gateway.wait_idle()
    finally:
        await daemon.stop()
    assert offered == [["clock", "fine"]]
    said = [r.getMessage() for r in caplog.records if "not offered" in r.getMessage()]
    assert len(said) == 2, said
    assert any("gizmo" in line and "gizmoctl-x, not found on PATH" in line for line in said), said
    assert any(str(tmp_path / "skills/broken/SKILL.md") in line and "not valid YAML" in line
               for line in said), said
