"""`[skills] python_paths`: a skill module kept in a folder of the admin's, outside site-packages,
found by the CLI, the daemon's skill loading and the service, with no PYTHONPATH."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from openclaw.cli.service import unit_text
from openclaw.config import ConfigError, load_config
from openclaw.skillset import configured_skills
from tests.helpers.cli import run

GREET = '''
from skills import Skill


class Greet(Skill):
    name = "greet"
    description = "Greet someone."
    parameters = {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]}

    async def run(self, args, ctx):
        return f"hello {args['who']} from {MODULE}"
'''


def skill_folder(tmp_path: Path, module: str) -> Path:
    folder = tmp_path / "my skills"
    folder.mkdir()
    (folder / f"{module}.py").write_text(GREET.replace("{MODULE}", module))
    return folder


def config_file(tmp_path: Path, module: str, paths: str) -> Path:
    path = tmp_path / "conf" / "openclaw.toml"
    path.parent.mkdir()
    path.write_text(f'data_dir = "{tmp_path}/data"\n[admin]\nenabled = false\n'
                    f'[skills]\nenabled = ["{module}:Greet"]\n{paths}')
    return path


def test_a_skill_module_in_python_paths_runs_through_skills_run(tmp_path):
    skill_folder(tmp_path, "greet_cli_skill")
    # Relative to the config file's folder, as every path of the config.
    config = config_file(tmp_path, "greet_cli_skill", 'python_paths = ["../my skills"]\n')
    proc = run(["--config", str(config), "skills", "run", "greet", "--as", "terminal:local",
                "--args", '{"who": "Ann"}'], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["decision"] == "allowed" and out["output"] == "hello Ann from greet_cli_skill"
    listed = run(["--config", str(config), "skills", "list"], tmp_path)
    assert listed.returncode == 0 and "\ngreet\n" in f"\n{listed.stdout}", listed.stderr


def test_without_python_paths_the_module_is_not_found(tmp_path):
    skill_folder(tmp_path, "greet_missing_skill")
    config = config_file(tmp_path, "greet_missing_skill", "")
    proc = run(["--config", str(config), "skills", "list"], tmp_path)
    assert proc.returncode != 0
    assert "cannot import greet_missing_skill:Greet" in proc.stderr, proc.stderr


def test_the_daemons_skill_loading_imports_from_python_paths(tmp_path):
    folder = skill_folder(tmp_path, "greet_daemon_skill")
    config = load_config(config_file(tmp_path, "greet_daemon_skill", 'python_paths = ["../my skills"]\n'))
    assert config.skills.python_paths[0].resolve() == folder
    registry = configured_skills(config)  # what the daemon's start and its reload call
    assert registry.names == ["greet"]


def test_a_python_path_that_is_no_folder_is_named(tmp_path):
    config = load_config(config_file(tmp_path, "greet_nowhere_skill", 'python_paths = ["../nowhere"]\n'))
    try:
        configured_skills(config)
    except ConfigError as exc:
        problems = exc.problems
    else:
        raise AssertionError("loaded a skill from a folder that is not there")
    assert any(p.startswith("skills.python_paths[0]") and "is not a folder" in p for p in problems), problems


def test_the_unit_names_the_python_paths_it_runs_with(tmp_path):
    folder = skill_folder(tmp_path, "greet_unit_skill")
    text = unit_text("/usr/bin/openclaw", Path("/c.toml"), None, Path("/d"), python_paths=[folder])
    assert f"# [skills] python_paths: {folder}" in text


def test_service_install_writes_the_python_paths_and_warns_of_tmp(tmp_path):
    folder = skill_folder(tmp_path, "greet_install_skill")
    config = config_file(tmp_path, "greet_install_skill", 'python_paths = ["../my skills"]\n')
    proc = run(["--config", str(config), "service", "install"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    unit = (tmp_path / ".config/systemd/user/openclaw.service").read_text()
    assert f"# [skills] python_paths: {folder}" in unit
    if str(tmp_path).startswith("/tmp/"):  # the service's /tmp is its own (PrivateTmp=yes)
        assert f"skills.python_paths[0] {folder} is under /tmp" in proc.stderr, proc.stderr


def test_a_module_in_python_paths_does_not_stand_in_for_an_installed_one(tmp_path):
    # A skill folder holding a file named like a module of the standard library or of
    # site-packages: the daemon keeps importing the real one.
    folder = skill_folder(tmp_path, "greet_shadow_skill")
    for name in ("colorsys", "pygments"):
        (folder / f"{name}.py").write_text("raise SystemExit('the skill folder shadowed it')\n")
    configured_skills(load_config(config_file(tmp_path, "greet_shadow_skill",
                                              'python_paths = ["../my skills"]\n')))
    for name in ("colorsys", "pygments"):
        spec = importlib.util.find_spec(name)
        assert spec is not None and not spec.origin.startswith(str(folder)), spec
