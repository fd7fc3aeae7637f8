"""The wording of config errors: `ConfigError`, and pydantic's errors turned into one line each that
names the dotted key, shows the value found (never a credential) and says what is expected, with
the likely key when one is unknown."""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import tomllib
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from openclaw.config.secrets import REDACTED, SECRET_KEY, is_reference, mask_password


class ConfigError(Exception):
    """The config cannot be used. `problems` holds one self-contained line per problem. `partial`:
    for a file that failed validation, the config its valid keys make (defaults for the others),
    for the checks that come after validation (skills, the model file) to run in the same report."""

    def __init__(self, path: Path | str | None, problems: list[str], partial: Any = None) -> None:
        self.path = Path(path) if path is not None else None
        self.problems = list(problems)
        self.partial = partial
        where = str(self.path) if self.path is not None else "config"
        super().__init__("\n".join(f"{where}: {p}" for p in self.problems))


_EXPECTED = {
    "model_type": "expected a table",
    "dataclass_type": "expected a table",
    "dict_type": "expected a table",
    "list_type": "expected a list",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
# An unknown key: in a model's table, and in a dataclass's (the [engine] table).
_UNKNOWN_KEY = ("extra_forbidden", "unexpected_keyword_argument")


def problem(err: ErrorDetails, root: type[BaseModel]) -> str:
    """One pydantic error of validating `root` -> `key = value: what is expected`."""
    loc = [p for p in err["loc"] if p != "[key]"]
    key = dotted(loc)
    kind = err["type"]
    if not loc and kind == "value_error":  # a whole-file check; its message names the key itself
        return re.sub(r"^Value error, ", "", err["msg"])
    if kind in _UNKNOWN_KEY:
        hint, meant = _unknown_key_hint(loc, root)
        value = err["input"]
        if isinstance(value, str):  # a mistyped `token`, a password in the wrong table
            value = REDACTED if SECRET_KEY.search(f"{loc[-1]} {meant or ''}") else mask_password(value)
        return f"{key} = {_show(value)}: {hint}"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
    elif kind in _BOUNDS:
        bound = next(iter(err["ctx"].values()))
        expected = f"expected a number {_BOUNDS[kind]} {bound}"
    elif kind == "string_pattern_mismatch" and loc == ["engine", "device"]:
        expected = 'expected "auto", "cpu", "cuda" or "cuda:N"'
    else:
        expected = re.sub(r"^Input should be ", "expected ", re.sub(r"^Value error, ", "", err["msg"]))
    value = err.get("input")
    if loc == ["store", "url"] and isinstance(value, str):
        value = mask_password(value)
    if kind.startswith("secret") and not is_reference(value):
        value = REDACTED  # never echo a literal credential, even a malformed one
    if kind == "list_type" and isinstance(value, str) and value:  # `skills = "*"`, `enabled = "clock"`
        expected += f" (of one: [{json.dumps(value, ensure_ascii=False)}])"
    if value is None:
        return f"{key}: {expected}"
    return f"{key} = {_show(value)}: {expected}"


def toml_problem(exc: tomllib.TOMLDecodeError) -> str:
    """A TOML syntax error as `line L, column C: invalid TOML: ...`."""
    # Python 3.11's TOMLDecodeError only has the position inside its message: "... (at line 3, column 7)".
    message = str(exc)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if m is None:
        return f"invalid TOML: {message}"
    return f"line {m[1]}, column {m[2]}: invalid TOML: {message[: m.start()]}"


def dotted(loc: list[Any]) -> str:
    """A pydantic location as the file's key: `roles.family.read_only[0]`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else json.dumps(part)
            out += f".{name}" if out else name
    return out or "(top level)"


def _show(value: Any) -> str:
    if value is REDACTED:
        return REDACTED
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, dict):
        return "a table"
    elif isinstance(value, Path):
        text = json.dumps(str(value))
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def table_keys(table: type) -> list[str] | None:
    """The keys a table of the file takes (a section model, or the engine's dataclass), less those
    read only to be refused (`hidden_keys`); None for what is not a table."""
    if isinstance(table, type) and issubclass(table, BaseModel):
        names = list(table.model_fields)
    elif isinstance(table, type) and dataclasses.is_dataclass(table):
        names = [field.name for field in dataclasses.fields(table)]
    else:
        return None
    return [name for name in names if name not in getattr(table, "hidden_keys", ())]


def _field_type(table: type, key: str) -> Any:
    if issubclass(table, BaseModel):
        field = table.model_fields.get(key)
        return field.annotation if field is not None else None
    return next((f.type for f in dataclasses.fields(table) if f.name == key), None)


def _unknown_key_hint(loc: list[Any], root: type[BaseModel]) -> tuple[str, str | None]:
    """What to say of an unknown key, and the key it was likely meant to be."""
    table: Any = root
    parts = iter(loc[:-1])
    for part in parts:
        table = _field_type(table, part) if isinstance(part, str) else None
        if get_origin(table) is dict:  # `[roles.NAME]`: skip NAME, look inside the table's model
            table = get_args(table)[1] if next(parts, None) is not None else None
        if table_keys(table) is None:
            return "unknown key", None
    where = f"in [{dotted(loc[:-1])}]" if len(loc) > 1 else "at the top level"
    return unknown_key_hint(str(loc[-1]), table_keys(table) or [], where)


def unknown_key_hint(key: str, keys: list[str], where: str) -> tuple[str, str | None]:
    """What to say of `key`, unknown `where` ("in [engine]"), which takes `keys`; and the key it
    was likely meant to be."""
    close = difflib.get_close_matches(key, keys, n=1)
    if close:
        return f'unknown key {where}; did you mean "{close[0]}"?', close[0]
    return f"unknown key {where}; expected one of: {', '.join(keys)}", None
