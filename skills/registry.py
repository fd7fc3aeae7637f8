"""The skills a daemon offers, by name: built-ins, third-party classes (the "openclaw.skills" entry
point group, or "module:Class"), and SKILL.md folders; with each one's settings and origin. Also the
check of a call's arguments against the skill's schema."""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skills.base import Skill

ENTRY_POINT_GROUP = "openclaw.skills"
BUILTINS = {
    "clock": "skills.builtin.clock:ClockSkill",
    "shell": "skills.builtin.shell:ShellSkill",
    "files": "skills.builtin.files:FilesSkill",
    "email": "skills.builtin.email:EmailSkill",
    "reminders": "skills.builtin.reminders:RemindersSkill",
    "memory": "skills.builtin.memory:MemorySkill",
    "schedule": "skills.builtin.schedule:ScheduleSkill",
}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


class SkillLoadError(Exception):
    """Problems loading the configured skills; each names the config key it is about. From
    `load_skills`, also what did load (`registry`) and the enabled names that did not
    (`unresolved`: the reference, and the skill's name when that was learnt), so the roles can be
    checked in the same report."""

    def __init__(self, problems: list[str], registry: SkillRegistry | None = None,
                 unresolved: list[str] | None = None) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.registry = registry
        self.unresolved = list(unresolved or [])


@dataclass
class _Entry:
    skill: Skill
    # "built-in", "entry point from dist 1.0", "entry point 'weather' from dist 1.0" (named unlike
    # its skill), "module:Class", "SKILL.md: /path"
    origin: str
    settings: dict[str, Any]
    entry_point: str | None = None  # the name it was enabled by, when that is not the skill's


class SkillRegistry:
    def __init__(self, skills: list[Skill] | None = None) -> None:
        self._entries: dict[str, _Entry] = {}
        # SKILL.md skills left out (broken, or what they require is missing here): one line each,
        # "NAME (PATH): not offered: WHY", for doctor and the start-up log; and their names, which
        # the config may still name without being told the skill does not exist.
        self.skipped: list[str] = []
        self.skipped_names: set[str] = set()
        for skill in skills or []:
            self.add(skill, "built-in")

    def add(self, skill: Skill, origin: str, settings: dict[str, Any] | None = None, *,
            entry_point: str | None = None) -> None:
        """`entry_point`: the name in `[skills] enabled` that brought it, if not `skill.name`."""
        if skill.name in self._entries:
            raise SkillLoadError([f"two skills are named {skill.name!r} ({self._entries[skill.name].origin}"
                                  f" and {origin})"])
        self._entries[skill.name] = _Entry(skill, origin, dict(settings or {}), entry_point)

    def skip(self, name: str, why: str) -> None:
        self.skipped.append(why)
        self.skipped_names.add(name)

    def get(self, name: str) -> Skill | None:
        entry = self._entries.get(name)
        return entry.skill if entry else None

    def origin(self, name: str) -> str:
        return self._entries[name].origin

    def settings(self, name: str) -> dict[str, Any]:
        return self._entries[name].settings

    def hint(self, name: str) -> str | None:
        """What to write instead of `name`, when it is no skill's name but the entry point that
        enabled a skill named otherwise (the config names skills by their own names); else None."""
        provided = next((n for n, e in self._entries.items() if e.entry_point == name), None)
        if provided is None or name in self._entries:
            return None
        return f"entry point {name!r} provides the skill {provided!r}; use that name"

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def tool_specs(self, allowed: list[str] | None = None) -> list[dict[str, Any]]:
        return [e.skill.spec() for n, e in self._entries.items() if allowed is None or n in allowed]


def load_skills(enabled: list[str], dirs: list[Path], settings: dict[str, dict[str, Any]]) -> SkillRegistry:
    """Build the registry from `[skills]`: `enabled` names built-ins, entry points or "module:Class";
    `dirs` are folders of SKILL.md skills; `settings` are the `[skills.NAME]` tables."""
    registry = SkillRegistry()
    problems: list[str] = []
    unresolved: list[str] = []
    # Names no installed skill has: no problem when a SKILL.md folder in `dirs` is that skill
    # (listed in `enabled` as well, as "only enabled skills are offered" suggests to an admin).
    not_installed: dict[str, list[str]] = {}
    for index, ref in enumerate(enabled):
        cls = None
        try:
            cls, origin, entry_point = _resolve(ref)
            found = _third_party("checking its settings failed", cls.check_settings,
                                 settings.get(cls.name, {}))
            if not isinstance(found, list | tuple):
                raise SkillLoadError([f"check_settings returned {type(found).__name__}, "
                                      "not a list of problems"])
            problems += [f"skills.{cls.name}.{p}" for p in found]
            registry.add(_third_party("it cannot be created", cls), origin,
                         settings.get(cls.name, {}), entry_point=entry_point)
        except SkillLoadError as exc:
            found = [f"skills.enabled[{index}] ({ref!r}): {p}" for p in exc.problems]
            if cls is None and exc.problems[0].startswith(NO_SUCH_SKILL):
                not_installed[ref] = found  # said below, unless `dirs` has it
            else:
                problems += found
            unresolved += [ref] if cls is None or cls.name == ref else [ref, cls.name]
    from skills.skill_md import load_skill_dirs

    for found in load_skill_dirs(dirs):
        if found.problem:
            problems.append(f"skills.dirs: {found.problem}")
        elif found.skipped:
            registry.skip(found.name, found.skipped)
        elif not _NAME.fullmatch(found.name):
            registry.skip(found.name, f"{found.name} ({found.origin.removeprefix('SKILL.md: ')}/SKILL.md):"
                                      f" not offered: name {found.name!r} must be letters, digits, _ or -")
        else:
            try:
                registry.add(found.skill, found.origin, settings.get(found.name, {}))
            except SkillLoadError as exc:
                problems += [f"skills.dirs: {p}" for p in exc.problems]
    known = set(registry.names) | registry.skipped_names  # a skipped one is said so, once
    problems += [p for ref, found in not_installed.items() if ref not in known for p in found]
    # A skill enabled but broken is reported above; its settings are not "for a skill not enabled".
    unused = [n for n in settings if n not in known and n not in unresolved]
    problems += [f"skills.{n}: settings for a skill that is not enabled (enabled: "
                 f"{', '.join(registry.names) or 'none'}); "
                 + (registry.hint(n) or f"add it to [skills] enabled, or remove the [skills.{n}] table")
                 for n in unused]
    if problems:
        raise SkillLoadError(problems, registry, unresolved)
    return registry


NO_SUCH_SKILL = "no such skill"


def installed_names() -> set[str]:
    """What `[skills] enabled` may name without "module:Class": built-ins and entry points."""
    return set(BUILTINS) | {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _resolve(ref: str) -> tuple[type[Skill], str, str | None]:
    """The Skill class `ref` names, where it came from, and the entry point's name when `ref` is
    one and the skill is named otherwise."""
    if ref in BUILTINS:
        return _import(BUILTINS[ref]), "built-in", None
    if ":" in ref:
        return _import(ref), ref, None
    found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == ref]
    if not found:
        raise SkillLoadError([f"{NO_SUCH_SKILL}; built-ins and installed entry points: "
                              f"{', '.join(sorted(installed_names()))}; a SKILL.md skill in "
                              "skills.dirs; or give a third-party class as \"module:Class\""])
    ep = found[0]
    try:
        cls = ep.load()
    except Exception as exc:
        raise SkillLoadError([f"entry point {ep.value} failed to load: {type(exc).__name__}: {exc}"]) from exc
    cls = _check_class(cls, ep.value)
    dist = f" from {ep.dist.name} {ep.dist.version}" if ep.dist else ""
    if ep.name == cls.name:
        return cls, f"entry point{dist}", None
    return cls, f"entry point {ep.name!r}{dist}", ep.name


def _import(target: str) -> type[Skill]:
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise SkillLoadError([f"cannot import {target}: {type(exc).__name__}: {exc}"]) from exc
    return _check_class(obj, target)


def _third_party(what: str, call, *args):
    """`call(*args)` for a skill's own code, which may be broken: its exception becomes a
    problem the admin reads in one line, not a traceback."""
    try:
        return call(*args)
    except SkillLoadError:
        raise
    except Exception as exc:
        raise SkillLoadError([f"{what}: {type(exc).__name__}: {exc}"]) from exc


def _check_class(obj: Any, target: str) -> type[Skill]:
    if not (isinstance(obj, type) and issubclass(obj, Skill)):
        raise SkillLoadError([f"{target} is not a subclass of skills.Skill"])
    missing = [a for a in ("name", "description") if not isinstance(getattr(obj, a, None), str)]
    if missing:
        raise SkillLoadError([f"{target} does not set {' and '.join(missing)}"])
    if not _NAME.fullmatch(obj.name):
        raise SkillLoadError([f"{target}: skill name {obj.name!r} must be letters, digits, _ or -"])
    schema = getattr(obj, "parameters", None)
    if not (isinstance(schema, dict) and schema.get("type", "object") == "object"
            and isinstance(schema.get("properties", {}), dict)
            and isinstance(schema.get("required", []), list)):
        raise SkillLoadError([f"{target}: parameters must be a JSON schema object "
                              '({"type": "object", "properties": {...}}), got '
                              f"{str(schema)[:80]!r}"])
    return obj


def check_arguments(schema: dict[str, Any], args: Any) -> list[str]:
    """Problems with `args` against an object schema: required keys, known keys, value types.
    Enough to give the model a precise error; the skill still validates what it relies on."""
    if not isinstance(args, dict):
        return ["arguments must be a JSON object"]
    problems = []
    props = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in args:
            problems.append(f"missing required argument {key!r}")
    for key, value in args.items():
        if key not in props:
            if schema.get("additionalProperties", True) is False:
                problems.append(f"unknown argument {key!r} (expected: {', '.join(props) or 'none'})")
            continue
        expected = props[key].get("type")
        types = [expected] if isinstance(expected, str) else expected or []
        ok = not types or any(
            isinstance(value, _JSON_TYPES.get(t, object))
            and not (t in ("integer", "number") and isinstance(value, bool)) for t in types)
        if not ok:
            problems.append(f"argument {key!r} must be {' or '.join(types)}, got {type(value).__name__}")
        elif "enum" in props[key] and value not in props[key]["enum"]:
            problems.append(f"argument {key!r} must be one of {props[key]['enum']}, got {value!r}")
    return problems
