"""A user's long-term memory: short entries, each in a scope (private chats, one group chat, or
everywhere), found by words with the database's full-text search (FTS5 with bm25 on SQLite,
tsvector and ts_rank on PostgreSQL; the index is migration 0010's).

Every call names the user, and every query filters on them: no call reads another user's entries.
Entries are never rewritten: a duplicate is merged into the one kept (pinned if either was), and
consolidation replaces entries by id in one transaction (`replace_memories`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import bindparam, column, delete, func, literal_column, select, table, text
from sqlalchemy.ext.asyncio import AsyncSession

from openclaw.store.base import StoreBase, loop_first, to_record
from openclaw.store.columns import storable
from openclaw.store.loop_writer import LoopWriter, Prepared
from openclaw.store.memory_records import MemoryEntry, MemoryFull, MemoryKind
from openclaw.store.models import MemoryRow, MemorySettingRow

SEARCH_TERMS = 12  # words of a query looked up, the longest first (rarer, so cheaper and surer)
# Entries a SQLite search ranks at most: bm25 costs tens of microseconds per entry that holds a
# word (over 100 ms for a ten-word message at 20k entries), so the words are taken rarest first
# while their entries add up to this; a word held by more (a "the" of this memory) weighs next to
# nothing in bm25 anyway.
SEARCH_HITS = 400
_FTS = table("memories_fts", column("rowid"))  # FTS5's, made by migration 0010
_WORD = re.compile(r"[^\W_]{3,}")  # as FTS5's unicode61 and PostgreSQL's 'simple' split them


def search_terms(query: str) -> list[str]:
    """The distinct words of `query` that a search looks up (lower case, at least 3 letters)."""
    words = list(dict.fromkeys(w.casefold() for w in _WORD.findall(query)))
    return sorted(words, key=len, reverse=True)[:SEARCH_TERMS]


def digest(entry_text: str) -> str:
    """What two entries that say the same share: the text with case and spacing ignored."""
    return hashlib.sha256(" ".join(entry_text.casefold().split()).encode()).hexdigest()


# -- recall's statements, as both paths run them (the thread's session, the loop's writer) -------


def _where(user: str, scopes: list[str]) -> dict[str, Any]:
    return {"user": user, **{f"s{i}": scope for i, scope in enumerate(scopes)}}


def _in_scopes(count: int) -> Any:
    return MemoryRow.scope.in_([bindparam(f"s{i}") for i in range(count)])


@functools.cache
def _pinned(scopes: int) -> Any:
    """The user's pinned entries in `scopes` scopes, oldest first."""
    return (select(MemoryRow)
            .where(MemoryRow.user == bindparam("user"), MemoryRow.pinned.is_(True),
                   _in_scopes(scopes))
            .order_by(MemoryRow.created_at, MemoryRow.id))


@functools.cache
def _counts(terms: int) -> Any:
    """How many entries (every user's) hold each of `terms` words, each counted only up to
    SEARCH_HITS + 1, which stops early on a common word (fts5vocab's counts read a word's whole
    list: 25 ms a message at 100k entries); one statement. SQLite."""
    return text(" UNION ALL ".join(
        f"SELECT :t{i}, (SELECT count(*) FROM (SELECT 1 FROM memories_fts "
        f"WHERE memories_fts MATCH :q{i} LIMIT {SEARCH_HITS + 1}))" for i in range(terms)))


def _counting(terms: list[str]) -> dict[str, str]:
    return {**{f"t{i}": t for i, t in enumerate(terms)},
            **{f"q{i}": f'"{t}"' for i, t in enumerate(terms)}}


def _rarest(counted: Sequence[Sequence[Any]]) -> list[str]:
    """The rarest of the words counted, (word, entries), whose entries add up to at most
    SEARCH_HITS."""
    docs = {term: n for term, n in counted if n}
    chosen, hits = [], 0
    for term in sorted(docs, key=docs.__getitem__):
        if hits + docs[term] > SEARCH_HITS:
            break
        chosen.append(term)
        hits += docs[term]
    return chosen


@functools.cache
def _ranked(scopes: int) -> Any:
    """The user's entries in `scopes` scopes that hold a word of the match, by bm25. SQLite."""
    fts = literal_column("memories_fts")
    return (select(MemoryRow).join(_FTS, _FTS.c.rowid == MemoryRow.id)
            .where(fts.op("MATCH")(bindparam("match")), MemoryRow.user == bindparam("user"),
                   _in_scopes(scopes))
            .order_by(func.bm25(fts), MemoryRow.id.desc()).limit(bindparam("limit")))


def _ranking(user: str, scopes: list[str], terms: list[str], limit: int) -> dict[str, Any]:
    # Each word quoted: FTS5's query syntax (AND, NEAR, column:) is not the user's to use.
    return {**_where(user, scopes), "match": " OR ".join(f'"{t}"' for t in terms),
            "limit": limit}


def _merged(pinned: list[Any], ranked: list[Any], limit: int) -> list[Any]:
    """The pinned entries, then up to `limit` ranked ones not among them."""
    seen = {row.id for row in pinned}
    return pinned + [row for row in ranked if row.id not in seen][:limit]


_ATTRIBUTES = {column.key: attribute for attribute, column in MemoryRow.__mapper__.columns.items()}
_FIELDS = {field.name for field in dataclasses.fields(MemoryEntry)}


def _recall_on_loop(store: StoreBase, writer: LoopWriter, user: str, scopes: Collection[str],
                    query: str, *, limit: int = 8, pinned: bool = True) -> list[MemoryEntry]:
    """recall's statements on the loop's connection (base.loop_first), within its read budget:
    a few indexed reads, tens of microseconds, where the thread's path takes a dozen hops."""
    scopes = list(scopes)
    where = _where(user, scopes)
    terms = search_terms(query)

    def entries(prepared: Prepared, rows: list[tuple]) -> list[MemoryEntry]:
        names = [_ATTRIBUTES[key] for key in prepared.keys or ()]
        return [MemoryEntry(**{name: value for name, value in zip(names, row, strict=True)
                               if name in _FIELDS}) for row in rows]

    # Compiled before the reads' clock starts (the first time a shape is asked for: ms).
    pinned_query = writer.prepare(("pinned", len(scopes)), lambda: _pinned(len(scopes)))
    counts = writer.prepare(("counts", len(terms)), lambda: _counts(len(terms))) if terms else None
    ranked_query = writer.prepare(("ranked", len(scopes)), lambda: _ranked(len(scopes)))

    def body(read: Any) -> list[MemoryEntry]:
        found = entries(pinned_query, read(pinned_query, where)) if pinned else []
        ranked: list[MemoryEntry] = []
        if counts is not None and limit + len(found) > 0:
            rare = _rarest(read(counts, _counting(terms)))
            if rare:
                ranked = entries(ranked_query, read(ranked_query, _ranking(
                    user, scopes, rare, limit + len(found))))
        return _merged(found, ranked, limit)

    return writer.read(body)


class MemoryStore(StoreBase):
    """The Store's memory entries."""

    async def add_memory(self, user: str, scope: str, entry_text: str, *,
                         kind: MemoryKind = MemoryKind.FACT, source: str | None = None,
                         pinned: bool = False, max_entries: int | None = None,
                         max_chars: int | None = None) -> tuple[MemoryEntry, bool]:
        """Keep `entry_text` for `user` in `scope`; (the entry, whether it was new). The same text
        already kept in the scope is merged into that entry (pinned if this one is). Past
        `max_entries`, the user's oldest unpinned entries are dropped; MemoryFull, and nothing
        stored, when all are pinned. ValueError for an empty text or one over `max_chars`."""
        entry_text = storable(entry_text.strip())
        if not entry_text:
            raise ValueError("a memory entry needs a text")
        if max_chars is not None and len(entry_text) > max_chars:
            raise ValueError(f"the text is {len(entry_text)} characters; a memory entry holds at "
                             f"most {max_chars}")
        key = digest(entry_text)

        async def op(session: AsyncSession) -> tuple[MemoryEntry, bool]:
            await self._lock_user(session, user)
            same = await session.scalar(select(MemoryRow).where(
                MemoryRow.user == user, MemoryRow.scope == scope, MemoryRow.digest == key).limit(1))
            if same is not None:
                if pinned and not same.pinned:
                    same.pinned = True
                return to_record(MemoryEntry, same), False
            row = self._row(user, scope, entry_text, kind, source, pinned)
            session.add(row)
            await session.flush()
            await session.refresh(row, ["number"])
            if max_entries is not None:
                await _bound(session, user, max_entries, keep=row.id)
            return to_record(MemoryEntry, row), True

        return await self.retrying(op)

    async def list_memories(self, user: str, scopes: Collection[str] | None = None) -> list[MemoryEntry]:
        """The user's entries in `scopes` (all when None), by number."""
        query = select(MemoryRow).where(MemoryRow.user == user)
        if scopes is not None:
            query = query.where(MemoryRow.scope.in_(list(scopes)))
        async with self.transaction() as session:
            rows = await session.scalars(query.order_by(MemoryRow.number))
            return [to_record(MemoryEntry, r) for r in rows]

    async def count_memories(self, user: str, scopes: Collection[str] | None = None) -> int:
        query = select(func.count()).select_from(MemoryRow).where(MemoryRow.user == user)
        if scopes is not None:
            query = query.where(MemoryRow.scope.in_(list(scopes)))
        async with self.transaction() as session:
            return await session.scalar(query) or 0

    @loop_first(_recall_on_loop, steps=("_search",), reads=True)
    async def recall(self, user: str, scopes: Collection[str], query: str, *, limit: int = 8,
                     pinned: bool = True) -> list[MemoryEntry]:
        """What the prompt reads: the user's pinned entries in `scopes` (oldest first, when
        `pinned`), then their entries most relevant to `query` by full-text rank."""
        scopes = list(scopes)
        where = _where(user, scopes)
        async with self.transaction() as session:
            found = (list(await session.scalars(_pinned(len(scopes)), where)) if pinned else [])
            ranked = await self._search(session, user, scopes, query, limit + len(found))
            return [to_record(MemoryEntry, r) for r in _merged(found, ranked, limit)]

    async def search_memories(self, user: str, scopes: Collection[str], query: str, *,
                              limit: int = 8) -> list[MemoryEntry]:
        """The user's entries in `scopes` that hold words of `query`, most relevant first."""
        async with self.transaction() as session:
            return [to_record(MemoryEntry, r)
                    for r in await self._search(session, user, list(scopes), query, limit)]

    async def forget_memory(self, user: str, number: int, scopes: Collection[str]) -> MemoryEntry | None:
        """Delete the user's entry `number` if it is in `scopes` (the chat's); None if not. Its
        words leave the index with it (the index's triggers, or PostgreSQL's own)."""
        mine = (MemoryRow.user == user, MemoryRow.number == number, MemoryRow.scope.in_(list(scopes)))
        async with self.transaction() as session:
            row = await session.scalar(select(MemoryRow).where(*mine))
            if row is None:
                return None
            entry = to_record(MemoryEntry, row)
            await session.execute(delete(MemoryRow).where(MemoryRow.id == row.id)
                                  .execution_options(synchronize_session=False))
            return entry

    async def replace_memories(self, user: str, old_ids: Collection[int],
                               new: Sequence[tuple[str, str, MemoryKind, str]]) -> list[MemoryEntry]:
        """In one transaction: store each (scope, text, kind, source) of `new` and delete the
        user's unpinned entries `old_ids`, so a crash before the commit leaves the old ones and
        none of the new. Pinned entries are never deleted here, whatever `old_ids` names."""
        async def op(session: AsyncSession) -> list[MemoryEntry]:
            await self._lock_user(session, user)
            rows = [self._row(user, scope, storable(t), kind, source, False)
                    for scope, t, kind, source in new]
            for row in rows:  # one at a time: each takes the next number
                session.add(row)
                await session.flush()
                await session.refresh(row, ["number"])
            await session.execute(delete(MemoryRow).where(
                MemoryRow.user == user, MemoryRow.id.in_(list(old_ids)), MemoryRow.pinned.is_(False))
                .execution_options(synchronize_session=False))
            return [to_record(MemoryEntry, row) for row in rows]

        return await self.retrying(op)

    async def memory_enabled(self, user: str) -> bool:
        async with self.transaction() as session:
            return await session.scalar(
                select(MemorySettingRow.id).where(MemorySettingRow.user == user)) is None

    async def set_memory_enabled(self, user: str, enabled: bool) -> None:
        """`/memory on|off`: while off, nothing is written to the user's memory nor read from it
        (the entries kept stay, until /memory forget or `openclaw users forget`)."""
        async def op(session: AsyncSession) -> None:
            await session.execute(delete(MemorySettingRow).where(MemorySettingRow.user == user))
            if not enabled:
                session.add(MemorySettingRow(user=user, since=self.now()))

        await self.retrying(op)

    # -- inside ---------------------------------------------------------------------------------

    def _row(self, user: str, scope: str, entry_text: str, kind: MemoryKind, source: str | None,
             pinned: bool) -> MemoryRow:
        # The user's next number, read by the INSERT itself (as Store.add_reminder does); UNIQUE
        # (user_key, number) is the backstop, and `retrying` draws again.
        number = (select(func.coalesce(func.max(MemoryRow.number), 0) + 1)
                  .where(MemoryRow.user == user).scalar_subquery())
        return MemoryRow(number=number, user=user, scope=scope, kind=kind, text=entry_text,
                         digest=digest(entry_text), source=source, pinned=pinned,
                         created_at=self.now())

    async def _lock_user(self, session: AsyncSession, user: str) -> None:
        # SQLite's first write takes the database's write lock; PostgreSQL needs one per user, or
        # two adds at once would both find no duplicate and both see room under the bound.
        if self.dialect == "postgresql":
            await session.execute(select(func.pg_advisory_xact_lock(func.hashtext("memory:" + user))))

    async def _search(self, session: AsyncSession, user: str, scopes: list[str], query: str,
                      limit: int) -> list[MemoryRow]:
        terms = search_terms(query)
        if not terms or limit <= 0:
            return []
        if self.dialect == "sqlite":
            counted = await session.execute(_counts(len(terms)), _counting(terms))
            terms = _rarest(counted.all())
            if not terms:
                return []
            return list(await session.scalars(_ranked(len(scopes)),
                                              _ranking(user, scopes, terms, limit)))
        vector = func.to_tsvector(text("'simple'::regconfig"), MemoryRow.text)
        tsquery = func.websearch_to_tsquery(text("'simple'::regconfig"), " or ".join(terms))
        ranked = (select(MemoryRow)
                  .where(vector.op("@@")(tsquery), MemoryRow.user == user,
                         MemoryRow.scope.in_(scopes))
                  .order_by(func.ts_rank(vector, tsquery).desc(), MemoryRow.id.desc())
                  .limit(limit))
        return list(await session.scalars(ranked))


async def _bound(session: AsyncSession, user: str, max_entries: int, *, keep: int) -> None:
    """Drop the user's oldest unpinned entries (never `keep`, the one just added) past
    `max_entries`; MemoryFull when that is not enough (all the others are pinned)."""
    count = await session.scalar(select(func.count()).select_from(MemoryRow)
                                 .where(MemoryRow.user == user)) or 0
    excess = count - max_entries
    if excess <= 0:
        return
    oldest = list(await session.scalars(
        select(MemoryRow.id).where(MemoryRow.user == user, MemoryRow.pinned.is_(False),
                                   MemoryRow.id != keep)
        .order_by(MemoryRow.created_at, MemoryRow.id).limit(excess)))
    if len(oldest) < excess:
        raise MemoryFull(f"{count - 1} entries kept, all pinned: the limit is {max_entries}; "
                         "forget one first (/memory forget N)")
    await session.execute(delete(MemoryRow).where(MemoryRow.id.in_(oldest))
                          .execution_options(synchronize_session=False))
