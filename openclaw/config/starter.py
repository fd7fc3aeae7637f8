"""The commented starter config `openclaw init` writes (starter.toml beside this module), and
writing it without ever losing the admin's own file."""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

from openclaw.config.load import default_config_path


def starter_config() -> str:
    """The commented starter file `openclaw init` writes; it loads to the default config."""
    return files(__package__).joinpath("starter.toml").read_text(encoding="utf-8")


def write_starter_config(path: str | Path | None = None, force: bool = False) -> Path:
    """Write `starter_config()` to `path` (default: the default config path), mode 0600.

    Refuses to replace an existing file unless `force`: it may hold the admin's tokens. Replaced,
    the old file is kept beside it as `<name>.bak` (0600: it may hold them).
    """
    file = Path(path).expanduser() if path is not None else default_config_path()
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = starter_config().encode()
    if not force:
        try:
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise FileExistsError(
                f"{file} already exists; keep it, or replace it with `openclaw init --force`"
            ) from None
        _write_all(fd, data)
        return file
    # An edited config is hours of work: --force keeps a copy, first (a copy it cannot make stops
    # it). Not of a starter config: a second --force would put it in place of the edited one.
    try:
        old = file.read_bytes()
    except FileNotFoundError:
        old = data
    except OSError as exc:
        raise OSError(exc.errno, f"cannot read {file} to keep a copy of it ({exc.strerror}); "
                      "move it away first") from None
    if old != data:
        fd = os.open(backup_path(file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_all(fd, old)
    # Replace atomically, so an interrupted --force never leaves a half-written config.
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_all(fd, data)
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return file


def backup_path(config: Path) -> Path:
    """Where `openclaw init --force` keeps the config it replaced."""
    return config.with_name(config.name + ".bak")


def _write_all(fd: int, data: bytes) -> None:
    try:
        os.fchmod(fd, 0o600)  # exact, whatever the umask or a previous file's mode
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(fd)
    finally:
        os.close(fd)
