"""The prompt library's rows (openclaw/prompts/ decides with them): versions of named prompts,
immutable once stored; per name the active version and any A/B split; users' pins. And one
cached read of all that a turn needs (`prompt_snapshot`), so a turn costs no store round trip."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import StoreBase, memory_first, to_record
from openclaw.store.loop_writer import NOT_DONE
from openclaw.store.models import PromptPinRow, PromptSettingRow, PromptVersionRow
from openclaw.store.records import parse_user_key

# A name is a folder of the import layout, a version its file's stem; both go into labels
# ("system=v3;tools=builtin"), so neither may hold '=' or ';'.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,63}")
VERSION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
# How old a snapshot a turn may use: the CLI writes from another process, whose change is seen
# within this many seconds (a turn within it reads nothing from the store).
SNAPSHOT_MAX_AGE_S = 5.0
AUTHOR_CHARS = 128  # the column's width


def _kept_snapshot(store: Any, max_age_s: float = SNAPSHOT_MAX_AGE_S) -> Any:
    """prompt_snapshot's answer from memory, while the one kept is younger than `max_age_s`."""
    snapshot = store._prompt_snapshot
    if snapshot is not None and time.monotonic() - store._prompt_read_at < max_age_s:
        return snapshot
    return NOT_DONE


@dataclass(frozen=True)
class PromptVersion:
    id: int
    name: str
    version: str
    text: str
    author: str
    created_at: datetime
    parent_id: int | None


@dataclass(frozen=True)
class PromptSetting:
    name: str
    active: str | None = None
    variants: dict[str, int] | None = None  # version -> weight, while an A/B test runs


@dataclass(frozen=True)
class PromptSnapshot:
    """What deciding a user's prompts reads: every name's setting, every pin, and the text of
    each version those name."""

    settings: Mapping[str, PromptSetting] = field(default_factory=dict)
    pins: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (user, name) -> version
    texts: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (name, version) -> text


class PromptVersionConflict(ValueError):
    """A version stored already, with another text: versions are immutable."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(f"prompt {name} {version} is stored already with a different text; "
                         "versions never change: give the new text a new version")
        self.name, self.version = name, version


class UnknownPromptVersion(LookupError):
    """A version named to activate, split or pin that is not stored."""


def version_key(version: str) -> tuple:
    """Natural order: v2 before v10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.findall(r"\d+|\D+", version))


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"prompt name {name!r}: use lower-case letters, digits, '_' and '-' "
                         "(64 at most), starting with a letter")
    return name


def check_version(version: str) -> str:
    if not VERSION_PATTERN.fullmatch(version):
        raise ValueError(f"prompt version {version!r}: use letters, digits, '.', '_' and '-' "
                         "(32 at most), starting with a letter or digit, e.g. v3")
    return version


class PromptStore(StoreBase):
    """The Store's prompt library."""

    _prompt_snapshot: PromptSnapshot | None = None
    _prompt_read_at: float = 0.0  # time.monotonic() of the snapshot's read

    async def add_prompt_versions(self, entries: Sequence[tuple[str, str, str]],
                                  author: str) -> list[tuple[PromptVersion, bool]]:
        """Store each (name, version, text), in one transaction; per entry its record and whether
        it was added (False: stored already with this text). A version stored with another text
        raises PromptVersionConflict and stores none of them. Each new version's parent is the
        latest stored version of its name before it in natural order (v2 before v10)."""
        for name, version, _ in entries:
            check_name(name), check_version(version)
        if not 0 < len(author) <= AUTHOR_CHARS:
            raise ValueError(f"a prompt's author is 1 to {AUTHOR_CHARS} characters: {author!r}")

        async def op(session: AsyncSession) -> list[tuple[PromptVersion, bool]]:
            names = {name for name, _, _ in entries}
            stored = {(r.name, r.version): r for r in await session.scalars(
                select(PromptVersionRow).where(PromptVersionRow.name.in_(names)))}
            out = []
            for name, version, text in sorted(entries, key=lambda e: (e[0], version_key(e[1]))):
                row = stored.get((name, version))
                if row is not None:
                    if row.text != text:
                        raise PromptVersionConflict(name, version)
                    out.append((to_record(PromptVersion, row), False))
                    continue
                earlier = [r for (n, v), r in stored.items()
                           if n == name and version_key(v) < version_key(version)]
                parent = max(earlier, key=lambda r: version_key(r.version), default=None)
                row = PromptVersionRow(name=name, version=version, text=text, author=author,
                                       created_at=self.now(),
                                       parent_id=parent.id if parent else None)
                session.add(row)
                await session.flush()
                stored[(name, version)] = row
                out.append((to_record(PromptVersion, row), True))
            return out

        added = await self.retrying(op)
        self.forget_prompt_snapshot()
        return added

    async def prompt_versions(self, name: str | None = None) -> list[PromptVersion]:
        """Every stored version (of `name`), by name and then natural version order."""
        query = select(PromptVersionRow)
        if name is not None:
            query = query.where(PromptVersionRow.name == name)
        async with self.transaction() as session:
            rows = [to_record(PromptVersion, r) for r in await session.scalars(query)]
        return sorted(rows, key=lambda r: (r.name, version_key(r.version)))

    async def prompt_settings(self) -> dict[str, PromptSetting]:
        async with self.transaction() as session:
            return {r.name: PromptSetting(r.name, r.active, r.variants)
                    for r in await session.scalars(select(PromptSettingRow))}

    async def prompt_pins(self) -> dict[tuple[str, str], str]:
        """(user, name) -> version, for every pin."""
        async with self.transaction() as session:
            return {(r.user, r.name): r.version for r in await session.scalars(select(PromptPinRow))}

    async def activate_prompt(self, name: str, version: str) -> PromptSetting:
        """Make `version` the one `name` is answered with, ending any A/B split of it (pins
        stay). Returns the setting before."""
        return await self._set_prompt(name, [version], lambda before: (version, None))

    async def set_prompt_variants(self, name: str, variants: dict[str, int] | None) -> PromptSetting:
        """Split the users of `name` between these versions by weight (None: end the split).
        Returns the setting before."""
        if variants is not None and (not variants or any(
                not isinstance(w, int) or isinstance(w, bool) or w <= 0 for w in variants.values())):
            raise ValueError(f"the weights of an A/B split are positive whole numbers: {variants}")
        split = dict(variants) if variants else None
        return await self._set_prompt(name, list(split or ()), lambda before: (before.active, split))

    async def pin_prompt(self, user: str, name: str, version: str) -> str | None:
        """Give `user` this version of `name` whatever its setting; the version pinned before."""
        parse_user_key(user)

        async def op(session: AsyncSession) -> str | None:
            await _require_versions(session, name, [version])
            row = await session.get(PromptPinRow, (user, name))
            before = row.version if row is not None else None
            if row is None:
                session.add(PromptPinRow(user=user, name=name, version=version))
            else:
                row.version = version
            await session.flush()
            return before

        before = await self.retrying(op)
        self.forget_prompt_snapshot()
        return before

    async def unpin_prompt(self, user: str, name: str) -> bool:
        """False when `user` had no pin of `name`."""
        async with self.transaction() as session:
            result = await session.execute(delete(PromptPinRow).where(
                PromptPinRow.user == user, PromptPinRow.name == name))
        self.forget_prompt_snapshot()
        return result.rowcount == 1

    @memory_first(_kept_snapshot)
    async def prompt_snapshot(self, max_age_s: float = SNAPSHOT_MAX_AGE_S) -> PromptSnapshot:
        """Every setting, every pin, and the texts they name: kept from the last read while it is
        younger than `max_age_s`, so a turn reads nothing in the common case (_kept_snapshot).
        This process's own writes drop it at once; another's (the CLI) are seen within
        `max_age_s`."""
        read_at = time.monotonic()
        async with self.transaction() as session:
            settings = {r.name: PromptSetting(r.name, r.active, r.variants)
                        for r in await session.scalars(select(PromptSettingRow))}
            pins = {(r.user, r.name): r.version for r in await session.scalars(select(PromptPinRow))}
            named = {(n, v) for (_, n), v in pins.items()} | set(_in_use(settings.values()))
            texts: dict[tuple[str, str], str] = {}
            if named:
                rows = await session.execute(
                    select(PromptVersionRow.name, PromptVersionRow.version, PromptVersionRow.text)
                    .where(tuple_(PromptVersionRow.name, PromptVersionRow.version).in_(sorted(named))))
                texts = {(n, v): t for n, v, t in rows}
        snapshot = PromptSnapshot(settings, pins, texts)
        self._prompt_snapshot, self._prompt_read_at = snapshot, read_at
        return snapshot

    def forget_prompt_snapshot(self) -> None:
        """The next `prompt_snapshot` reads the store (this process wrote, or a reload asks)."""
        self._prompt_snapshot = None

    async def _set_prompt(self, name: str, versions: list[str],
                          change: Callable[[PromptSetting], tuple[str | None, dict[str, int] | None]]
                          ) -> PromptSetting:
        async def op(session: AsyncSession) -> PromptSetting:
            await _require_versions(session, name, versions)
            row = await session.get(PromptSettingRow, name)
            if row is None:
                row = PromptSettingRow(name=name)
                session.add(row)
                before = PromptSetting(name)
            else:
                before = PromptSetting(name, row.active, row.variants)
            row.active, row.variants = change(before)
            await session.flush()  # a concurrent first setting of the name loses here: retried
            return before

        before = await self.retrying(op)
        self.forget_prompt_snapshot()
        return before


def _in_use(settings: Iterable[PromptSetting]) -> Iterable[tuple[str, str]]:
    for setting in settings:
        if setting.active is not None:
            yield setting.name, setting.active
        yield from ((setting.name, v) for v in setting.variants or ())


async def _require_versions(session: AsyncSession, name: str, versions: list[str]) -> None:
    stored = set(await session.scalars(
        select(PromptVersionRow.version).where(PromptVersionRow.name == name)))
    missing = [v for v in versions if v not in stored]
    if missing:
        known = ", ".join(sorted(stored, key=version_key)) or "none"
        raise UnknownPromptVersion(
            f"prompt {name} has no version {', '.join(missing)} (stored: {known}); "
            f"import it first with `openclaw prompts import DIR`")
