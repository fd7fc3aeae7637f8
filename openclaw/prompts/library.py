"""`openclaw prompts import DIR`: prompt versions from a folder kept under version control,
DIR/<name>/<version>.md (or .txt), into the store. Every file is read and checked before anything
is stored, and all are stored in one transaction: a bad file stores none."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from engine.chat import TOOLS_PLACEHOLDER, split_tool_instructions
from openclaw.prompts.choice import PROMPT_NAMES, TOOLS
from openclaw.store.prompts import (
    PromptVersion,
    PromptVersionConflict,
    check_version,
)

SUFFIXES = (".md", ".txt")
MAX_PROMPT_BYTES = 64 * 1024  # far above any context's worth; a bigger file is a wrong file


class PromptImportError(ValueError):
    """A file or folder the import cannot take; nothing was stored."""


@dataclass(frozen=True)
class PromptFile:
    name: str
    version: str
    text: str
    path: Path


@dataclass(frozen=True)
class Imported:
    file: PromptFile
    stored: PromptVersion
    added: bool  # False: stored already with this text


class PromptLibraryStore(Protocol):
    async def add_prompt_versions(self, entries: list[tuple[str, str, str]],
                                  author: str) -> list[tuple[PromptVersion, bool]]: ...


def default_author() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container's uid without a passwd entry)
        return "unknown"


def read_prompt_dir(folder: Path) -> list[PromptFile]:
    """Every prompt file under `folder`, checked. Files at its top (a README) and hidden entries
    (.git) are not prompts and are skipped; anything else that does not fit the layout is an
    error naming it."""
    if not folder.is_dir():
        raise PromptImportError(f"{folder} is not a folder (expected {_layout(folder)})")
    files: list[PromptFile] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        _not_a_link(sub, folder)
        if sub.name not in PROMPT_NAMES:
            raise PromptImportError(
                f"{sub}: not a prompt name; the library has {' and '.join(PROMPT_NAMES)} "
                f"(expected {_layout(folder)})")
        files.extend(_read_versions(sub))
    if not files:
        raise PromptImportError(f"no prompt files in {folder} (expected {_layout(folder)})")
    return files


async def import_prompts(store: PromptLibraryStore, folder: Path, author: str) -> list[Imported]:
    """Store the versions under `folder` (see the module); what happened to each file."""
    files = read_prompt_dir(folder)
    try:
        stored = await store.add_prompt_versions([(f.name, f.version, f.text) for f in files],
                                                 author)
    except PromptVersionConflict as exc:
        path = next(f.path for f in files if (f.name, f.version) == (exc.name, exc.version))
        raise PromptImportError(
            f"{path}: {exc.name} {exc.version} is stored already with a different text, and "
            "stored versions never change: save the new text under a new version (a new file "
            "name); nothing was imported") from exc
    by_key = {(f.name, f.version): f for f in files}
    return [Imported(by_key[v.name, v.version], v, added) for v, added in stored]


def _read_versions(sub: Path) -> list[PromptFile]:
    files: dict[str, PromptFile] = {}
    for path in sorted(sub.iterdir()):
        if path.name.startswith("."):
            continue
        _not_a_link(path, sub.parent)
        if not path.is_file() or path.suffix not in SUFFIXES:
            raise PromptImportError(
                f"{path}: not a prompt file; expected <version>.md or <version>.txt here")
        try:
            version = check_version(path.stem)
        except ValueError as exc:
            raise PromptImportError(f"{path}: {exc}") from exc
        if version in files:
            raise PromptImportError(f"{path}: {sub.name} {version} is also in "
                                    f"{files[version].path}; keep one of them")
        files[version] = PromptFile(sub.name, version, _read_text(path, sub.name), path)
    return list(files.values())


def _not_a_link(path: Path, folder: Path) -> None:
    """A prompt folder may come from someone else (a cloned repository): a link in it could make
    any file the admin can read (a token, a key) a system prompt the model repeats on request."""
    if path.is_symlink():
        raise PromptImportError(f"{path}: a symbolic link; prompts are read only from files and "
                                f"folders inside {folder} itself; nothing was imported")


def _read_text(path: Path, name: str) -> str:
    try:  # O_NOFOLLOW: also a link put in place after the look above is not followed
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise PromptImportError(f"{path}: cannot read it ({exc.strerror})") from exc
    with os.fdopen(fd, "rb") as file:
        raw = file.read(MAX_PROMPT_BYTES + 1)
    if len(raw) > MAX_PROMPT_BYTES:
        raise PromptImportError(f"{path}: over {MAX_PROMPT_BYTES} bytes; a prompt is at most "
                                f"{MAX_PROMPT_BYTES}")
    try:
        # Trailing blank lines and the editor's final newline are not part of the prompt.
        text = raw.decode("utf-8").rstrip()
    except UnicodeDecodeError as exc:
        raise PromptImportError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from exc
    if not text:
        raise PromptImportError(f"{path}: empty")
    if name == TOOLS:
        try:  # the engine's own rule, which will read it
            split_tool_instructions(text)
        except ValueError as exc:
            raise PromptImportError(
                f"{path}: a tool-instruction template holds {TOOLS_PLACEHOLDER} once, where the "
                f"tools' descriptions go ({exc})") from exc
    return text


def _layout(folder: Path) -> str:
    return f"{folder}/system/v1.md, {folder}/tools/v1.md, ..."
