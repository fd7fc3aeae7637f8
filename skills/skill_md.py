"""Skill folders in OpenClaw's SKILL.md format: YAML front matter (`name`, `description`, optional
metadata) and instructions in the body. The model sees each by name and description like any tool;
calling it returns the instructions (and the folder's other files), so they are read on demand and
cost no prompt tokens until used. Existing OpenClaw skills work unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from skills.base import Skill, SkillContext

MAX_BODY_BYTES = 64 * 1024
MAX_LISTED_FILES = 50


class MarkdownSkill(Skill):
    parameters = {"type": "object", "properties": {}}

    def __init__(self, name: str, description: str, folder: Path, body: str) -> None:
        # Instance attributes shadow the class-level declarations of Skill.
        self.name, self.description = name, description  # type: ignore[misc]
        self.folder, self.body = folder, body

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        files = sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*")
                       if p.is_file() and p.name != "SKILL.md")[:MAX_LISTED_FILES]
        listing = ("\n\nOther files of this skill (in " + str(self.folder) + "): " + ", ".join(files)
                   if files else "")
        return f"Instructions of the skill {self.name!r}:\n\n{self.body.strip()}{listing}"


def parse_skill_md(path: Path) -> tuple[dict[str, Any], str]:
    """(front matter, body) of a SKILL.md file; raises ValueError saying what is wrong."""
    raw = path.read_bytes()
    if len(raw) > MAX_BODY_BYTES:
        raise ValueError(f"{path} is larger than {MAX_BODY_BYTES} bytes")
    try:
        text = raw.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    if not text.startswith("---"):
        raise ValueError(f"{path} has no YAML front matter (a first line '---')")
    _, front, body = (text.split("---", 2) + ["", ""])[:3]
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


def load_skill_dirs(dirs: list[Path]) -> Iterator[tuple[Skill | None, str, str | None]]:
    """(skill, origin, problem) for each SKILL.md found: a listed folder is a skill itself or holds
    skill folders one level down."""
    for base in dirs:
        base = Path(base)
        if not base.is_dir():
            yield None, "", f"{base} is not a folder"
            continue
        candidates = [base] if (base / "SKILL.md").is_file() else sorted(
            p for p in base.iterdir() if (p / "SKILL.md").is_file())
        for folder in candidates:
            path = folder / "SKILL.md"
            try:
                meta, body = parse_skill_md(path)
            except (ValueError, UnicodeDecodeError, OSError) as exc:
                yield None, "", str(exc)
                continue
            name = meta["name"].strip()
            yield MarkdownSkill(name, " ".join(meta["description"].split()), folder, body), \
                f"SKILL.md: {folder}", None
