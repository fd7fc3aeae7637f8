"""Credentials in the config: `Secret`, and the `env:NAME` / `file:PATH` references that give them.

A value is never echoed: `Secret` prints as `***`, errors name the reference and never the value,
and what only looks like a credential (a skill's `*password*` setting, a URL's password) is masked
wherever the config is shown.
"""

from __future__ import annotations

import hmac
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationInfo
from pydantic_core import PydanticCustomError, core_schema

REDACTED = "***"
# Keys whose values are credentials: a skill's settings are free-form, so the name is all there is.
SECRET_KEY = re.compile(r"pass|token|secret|key|credential", re.IGNORECASE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_reference(value: object) -> bool:
    """Whether `value` is an "env:NAME" or "file:PATH" reference rather than a value."""
    return isinstance(value, str) and value.startswith(("env:", "file:"))


class Secret:
    """A credential from the config: the value is only reachable through `.get()`.

    In the file it is `"env:NAME"` (read from the environment at load), `"file:PATH"` (the file's
    contents, stripped; systemd credentials and Docker secrets look like this) or a literal.
    `str()`, `repr()` and pydantic dumps all give `***`, so logging a config never leaks one.
    """

    __slots__ = ("_value", "source", "_unread")

    def __init__(self, value: str, source: Literal["env", "file", "literal"] = "literal", *,
                 unread: bool = False) -> None:
        self._value = value  # with `unread`, the "env:NAME" / "file:PATH" reference itself
        self.source = source  # where it came from; `openclaw doctor` can say so without the value
        self._unread = unread

    def get(self) -> str:
        if self._unread:  # a command that never connects loaded the file (load_config's tokens)
            raise RuntimeError(f"the secret {self._value} was not read: the config was loaded "
                               "without the connectors' tokens")
        return self._value

    def __str__(self) -> str:
        return REDACTED

    def __repr__(self) -> str:
        return f"Secret({REDACTED!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return self._unread == other._unread and \
            hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            _validate_secret,
            serialization=core_schema.plain_serializer_function_ser_schema(lambda _: REDACTED),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {"type": "string", "writeOnly": True, "description": 'literal, "env:NAME" or "file:PATH"'}


def base_dir(info: ValidationInfo | BaseDirInfo | None) -> Path:
    """The folder relative paths are resolved against: the config file's, else the cwd."""
    context = info.context if info is not None else None
    if isinstance(context, dict) and context.get("base_dir") is not None:
        return Path(context["base_dir"])
    return Path.cwd()


class BaseDirInfo:
    """Just enough of ValidationInfo for resolve_reference outside validation."""

    def __init__(self, base_dir: Path) -> None:
        self.context = {"base_dir": base_dir}


def resolve_reference(value: str, info: ValidationInfo | BaseDirInfo | None) -> tuple[str, str]:
    """`env:NAME` / `file:PATH` / literal -> (value, source). Errors never contain the value."""
    if value.startswith("env:"):
        name = value[4:]
        if not _ENV_NAME.fullmatch(name):
            raise PydanticCustomError("secret_ref", "expected env:NAME with NAME a variable name")
        if name not in os.environ:
            raise PydanticCustomError(
                "secret_ref", "environment variable {name} is not set; export it or use file:PATH",
                {"name": name},
            )
        resolved, source = os.environ[name], "env"
    elif value.startswith("file:"):
        path = Path(value[5:]).expanduser()
        if not path.is_absolute():
            path = base_dir(info) / path
        try:
            resolved = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise PydanticCustomError(
                "secret_ref", "cannot read secret file {path}: {reason}",
                {"path": str(path), "reason": reason},
            ) from None
        source = "file"
    else:
        resolved, source = value, "literal"
    if not resolved.strip():
        raise PydanticCustomError("secret_ref", "the value is empty")
    return resolved, source


def _validate_secret(value: Any, info: ValidationInfo) -> Secret:
    if isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("secret_type", 'expected a string: a literal, "env:NAME" or "file:PATH"')
    context = info.context if isinstance(info.context, dict) else {}
    if not context.get("read_tokens", True) and is_reference(value):
        # Not read: the service's environment and credential files are not the admin shell's.
        if value.startswith("env:") and not _ENV_NAME.fullmatch(value[4:]):
            raise PydanticCustomError("secret_ref", "expected env:NAME with NAME a variable name")
        return Secret(value, "env" if value.startswith("env:") else "file", unread=True)
    resolved, source = resolve_reference(value, info)
    return Secret(resolved, source)  # type: ignore[arg-type]


def resolve_skill_secrets(name: str, table: dict[str, Any], base: Path | None) -> tuple[
        dict[str, Any], list[str]]:
    """A skill's settings with "env:NAME" / "file:PATH" references in credential-like keys
    resolved, for handing to the skill (skills never see the config machinery); and problems."""
    info = None if base is None else BaseDirInfo(base)
    resolved, problems = {}, []
    for key, value in table.items():
        if SECRET_KEY.search(key) and isinstance(value, str):
            try:
                value = resolve_reference(value, info)[0]
            except PydanticCustomError as exc:
                problems.append(f"skills.{name}.{key}: {exc.message()}")
        resolved[key] = value
    return resolved, problems


def redact_settings(table: dict[str, Any]) -> dict[str, Any]:
    """Skill settings are free-form until each skill types them: mask what looks like a credential."""
    return {
        k: (REDACTED if SECRET_KEY.search(k) and isinstance(v, str) and not v.startswith("env:") else v)
        for k, v in table.items()
    }


def mask_password(url: str | None) -> str | None:
    """`url` with its password, if any, shown as ***."""
    # Up to the last "@": SQLAlchemy's password runs to an "@", and may hold "/", ":" or "?"
    # (one with an "@" unencoded is cut there, but the rest is as secret).
    return url if url is None else re.sub(r"(://[^:/@]*:).*@", rf"\1{REDACTED}@", url)
