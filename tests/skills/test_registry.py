"""Installing skills through the config: built-ins, a third-party package's entry point, a
"module:Class" reference, SKILL.md folders; and the errors an admin gets, each naming the key."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from openclaw.cli import main
from openclaw.config import ConfigError, load_config
from openclaw.skillset import configured_skills, executor_for
from openclaw.store import Store
from sandbox.policy import Policy, Role
from sandbox.runner import Sandbox
from skills import Executor, SkillLoadError, load_skills
from tests.helpers.skill_md import SKILL_MD

PLUGIN = '''
from skills import Skill, SkillError


class Weather(Skill):
    name = "weather"
    description = "The weather in a city."
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    permissions = frozenset({"network"})

    @classmethod
    def check_settings(cls, settings):
        unit = settings.get("unit", "C")
        return [] if unit in ("C", "F") else [f'unit: expected "C" or "F", got {unit!r}']

    async def run(self, args, ctx):
        if args["city"] == "Atlantis":
            raise SkillError("no such city")
        return f"sunny in {args['city']}, 21 {ctx.settings.get('unit', 'C')} (for {ctx.user})"


class NotASkill:
    name = "nope"


class NeedsArguments(Weather):
    name = "needy"

    def __init__(self, api_key):
        self.api_key = api_key


class NoRun(Skill):
    name = "norun"
    description = "Forgot run()."


class BadSettingsCheck(Weather):
    name = "badcheck"

    @classmethod
    def check_settings(cls, settings):
        return settings["unit"].upper()


class BadSchema(Weather):
    name = "badschema"
    parameters = "nope"
'''


def install(site: Path, module: str, source: str, dist: str, version: str, entry_points: str,
            monkeypatch) -> None:
    """A real installed distribution on sys.path: a module and dist-info with entry points."""
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[openclaw.skills]\n{entry_points}\n")
    monkeypatch.syspath_prepend(str(site))


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    install(tmp_path / "site", "weather_plugin", PLUGIN, "weather-plugin", "1.2",
            "weather = weather_plugin:Weather", monkeypatch)
    yield tmp_path / "site"
    sys.modules.pop("weather_plugin", None)


@pytest.fixture
def renamed_plugin(tmp_path, monkeypatch):
    """A package whose entry point "weather" provides a skill named "forecast"."""
    source = PLUGIN.replace('name = "weather"', 'name = "forecast"', 1)
    install(tmp_path / "site", "forecast_plugin", source, "forecast-plugin", "2.0",
            "weather = forecast_plugin:Weather", monkeypatch)
    yield
    sys.modules.pop("forecast_plugin", None)


def write_config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "openclaw.toml"
    path.write_text(f'data_dir = "{tmp_path}/data"\n' + textwrap.dedent(body))
    return path


def problems_of(tmp_path: Path, body: str) -> list[str]:
    """What loading the config's skills refuses (it must refuse)."""
    with pytest.raises(ConfigError) as err:
        configured_skills(load_config(write_config(tmp_path, body)))
    return err.value.problems


async def test_an_entry_point_skill_is_installed_by_name_and_runs_with_its_settings(tmp_path, plugin_package):
    config = load_config(write_config(tmp_path, """
        [skills]
        enabled = ["clock", "weather"]
        [skills.weather]
        unit = "F"
        [roles.user]
        skills = ["clock", "weather"]
    """))
    registry = configured_skills(config)
    assert registry.names == ["clock", "weather"]
    assert registry.origin("weather") == "entry point from weather-plugin 1.2"
    store = await Store.open(config.store.url)
    try:
        executor = executor_for(config, registry, store.add_audit)
        principal = config.policy().principal("telegram:5")
        out = await executor.call("weather", {"city": "Paris"}, principal)
        assert out.ok and out.text == "sunny in Paris, 21 F (for telegram:5)"
        failed = await executor.call("weather", {"city": "Atlantis"}, principal)
        assert not failed.ok and failed.text == "error: no such city"
        assert [a.decision for a in await store.list_audit()] == ["allowed", "allowed"]
    finally:
        await store.close()


def test_an_entry_point_named_unlike_its_skill_registers_the_skills_name_and_says_which(
        tmp_path, renamed_plugin, capsys):
    path = write_config(tmp_path, """
        [skills]
        enabled = ["weather"]
        [skills.forecast]
        unit = "F"
        [roles.user]
        skills = ["forecast"]
    """)
    registry = configured_skills(load_config(path))
    assert registry.names == ["forecast"]  # its tools are named by it
    assert registry.origin("forecast") == "entry point 'weather' from forecast-plugin 2.0"
    assert registry.settings("forecast") == {"unit": "F"}
    assert main(["--config", str(path), "skills", "list"]) == 0
    assert "  from: entry point 'weather' from forecast-plugin 2.0\n" in capsys.readouterr().out


HINT = "entry point 'weather' provides the skill 'forecast'; use that name"


def test_settings_under_the_entry_points_name_say_which_name_to_use(tmp_path, renamed_plugin):
    assert problems_of(tmp_path, """
        [skills]
        enabled = ["weather", "clock"]
        [skills.weather]
        unit = "F"
        [skills.shell]
        timeout = 3
    """) == [
        f"skills.weather: settings for a skill that is not enabled (enabled: forecast, clock); {HINT}",
        "skills.shell: settings for a skill that is not enabled (enabled: forecast, clock); "
        "add it to [skills] enabled, or remove the [skills.shell] table",
    ]


def test_a_role_naming_the_entry_point_is_told_the_skills_name(tmp_path, renamed_plugin):
    assert problems_of(tmp_path, """
        [skills]
        enabled = ["weather", "clock"]
        [roles.family]
        skills = ["clock", "weather", "shel"]
    """) == [
        "roles.family.skills: unknown skill(s) ['shel', 'weather']; enabled skills: forecast, clock "
        f"(enable more in [skills] enabled); {HINT}"]


def test_a_module_class_reference_loads_the_same_class(tmp_path, plugin_package):
    registry = load_skills(["weather_plugin:Weather"], [], {})
    assert registry.names == ["weather"] and registry.origin("weather") == "weather_plugin:Weather"


@pytest.mark.parametrize("ref, expected", [
    ("wether", "no such skill; built-ins and installed entry points: clock, email, files, memory, "
               "reminders, schedule, shell, weather"),
    ("weather_plugin:Missing", "cannot import weather_plugin:Missing: AttributeError"),
    ("weather_plugin:NotASkill", "weather_plugin:NotASkill is not a subclass of skills.Skill"),
    ("no_such_module:X", "cannot import no_such_module:X: ModuleNotFoundError"),
    # Broken third-party code: one line each, never a traceback (doctor, skills list, run).
    ("weather_plugin:NeedsArguments", "it cannot be created: TypeError: "),
    ("weather_plugin:NoRun", "it cannot be created: TypeError: Can't instantiate abstract class"),
    ("weather_plugin:BadSettingsCheck", "checking its settings failed: KeyError: 'unit'"),
    ("weather_plugin:BadSchema", "weather_plugin:BadSchema: parameters must be a JSON schema object"),
])
def test_a_bad_reference_is_a_config_error_naming_the_entry(tmp_path, plugin_package, ref, expected):
    config = load_config(write_config(tmp_path, f'[skills]\nenabled = ["clock", "{ref}"]\n'))
    with pytest.raises(ConfigError) as err:
        configured_skills(config)
    [problem] = err.value.problems
    assert problem.startswith(f"skills.enabled[1] ({ref!r}): {expected}")


def test_settings_errors_name_the_key(tmp_path, plugin_package):
    assert problems_of(tmp_path, """
        [skills]
        enabled = ["weather", "clock"]
        [skills.weather]
        unit = "K"
        [skills.clock]
        timezone = 3
        timzone = "Europe/Paris"
        [skills.shell]
        timeout = 3
    """) == [
        "skills.weather.unit: expected \"C\" or \"F\", got 'K'",
        "skills.clock.timzone: unknown setting (clock takes only timezone)",  # not silently ignored
        "skills.clock.timezone: unknown time zone 3; use an IANA name such as 'Europe/Paris'",
        "skills.shell: settings for a skill that is not enabled (enabled: weather, clock); "
        "add it to [skills] enabled, or remove the [skills.shell] table",
    ]


def test_a_role_naming_an_unknown_skill_is_refused(tmp_path):
    config = load_config(write_config(tmp_path, '[roles.family]\nskills = ["clock", "shel"]\n'))
    expected = r"roles.family.skills: unknown skill\(s\) \['shel'\]; enabled skills: clock"
    with pytest.raises(ConfigError, match=expected):
        configured_skills(config)


def test_skill_and_role_problems_come_in_one_report(tmp_path):
    assert problems_of(tmp_path, """
        [skills]
        enabled = ["clock", "shel"]
        [skills.email]
        smtp_host = "smtp.example.org"
        [roles.family]
        skills = ["clock", "nosuch", "email", "shel"]
    """) == [
        "skills.enabled[1] ('shel'): no such skill; built-ins and installed entry points: clock, email, "
        'files, memory, reminders, schedule, shell; a SKILL.md skill in skills.dirs; or give a '
        'third-party class as "module:Class"',
        "skills.email: settings for a skill that is not enabled (enabled: clock); "
        "add it to [skills] enabled, or remove the [skills.email] table",
        # "shel" is said once, above: the role is checked against what [skills] meant to enable
        "roles.family.skills: unknown skill(s) ['email', 'nosuch']; enabled skills: clock "
        "(enable more in [skills] enabled)",
    ]


def test_settings_of_an_enabled_skill_that_fails_to_load_are_not_called_unused(tmp_path, plugin_package):
    [problem] = problems_of(tmp_path, """
        [skills]
        enabled = ["clock", "weather_plugin:BadSettingsCheck"]
        [skills.badcheck]
        units = "C"
        [roles.family]
        skills = ["clock", "badcheck"]
    """)
    assert problem.startswith("skills.enabled[1] ('weather_plugin:BadSettingsCheck'): checking its "
                              "settings failed: KeyError: 'unit'")


def test_a_skill_secret_reference_is_resolved_and_a_missing_one_named(tmp_path, plugin_package, monkeypatch):
    path = write_config(tmp_path, '[skills]\nenabled = ["weather"]\n'
                                  '[skills.weather]\napi_key = "env:WEATHER_KEY"\n')
    monkeypatch.delenv("WEATHER_KEY", raising=False)
    missing = "skills.weather.api_key: environment variable WEATHER_KEY is not set"
    with pytest.raises(ConfigError, match=missing):
        configured_skills(load_config(path))
    monkeypatch.setenv("WEATHER_KEY", "k-123")
    registry = configured_skills(load_config(path))
    assert registry.settings("weather") == {"api_key": "k-123"}
    assert "k-123" not in repr(load_config(path))  # the config itself never shows it


async def test_skill_md_folders_are_offered_by_name_and_read_on_demand(tmp_path):
    base = tmp_path / "skills"
    (base / "recipes").mkdir(parents=True)
    (base / "recipes/SKILL.md").write_text(SKILL_MD)
    (base / "recipes/scale.py").write_text("print('x')\n")
    (base / "notes").mkdir()  # a folder without SKILL.md is not a skill
    config = load_config(write_config(tmp_path, """
        [skills]
        enabled = []
        dirs = ["skills"]
        [roles.user]
        skills = ["recipes"]
    """))
    registry = configured_skills(config)
    assert registry.names == ["recipes"]
    assert registry.origin("recipes") == f"SKILL.md: {base / 'recipes'}"
    [spec] = registry.tool_specs()
    assert spec["function"]["name"] == "recipes"
    assert spec["function"]["description"] == "Find and scale cooking recipes."
    assert "multiply" not in str(spec)  # the body costs no prompt tokens until it is read
    executor = Executor(registry, Sandbox())
    principal = config.policy().principal("discord:1")
    out = await executor.call("recipes", {}, principal)
    assert out.ok and "multiply every quantity" in out.text and "scale.py" in out.text
    # Its files are read through it, only those it lists: nothing else of the disk.
    assert (await executor.call("recipes", {"file": "scale.py"}, principal)).text == "print('x')\n"
    os.symlink("/etc/hostname", base / "recipes/host")
    for name in ("../recipes/scale.py", "SKILL.md", "host", "/etc/hostname", "nope.txt"):
        out = await executor.call("recipes", {"file": name}, principal)
        assert not out.ok and "is not one of this skill's files: scale.py" in out.text, out.text


async def test_a_long_skill_md_is_read_a_page_at_a_time(tmp_path):
    from skills.skill_md import PAGE_CHARS

    (tmp_path / "long").mkdir()
    body = "".join(f"step {n}: stir\n" for n in range(4000))  # about 52,000 characters
    (tmp_path / "long/SKILL.md").write_text(f"---\nname: long\ndescription: d\n---\n{body}")
    executor = Executor(load_skills([], [tmp_path / "long"], {}), Sandbox())
    principal = Policy({"r": Role("r", skills=frozenset({"long"}))}, tmp_path, lambda u: "r").principal("x:1")
    read, offset = "", 0
    while True:
        out = await executor.call("long", {"offset": offset}, principal)
        assert out.ok and len(out.text) < PAGE_CHARS + 200, out.text[-200:]
        page, _, note = out.text.partition("\n[cut at character ")
        read += page
        if not note:
            break
        offset = int(note.split("offset=")[1].split()[0])
    assert read == "Instructions of the skill 'long':\n\n" + body.strip()


def notes_skill(tmp_path, monkeypatch=None, swap=None) -> tuple[Executor, Any, Path]:
    """A SKILL.md skill `notes` with notes.txt and sub/deep.txt; with `swap`, the skill's listing
    (the check that a file is one of its own) is followed at once by `swap()`, as a sandboxed
    command writing the folder could do before the read."""
    from skills.skill_md import MarkdownSkill

    folder = tmp_path / "skills/notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: notes\ndescription: d\n---\nRead notes.txt.\n")
    (folder / "notes.txt").write_text("harmless\n")
    (folder / "sub/deep.txt").write_text("deep\n")
    (tmp_path / "secret.txt").write_text("TOP-SECRET\n")
    if swap is not None:
        listed = MarkdownSkill._files

        def listed_then_swapped(self):
            files = listed(self)
            swap(folder)
            return files

        monkeypatch.setattr(MarkdownSkill, "_files", listed_then_swapped)
    executor = Executor(load_skills([], [folder], {}), Sandbox(), timeout_s=2)
    policy = Policy({"r": Role("r", skills=frozenset({"notes"}))}, tmp_path, lambda u: "r")
    return executor, policy.principal("x:1"), folder


async def test_skill_md_files_in_subfolders_are_listed_and_read(tmp_path):
    executor, principal, _ = notes_skill(tmp_path)
    out = await executor.call("notes", {}, principal)
    assert out.ok and "notes.txt, sub/deep.txt" in out.text, out.text
    assert (await executor.call("notes", {"file": "sub/deep.txt"}, principal)).text == "deep\n"


def _file_to_symlink(folder: Path) -> None:
    (folder / "notes.txt").unlink()
    os.symlink(folder.parent.parent / "secret.txt", folder / "notes.txt")


def _folder_to_symlink(folder: Path) -> None:
    elsewhere = folder.parent.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "deep.txt").write_text((folder.parent.parent / "secret.txt").read_text())
    (folder / "sub").rename(folder / "sub.old")
    os.symlink(elsewhere, folder / "sub")


@pytest.mark.parametrize("name, swap", [("notes.txt", _file_to_symlink),
                                        ("sub/deep.txt", _folder_to_symlink)])
async def test_a_skill_md_file_swapped_for_a_symlink_after_the_check_is_not_followed(
        tmp_path, monkeypatch, name, swap):
    executor, principal, _ = notes_skill(tmp_path, monkeypatch, swap)
    out = await executor.call("notes", {"file": name}, principal)
    assert not out.ok and "TOP-SECRET" not in out.text, out.text
    assert "symbolic link, which is not followed" in out.text


async def test_a_skill_md_file_swapped_for_a_fifo_is_refused_without_hanging(tmp_path, monkeypatch):
    def to_fifo(folder: Path) -> None:
        (folder / "notes.txt").unlink()
        os.mkfifo(folder / "notes.txt")

    executor, principal, folder = notes_skill(tmp_path, monkeypatch, to_fifo)
    try:
        out = await executor.call("notes", {"file": "notes.txt"}, principal)  # at most 2 s
        assert not out.ok and "not a regular file" in out.text, out.text
    finally:  # if a thread waits for a writer, let it go: a writer that comes and goes at once
        os.close(os.open(folder / "notes.txt", os.O_RDWR | os.O_NONBLOCK))


async def test_a_skill_md_folder_replaced_after_loading_is_not_read(tmp_path):
    executor, principal, folder = notes_skill(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text((tmp_path / "secret.txt").read_text())
    folder.rename(tmp_path / "notes.old")
    os.symlink(elsewhere, folder)
    for args in ({}, {"file": "notes.txt"}):
        out = await executor.call("notes", args, principal)
        assert not out.ok and "TOP-SECRET" not in out.text, out.text
        assert "was replaced since it was loaded" in out.text and "openclaw reload" in out.text


async def test_a_skill_md_that_is_a_fifo_does_not_hang_loading(tmp_path):
    from skills.skill_md import parse_skill_md

    os.mkfifo(tmp_path / "SKILL.md")
    try:
        with pytest.raises(ValueError, match="SKILL.md is not a regular file"):
            await asyncio.wait_for(asyncio.to_thread(parse_skill_md, tmp_path / "SKILL.md"), 5)
    finally:
        os.close(os.open(tmp_path / "SKILL.md", os.O_RDWR | os.O_NONBLOCK))


def test_two_skills_with_one_name_are_refused(tmp_path):
    (tmp_path / "clock").mkdir()
    (tmp_path / "clock/SKILL.md").write_text("---\nname: clock\ndescription: another clock\n---\n")
    with pytest.raises(SkillLoadError, match="two skills are named 'clock'"):
        load_skills(["clock"], [tmp_path], {})


async def test_front_matter_ends_at_a_line_of_its_own(tmp_path):
    # "---" inside a value is text, not the end of the front matter; the body keeps its own rules.
    (tmp_path / "convert").mkdir()
    (tmp_path / "convert/SKILL.md").write_text(
        "---\r\nname: convert\r\ndescription: Turn a---b ranges into lists\r\n---\r\n"
        "Split at the dashes.\r\n---\r\nMore.\r\n")
    registry = load_skills([], [tmp_path / "convert"], {})
    [spec] = registry.tool_specs()
    assert spec["function"]["description"] == "Turn a---b ranges into lists"
    role = Role("r", skills=frozenset({"convert"}))
    principal = Policy({"r": role}, tmp_path, lambda u: "r").principal("x:1")
    out = await Executor(registry, Sandbox()).call("convert", {}, principal)
    assert out.ok and out.text.replace("\r", "").endswith("\n\nSplit at the dashes.\n---\nMore."), out.text


async def test_hidden_files_of_a_skill_folder_are_neither_listed_nor_read(tmp_path):
    # A skill installed with `git clone`: .git holds dozens of files (and its config may hold the
    # token the clone used); .env is where skills keep API keys. None of it is the model's, and
    # it must not push the skill's own files out of the listing.
    folder = tmp_path / "weather"
    (folder / "references").mkdir(parents=True)
    (folder / "SKILL.md").write_text("---\nname: weather\ndescription: d\n---\nSee references/api.md\n")
    (folder / "references/api.md").write_text("the API\n")
    (folder / ".env").write_text("API_KEY=sk-TOKEN\n")
    for index in range(60):
        (folder / ".git/objects" / f"{index:02x}").mkdir(parents=True)
        (folder / ".git/objects" / f"{index:02x}" / "obj").write_text("x")
    (folder / ".git/config").write_text('[remote "origin"]\nurl = https://x:ghp_TOKEN@github.com/a/b\n')
    executor = Executor(load_skills([], [folder], {}), Sandbox())
    role = Role("r", skills=frozenset({"weather"}))
    principal = Policy({"r": role}, tmp_path, lambda u: "r").principal("x:1")
    out = await executor.call("weather", {}, principal)
    assert out.ok and out.text.endswith("with file=NAME): references/api.md"), out.text
    for name in (".git/config", ".env"):
        out = await executor.call("weather", {"file": name}, principal)
        assert not out.ok and "TOKEN" not in out.text, out.text
    assert (await executor.call("weather", {"file": "references/api.md"}, principal)).text == "the API\n"


def test_a_skill_md_skill_may_also_be_listed_in_enabled_and_a_name_nowhere_is_still_refused(tmp_path):
    (tmp_path / "skills" / "recipes").mkdir(parents=True)
    (tmp_path / "skills" / "recipes" / "SKILL.md").write_text(SKILL_MD)
    listed = """
        [skills]
        enabled = ["clock", "recipes"{more}]
        dirs = ["skills"]
    """
    registry = configured_skills(load_config(write_config(tmp_path, listed.format(more=""))))
    assert registry.names == ["clock", "recipes"]
    assert registry.origin("recipes").startswith("SKILL.md: ")
    assert problems_of(tmp_path, listed.format(more=', "recipe"')) == [
        "skills.enabled[2] ('recipe'): no such skill; built-ins and installed entry points: clock, "
        "email, files, memory, reminders, schedule, shell; a SKILL.md skill in skills.dirs; or give a "
        'third-party class as "module:Class"']
