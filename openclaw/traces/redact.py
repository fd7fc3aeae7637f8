"""What an export of traces must never hold: every secret the config resolves (the connectors'
tokens, API keys, a skill's password, an MCP server's headers, a database URL's password) and
the paths of private folders (data_dir with the users' workspaces, the roles' workspaces,
`[traces] redact_paths`). `Redactor` replaces them in every string of a message, a tool call's
arguments and a tool spec."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy.engine import make_url

from openclaw.config import Config
from openclaw.config.secrets import SECRET_KEY, BaseDirInfo, Secret, is_reference, resolve_reference

SECRET_MARK = "[REDACTED]"
PATH_MARK = "[PATH]"
# Keys of free-form tables (a skill's settings, an MCP server's env) whose values are credentials:
# the config's own pattern, and an Authorization header's name.
CREDENTIAL_KEY = re.compile(SECRET_KEY.pattern + "|auth", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"://[^:/@\s]*:([^@\s]+)@")
# A credential in a URL's query string: ?api_key=..., &token=...
_URL_QUERY = re.compile(r"[?&]([^=&#\s]+)=([^&#\s]+)")
# An MCP server's env values are taken as credentials whatever their names (GH_PAT, ...) from
# this length on; shorter ones ("1", "true", "en") are settings, and hiding them everywhere
# would garble the export.
ENV_SECRET_CHARS = 8
# Where a path ends in running text: whitespace, quotes, brackets and the like.
_PATH_REST = r"[^\s\"'`<>()\[\]{},;]*"


class SecretsUnreadable(RuntimeError):
    """A secret the config names could not be read, so an export could not redact it."""


def config_secrets(config: Config) -> set[str]:
    """Every credential value the config resolves: what an export must never hold."""
    base = BaseDirInfo(config.source.parent) if config.source else None
    found: set[str] = set()

    def add(value: str) -> None:
        if is_reference(value):
            try:
                value = resolve_reference(value, base)[0]
            except Exception as exc:  # unset variable, unreadable file: never the value
                raise SecretsUnreadable(f"a secret reference {value.split(':')[0]}:... of the "
                                        f"config cannot be read ({exc})") from None
        if value.strip():
            found.add(value)

    def walk(value: Any, key: str = "", credentials: bool = False) -> None:
        # `key`: the name a free-form table gives the value; `credentials`: all of it is (an MCP
        # server's headers).
        if isinstance(value, Secret):
            try:
                found.add(value.get())
            except RuntimeError as exc:
                raise SecretsUnreadable(str(exc)) from None
        elif isinstance(value, str):
            if credentials or CREDENTIAL_KEY.search(key):
                add(value)
            else:
                found.update(_URL_PASSWORD.findall(value))
                found.update(v for k, v in _URL_QUERY.findall(value) if CREDENTIAL_KEY.search(k))
        elif isinstance(value, BaseModel):  # a typed field's credential is a Secret
            for name in type(value).model_fields:
                field = getattr(value, name)
                if name == "env" and isinstance(field, dict):  # an MCP server's: see above
                    field = {k: v for k, v in field.items() if len(str(v)) >= ENV_SECRET_CHARS}
                walk(field, "", name in ("headers", "env"))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            for field in dataclasses.fields(value):
                walk(getattr(value, field.name))
        elif isinstance(value, dict):  # free-form (a skill's settings): the key says
            for k, v in value.items():
                walk(v, str(k), credentials)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item, key, credentials)

    walk(config)
    settings, problems = config.skill_settings()
    if problems:
        raise SecretsUnreadable("; ".join(problems))
    walk(settings)
    if config.store.url and (password := make_url(config.store.url).password):
        found.add(str(password))
    return found


def private_paths(config: Config) -> list[str]:
    """The folders whose paths an export hides: `[traces] redact_paths`, data_dir (the users'
    workspaces are in it by default) and each role's workspace folder (up to its "{user}")."""
    roots = [*config.traces.redact_paths, str(config.data_dir)]
    roots += [role.workspace.split("{user}")[0] for role in config.roles.values() if role.workspace]
    out = set()
    for root in roots:
        path = str(Path(root).expanduser()).rstrip("/")
        if len(path) > 1:  # "/" would hide every path, not a private one
            out.add(path)
            out.add(str(Path(path).resolve()))
    return sorted(out, key=len, reverse=True)


class Redactor:
    """Replaces secrets by SECRET_MARK and private paths (with what follows them) by PATH_MARK."""

    def __init__(self, secrets: Iterable[str] = (), paths: Iterable[str] = ()) -> None:
        forms = set()
        for secret in secrets:
            forms |= {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
        # Longest first: a secret that holds another is replaced whole.
        alternatives = sorted((f for f in forms if f), key=len, reverse=True)
        self._secrets = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        roots = sorted(set(paths), key=len, reverse=True)
        self._paths = (re.compile("(?:" + "|".join(map(re.escape, roots)) + ")" + _PATH_REST)
                       if roots else None)

    @classmethod
    def from_config(cls, config: Config) -> Redactor:
        return cls(config_secrets(config), private_paths(config))

    def text(self, text: str) -> str:
        if self._secrets is not None:
            text = self._secrets.sub(SECRET_MARK, text)
        if self._paths is not None:
            text = self._paths.sub(PATH_MARK, text)
        return text

    def value(self, value: Any) -> Any:
        """`value` with every string in it redacted (dict keys too); a tool call's `arguments`
        JSON text is redacted as the JSON it holds, so an escaped secret is found as well."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out = {self.text(str(k)): self.value(v) for k, v in value.items()}
            if isinstance(value.get("arguments"), str):
                out["arguments"] = self._arguments(value["arguments"])
            return out
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value

    def _arguments(self, text: str) -> str:
        try:
            parsed = json.loads(text)
        except ValueError:
            return self.text(text)
        return json.dumps(self.value(parsed), ensure_ascii=False)
