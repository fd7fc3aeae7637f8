"""Reading the config file: TOML in, a validated `Config` out, or a `ConfigError` that lists every
problem at once. Also what a command needs without the whole file (`data_dir_of`), and the warning
about secrets written in a file others can read.

Relative paths in the file are relative to the file's own folder (the validation context's
`base_dir`), because a daemon's working directory (`/` under systemd) is never what the admin
had in mind.
"""

from __future__ import annotations

import copy
import logging
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from openclaw.config.engine import OpenAIEngineConfig
from openclaw.config.fields import ConfigPath
from openclaw.config.model import Config, cross_references_of_what_parsed, default_data_dir
from openclaw.config.problems import ConfigError, problem, toml_problem
from openclaw.config.secrets import SECRET_KEY, is_reference, mask_password

log = logging.getLogger(__name__)


def default_config_path() -> Path:
    """`~/.config/openclaw/openclaw.toml`, computed per call so a changed HOME is honoured."""
    return Path("~/.config/openclaw/openclaw.toml").expanduser()


def load_config(path: str | Path | None = None, *, tokens: bool = True, store: bool = True) -> Config:
    """Read and validate the config. None means the default path, where a missing file is fine.

    `tokens=False` leaves the `env:` / `file:` references of the connectors' tokens unread (their
    `get()` raises): for commands that never connect (pairing, users, db...), which an admin runs
    from a shell that lacks the variables and credential files only the service is given.
    `store=False` leaves an `env:` / `file:` `[store] url` as written, for what never opens the
    store either (`service install`)."""
    file, data = _read_toml(path)
    if data is None:
        return Config()
    context = {"base_dir": file.parent, "source": file, "read_tokens": tokens, "read_store_url": store}
    try:
        config = Config.model_validate(data, context=context)
    except ValidationError as exc:
        errors = exc.errors()
        found = [line for err in errors for line in problem(err, Config).split("\n")]
        if any(err["loc"] for err in errors):  # a section failed, so the checks across them did not run
            found += cross_references_of_what_parsed(data, file.parent)
        raise ConfigError(file, found, partial=_without_what_failed(data, errors, context)) from None
    _warn_if_exposed(config, file)
    return config


def _without_what_failed(data: dict[str, Any], errors: list, context: dict[str, Any]) -> Config | None:
    """The config of `data` with each key that failed left out (its default instead): what the
    checks after validation can look at. None when leaving keys out does not make it valid."""
    data = copy.deepcopy(data)
    for _ in range(4):  # a key left out may make another fail (a token once `enabled` is true)
        for err in errors:
            _drop(data, [p for p in err["loc"] if p != "[key]"])
        try:
            return Config.model_validate(data, context=context)
        except ValidationError as exc:
            errors = exc.errors()
    return None


def _drop(data: Any, loc: list[Any]) -> None:
    """Delete the value at `loc` (its innermost table's key that holds it)."""
    for depth in range(len(loc), 0, -1):  # pydantic's loc may go past the TOML (a model's field)
        parent = data
        for part in loc[:depth - 1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict) and loc[depth - 1] in parent:
            del parent[loc[depth - 1]]
            return
        if isinstance(parent, list) and isinstance(loc[depth - 1], int) and loc[depth - 1] < len(parent):
            del parent[loc[depth - 1]]
            return


def data_dir_of(path: str | Path | None = None, *, home: Path | None = None) -> Path:
    """The data_dir the config names, the rest of the file unchecked: what a command that only
    looks for the running daemon needs, run from a shell that may not hold the secrets the file
    names (`env:`, `file:` readable by the service only).

    `home`: the data_dir of a daemon whose HOME that is (a system service's `User=`, whose HOME
    systemd sets), not this shell's: the default and a leading `~/` are under it."""
    file, data = _read_toml(path)
    if data is None or "data_dir" not in data:
        return default_data_dir() if home is None else home / ".local" / "share" / "openclaw"
    value = data["data_dir"]
    if home is not None and isinstance(value, str) and (value == "~" or value.startswith("~/")):
        value = str(home / value[2:])
    try:
        return TypeAdapter(ConfigPath).validate_python(value, context={"base_dir": file.parent})
    except ValidationError as exc:
        raise ConfigError(file, [f"data_dir: {exc.errors()[0]['msg']}"]) from None


def _read_toml(path: str | Path | None) -> tuple[Path, dict[str, Any] | None]:
    """(the file, its TOML tables), None for a default path with no file; ConfigError else."""
    explicit = path is not None
    file = (Path(path).expanduser() if explicit else default_config_path()).absolute()
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        if explicit:  # `openclaw init` alone writes the default path, not this one
            init = "openclaw init" + ("" if file == default_config_path() else
                                      f" --config {shlex.quote(str(file))}")
            raise ConfigError(file, [f"file not found; create one with `{init}`"]) from None
        return file, None
    except OSError as exc:
        raise ConfigError(file, [f"cannot read the file: {exc.strerror or exc}"]) from None
    try:
        return file, tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(file, [f"not UTF-8 text (byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, [toml_problem(exc)]) from None


# --- secrets written in a readable file ----------------------------------------------------------


def _warn_if_exposed(config: Config, file: Path) -> None:
    """Warn (naming the keys, never their values) when the file holds a secret written in it and
    other users may read it."""
    held = exposed_secrets(config, file)
    if held:
        log.warning("%s holds secrets (%s) and other users can read it; run: chmod 600 %s",
                    file, ", ".join(held), file)


def exposed_secrets(config: Config, file: Path) -> list[str]:
    """The keys of secrets written in `file` (not "env:NAME" or "file:PATH" references) when other
    users may read it; [] when they may not, or it holds none."""
    try:
        if not file.stat().st_mode & 0o077:
            return []
    except OSError:
        return []
    held = [f"{name}.token" for name in ("telegram", "discord")
            if (token := getattr(config, name).token) is not None and token.source == "literal"]
    engine = config.engine
    if isinstance(engine, OpenAIEngineConfig) and engine.api_key and engine.api_key.source == "literal":
        held.append("engine.api_key")
    held += [f"skills.{name}.{key}" for name, table in config.skills.settings.items()
             for key, value in table.items()
             if SECRET_KEY.search(key) and isinstance(value, str) and not is_reference(value)]
    if _password_written(file):
        held.append("store.url (a password)")
    return held


def _password_written(file: Path) -> bool:
    """Whether `file` spells out a password in store.url: the loaded URL cannot tell, as an
    "env:NAME" or "file:PATH" there resolved to one that is not in this file."""
    try:
        _, data = _read_toml(file)
    except ConfigError:  # changed since it loaded: the next load says so
        return False
    url = ((data or {}).get("store") or {}).get("url")
    return isinstance(url, str) and not is_reference(url) and mask_password(url) != url
