"""Skill folders in OpenClaw's SKILL.md format: YAML front matter (`name`, `description`, optional
metadata) and instructions in the body. The model sees each by name and description like any tool;
calling it returns the instructions (and lists the folder's other files, which the same call reads
with `file`), a page at a time, so they are read on demand and cost no prompt tokens until used.
Existing OpenClaw skills work unchanged."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from skills.base import Skill, SkillContext, SkillError
from skills.fileio import FILE_FLAGS, open_beneath, pread_all
from skills.skill_requires import unmet

MAX_BODY_BYTES = 64 * 1024
MAX_LISTED_FILES = 50
MAX_WALK_ENTRIES = 1000  # files and folders looked at to list a skill's files
MAX_FILE_BYTES = 256 * 1024  # of a file the skill bundles, read through it
PAGE_CHARS = 12_000  # per call, under the executor's result limit, with a way to read on


class MarkdownSkill(Skill):
    parameters = {
        "type": "object",
        "properties": {
            "file": {"type": "string",
                     "description": "one of the skill's other files, to read it (default: its instructions)"},
            "offset": {"type": "integer",
                       "description": "the character to read on from, when a text was cut"},
        },
        "additionalProperties": False,
    }

    def __init__(self, name: str, description: str, folder: Path, body: str) -> None:
        # Instance attributes shadow the class-level declarations of Skill.
        self.name, self.description = name, description  # type: ignore[misc]
        self.folder, self.body = folder, body
        # The folder as loaded: the admin's path may go through symlinks, but a folder swapped in
        # there later (by whoever can write its parent) is not this skill's and is not read.
        st = os.stat(folder)
        self._identity = (st.st_dev, st.st_ino)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        offset = args.get("offset", 0)
        if offset < 0:
            raise SkillError(f"offset must be 0 or more, got {offset}")
        if "file" in args:
            text = await asyncio.to_thread(self._file_text, args["file"])
        else:
            files = self._files()
            listing = (f"\n\nOther files of this skill (read one by calling {self.name} with "
                       f"file=NAME): {', '.join(files)}" if files else "")
            text = f"Instructions of the skill {self.name!r}:\n\n{self.body.strip()}{listing}"
        page = text[offset:offset + PAGE_CHARS]
        if offset + PAGE_CHARS < len(text):
            page += (f"\n[cut at character {offset + PAGE_CHARS:,} of {len(text):,}; call again "
                     f"with offset={offset + PAGE_CHARS} to read on]")
        return page

    def _files(self) -> list[str]:
        """The skill's regular files below its folder (not SKILL.md), walked by descriptor: symlinks
        are neither listed nor followed into. Folder by folder, nearest first, and only the first
        MAX_WALK_ENTRIES entries: whoever can write in the folder could fill it with millions."""
        found: list[str] = []
        folders: deque[tuple[str, ...]] = deque([()])
        seen = 0
        root = self._open_folder()
        try:
            while folders and seen < MAX_WALK_ENTRIES:
                parts = folders.popleft()
                try:
                    fd = open_beneath(root, parts, os.O_RDONLY | os.O_DIRECTORY) if parts else os.dup(root)
                except OSError:
                    continue  # gone, or swapped for a symlink since it was seen: not followed
                try:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            seen += 1
                            if seen > MAX_WALK_ENTRIES:
                                break
                            # Hidden files and folders are not the skill's to show: .git (dozens of
                            # files, and a config that may hold the clone's token), .env (API keys),
                            # editors' state.
                            if entry.name.startswith("."):
                                continue
                            if entry.is_dir(follow_symlinks=False):
                                folders.append((*parts, entry.name))
                            elif entry.is_file(follow_symlinks=False) and entry.name != "SKILL.md":
                                found.append("/".join((*parts, entry.name)))
                finally:
                    os.close(fd)
        finally:
            os.close(root)
        return sorted(found)[:MAX_LISTED_FILES]

    def _file_text(self, name: str) -> str:
        """One of the files listed with the instructions: only those, so nothing outside the
        skill's folder (no '..', no symlink) and nothing it did not list."""
        files = self._files()
        if name not in files:
            raise SkillError(f"{name!r} is not one of this skill's files: {', '.join(files) or 'none'}")
        data = self._read(name)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise SkillError(f"{name} is not text (not UTF-8)") from None

    def _read(self, name: str) -> bytes:
        """The listed file `name`, read through descriptors, so what is read is what was checked: a
        symlink or FIFO put in its place since the listing is refused, not followed or waited on."""
        folder = self._open_folder()
        try:
            fd = open_beneath(folder, tuple(name.split("/")), os.O_RDONLY)
        except OSError as exc:
            why = ("it, or a folder on its way, is now a symbolic link, which is not followed"
                   if exc.errno in (errno.ELOOP, errno.ENOTDIR) else exc.strerror)
            raise SkillError(f"{name} of the skill {self.name!r} could not be read: {why}") from None
        finally:
            os.close(folder)
        try:
            return _read_regular(fd, MAX_FILE_BYTES, name)
        finally:
            os.close(fd)

    def _open_folder(self) -> int:
        try:
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise SkillError(f"the folder of the skill {self.name!r} ({self.folder}) cannot be opened: "
                             f"{exc.strerror}") from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            raise SkillError(f"the folder of the skill {self.name!r} ({self.folder}) was replaced since "
                             "it was loaded; nothing was read (an admin can load it again with "
                             "`openclaw reload`)")
        return fd


def _read_regular(fd: int, limit: int, name: str) -> bytes:
    """At most `limit` bytes of the regular file open at `fd`, or a SkillError."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SkillError(f"{name} is not a regular file (a pipe, device or folder); not read")
    data = pread_all(fd, limit + 1, 0)
    if max(st.st_size, len(data)) > limit:
        raise SkillError(f"{name} is larger than {limit:,} bytes")
    return data


def parse_skill_md(path: Path) -> tuple[dict[str, Any], str]:
    """(front matter, body) of a SKILL.md file; raises ValueError saying what is wrong."""
    # Non-blocking and only a regular file: a FIFO put there must not hang loading or a reload.
    fd = os.open(path, os.O_RDONLY | (FILE_FLAGS & ~os.O_NOFOLLOW))
    try:
        raw = _read_regular(fd, MAX_BODY_BYTES, str(path))
    except SkillError as exc:
        raise ValueError(str(exc)) from None
    finally:
        os.close(fd)
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    front, body = _split_front_matter(text, path)
    try:
        meta = yaml.safe_load(front)
    except yaml.YAMLError as exc:
        # One line: PyYAML's message spans several, with a caret drawing.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""  # front starts on line 1
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ValueError(f"{path}: front matter is not valid YAML{where}: {what}") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: front matter must be a mapping with name and description")
    for key in ("name", "description"):
        if not isinstance(meta.get(key), str) or not meta[key].strip():
            raise ValueError(f"{path}: front matter needs a non-empty {key!r}")
    return meta, body


def _split_front_matter(text: str, path: Path) -> tuple[str, str]:
    """(front matter, body): the front matter runs from a first line "---" to the next line that
    is "---" and nothing else; a "---" inside a value is text. The front matter keeps a leading
    line break, so a YAML error's line number is the file's."""
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        raise ValueError(f"{path} has no YAML front matter (a first line '---')")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "---"), None)
    if end is None:
        # Read as YAML, the instructions would become keys and the skill would load with none.
        raise ValueError(f"{path}: front matter is not closed: add a line '---' after the name and "
                         "description, before the instructions")
    return "\n" + "\n".join(lines[1:end]) + "\n", "\n".join(lines[end + 1:])


@dataclass
class Found:
    """A SKILL.md in `[skills] dirs`: a skill to offer; or one left out (`skipped`: why, one line
    naming the file; `name`: its front matter's, else its folder's), which stops nothing else; or a
    `problem` of the config itself (a listed path that is no folder)."""

    skill: MarkdownSkill | None = None
    origin: str = ""
    name: str = ""
    skipped: str | None = None
    problem: str | None = None


def load_skill_dirs(dirs: list[Path]) -> Iterator[Found]:
    """Each SKILL.md found: a listed folder is a skill itself or holds skill folders one level
    down. A broken one, or one whose `requires` are not met here, is left out, not fatal: one
    downloaded skill must not keep the daemon from starting."""
    for base in dirs:
        base = Path(base)
        if not base.is_dir():
            yield Found(problem=f"{base} is not a folder")
            continue
        candidates = [base] if (base / "SKILL.md").is_file() else sorted(
            p for p in base.iterdir() if (p / "SKILL.md").is_file())
        for folder in candidates:
            yield _load_folder(folder)


def _load_folder(folder: Path) -> Found:
    path = folder / "SKILL.md"
    name = folder.name
    try:
        meta, body = parse_skill_md(path)
        name = meta["name"].strip()
        if why := unmet(meta):
            return Found(name=name, skipped=f"{name} ({path}): not offered: {'; '.join(why)}")
        skill = MarkdownSkill(name, " ".join(meta["description"].split()), folder, body)
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        # The messages start with the file's path, said once here.
        why = str(exc).removeprefix(f"{path}: ")
        why = f"SKILL.md {why.removeprefix(f'{path} ')}" if why.startswith(f"{path} ") else why
        return Found(name=name, skipped=f"{name} ({path}): not offered: {why}")
    return Found(skill, f"SKILL.md: {folder}", name)
