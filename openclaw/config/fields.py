"""The value types the config's sections share: paths relative to the file, users, URLs, and the
`[engine]` table, which validates into the engine's own EngineConfig."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, PlainValidator, ValidationInfo
from pydantic_core import PydanticCustomError, core_schema

from engine.config import EngineConfig
from openclaw.config.secrets import BaseDirInfo, base_dir

LOCAL_USER = "terminal:local"  # whoever holds the console owns the daemon
CHANNELS = ("telegram", "discord", "terminal")


class Section(BaseModel):
    """A table of the file."""

    # forbid: a typo such as `dm_polcy` is an error, not a silently ignored key.
    # strict: TOML has real types, so `port = "9477"` is a mistake worth reporting.
    model_config = ConfigDict(extra="forbid", strict=True)


def validate_path(value: Any, info: ValidationInfo | BaseDirInfo | None) -> Path:
    """A path of the file: `~` expanded, a relative one taken from the config file's folder (a
    daemon's cwd, `/` under systemd, is never what the admin meant)."""
    if not isinstance(value, (str, Path)) or not str(value):
        raise PydanticCustomError("path_type", "expected a path (a non-empty string)")
    path = Path(value).expanduser()
    return path if path.is_absolute() else base_dir(info) / path


ConfigPath = Annotated[Path, PlainValidator(validate_path)]

_USER_RE = re.compile(r"(?P<channel>[a-z][a-z0-9_-]*):(?P<id>\S+)")


def validate_user(name: str) -> str:
    """`name` if it is a user who can exist ("channel:id"); else ValueError saying the fix to the
    mistakes admins really make."""
    m = _USER_RE.fullmatch(name)
    if m is None:
        raise ValueError(
            'expected a user "channel:id", e.g. "telegram:1001", "discord:42" or "terminal:local"'
        )
    channel, ident = m["channel"], m["id"]
    if channel not in CHANNELS:
        close = difflib.get_close_matches(channel, CHANNELS, n=1)
        hint = f'did you mean "{close[0]}"? ' if close else ""
        raise ValueError(f'unknown channel "{channel}"; {hint}channels are {", ".join(CHANNELS)}')
    if channel in ("telegram", "discord") and not re.fullmatch(r"[0-9]+", ident):
        # Usernames can be changed and taken over; the numeric id is what the connector sees.
        raise ValueError(
            f'{channel} users are named by their numeric id, e.g. "{channel}:1001", not a username'
        )
    if channel == "terminal" and name != LOCAL_USER:
        # The terminal connector only ever sees the console's owner: any other entry matches no one.
        raise ValueError(
            f'the terminal has one user, "{LOCAL_USER}" (the console\'s owner), so "{name}" is no one; '
            'other users are "telegram:ID" or "discord:ID"'
        )
    return name


def require_str(value: Any) -> str:
    """`value` if it is a string; else the error a strict string field gives."""
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "expected a string")
    return value


UserName = Annotated[str, PlainValidator(lambda v: validate_user(require_str(v)))]


def check_url(value: str | None, schemes: tuple[str, ...]) -> str | None:
    if value is not None and not value.startswith(tuple(f"{s}://" for s in schemes)):
        raise ValueError(f"expected a URL starting with {' or '.join(s + '://' for s in schemes)}")
    return value


class _EngineTable:
    """Validates `[engine]` into engine.EngineConfig itself, so the engine's defaults and bounds (its
    fields' metadata) are the file's. pydantic builds the schema from the dataclass; this marker
    adjusts it for a TOML table: a table is accepted (strict mode alone takes only an instance)
    while each field stays strict, and `model` is a path of the file."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        schema = handler(source)
        dataclass = handler.resolve_ref_schema(schema)
        assert dataclass["type"] == "dataclass", dataclass["type"]
        dataclass["strict"] = False
        for field in dataclass["schema"]["fields"]:
            if field["name"] == "model":  # inside its default: an absent key stays None
                default = field["schema"]
                assert default["type"] == "default", default["type"]
                default["schema"] = core_schema.with_info_before_validator_function(
                    _model_path, default["schema"])
        return schema


def _model_path(value: Any, info: ValidationInfo) -> Any:
    return value if value is None else str(validate_path(value, info))


EngineTable = Annotated[EngineConfig, _EngineTable()]
