"""The skills a daemon offers, by name, and the check of a call's arguments against the schema."""

from __future__ import annotations

from typing import Any

from skills.base import Skill

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


class SkillRegistry:
    def __init__(self, skills: list[Skill]) -> None:
        self._skills = {s.name: s for s in skills}

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._skills)

    def tool_specs(self, allowed: list[str] | None = None) -> list[dict[str, Any]]:
        return [s.spec() for n, s in self._skills.items() if allowed is None or n in allowed]


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
    return problems


def default_registry(enabled: list[str]) -> SkillRegistry:
    """The built-ins named in `enabled`. The sandbox issue adds shell, files, email and plugins."""
    from skills.builtin.clock import ClockSkill

    builtins = {ClockSkill.name: ClockSkill}
    unknown = [n for n in enabled if n not in builtins]
    if unknown:
        raise ValueError(f"skills.enabled: unknown skill(s) {unknown}; available: {list(builtins)}")
    return SkillRegistry([builtins[n]() for n in enabled])
