"""The store after a year of a family's or a small team's use: does every hot-path call stay fast?

Two SQLite stores are made with the schema the migrations produce (`Store.open`): a full one, filled
in one transaction with Core `executemany` to a year of use by 20 people, and an almost empty one
(the peer, `--empty-scale` of the same sizes). Then each Store call the daemon makes per message
(and the background ones: recovery at start, the audit listing, `openclaw users forget`, and the
first clean-up after the year, batch by batch) is timed on both, and the SQL each call issues (captured with
SQLAlchemy's `before_cursor_execute`) is shown with SQLite's EXPLAIN QUERY PLAN; a SCAN of one of the
big tables is flagged. A hot-path call should cost the same on both stores: the ratio is ~1.

Sizes at `--scale 1` (one year): 20 users (and 30 strangers waiting for pairing), 300k messages in
~1,100 conversations (one chat of 30k messages never reset by /new), 25k summaries, 600k usage rows
(50k a month, as with `keep_usage_days = 0`), 100k audit rows, 500k inbound and 500k outbound
messages (what retention prunes after 30 days, as if it never ran), 3,000 reminders, 500 pairing
codes. No ANALYZE is run (the daemon never runs one): the planner sees what a real store shows it.

    .venv/bin/python bench/store_scale.py [--scale 1] [--calls 300] [--dir /tmp/storescale] [--keep]
                                          [--keep-forever] [--plans] [--only TEXT]
    .venv/bin/python bench/store_scale.py --scale 0.1 --calls 100   # a quick run (about a minute)

At `--scale 1` the fill takes about 35 s on the reference machine (the whole run about two
minutes) and ~500 MB of disk; the folder is removed at the end unless `--keep`. `--keep-forever`
prunes with the journal and usage kept forever (`keep_journal_days = keep_usage_days = 0`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import random
import re
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy  # noqa: E402
from sqlalchemy import event, insert  # noqa: E402

from openclaw.store import OutboundStatus, Store  # noqa: E402
from openclaw.store import retention as retention_mod  # noqa: E402
from openclaw.store.models import Base  # noqa: E402

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
YEAR = timedelta(days=365)
BIG_TABLES = {"messages", "summaries", "inbound_events", "outbound_messages", "usage", "audit_log"}

# One year of use at --scale 1.
SIZES = {
    "messages": 300_000,
    "summaries": 25_000,
    "usage": 600_000,
    "audit_log": 100_000,
    "inbound_events": 500_000,
    "outbound_messages": 500_000,
    "reminders": 3_000,
    "pairing_codes": 500,
    "archived_per_chat": 30,  # conversations closed by /new, per (user, chat)
}
USERS = [("telegram", str(1001 + i)) for i in range(14)] + [("discord", str(5001 + i)) for i in range(6)]
GROUPS = {"telegram": ["-1001", "-1002"], "discord": ["900"]}
STRANGERS = 30
WORDS = ("the quick brown fox jumps over a lazy dog while the family plans dinner and a trip to the "
         "lake on saturday remind me to call grandma about the tickets for the concert next week "
         "what is the weather like tomorrow morning in the city please list the files in my folder").split()


def text(rng: random.Random, lo: int, hi: int) -> str:
    n = rng.randint(lo, hi) // 6
    return " ".join(rng.choice(WORDS) for _ in range(max(n, 1)))


# -- the fill -------------------------------------------------------------------------------------

@dataclass
class Filled:
    """What the timed calls pick from."""

    users: list[str]
    strangers: list[str]
    chats: list[tuple[str, str, str]]  # (user key, channel, chat id) of each active conversation
    heavy: tuple[str, str, str]  # the 30k-message chat
    pending_chats: list[tuple[str, str]]  # chats with replies still to send
    known_inbound: list[tuple[str, str, str, str]]  # (user, channel, chat, message id) stored
    rows: dict[str, int] = field(default_factory=dict)
    fill_s: float = 0.0


def _n(name: str, scale: float, least: int) -> int:
    return max(least, int(SIZES[name] * scale))


def _chunks(rows: Iterator[dict], size: int = 20_000) -> Iterator[list[dict]]:
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def fill(path: Path, scale: float, seed: int = 7) -> Filled:
    """Rows through Core executemany in one transaction, on the file `Store.open` just migrated."""
    rng = random.Random(seed)
    t = Base.metadata.tables
    keys = [f"{c}:{e}" for c, e in USERS]
    strangers = [("telegram", str(7000 + i)) for i in range(max(3, int(STRANGERS * min(1, scale * 10))))]
    started = time.perf_counter()

    def at(i: int, n: int, span: timedelta = YEAR) -> datetime:  # row i of n, over `span` until now
        return NOW - span + (span - timedelta(minutes=1)) * ((i + 1) / n)

    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    counts: dict[str, int] = {}
    with engine.connect() as conn:  # no -wal copy of the whole fill (the store turns WAL back on)
        conn.exec_driver_sql("PRAGMA journal_mode = DELETE")
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA synchronous = OFF")

        def put(table: str, rows: Iterator[dict]) -> None:
            for chunk in _chunks(rows):
                conn.execute(insert(t[table]), chunk)
                counts[table] = counts.get(table, 0) + len(chunk)

        created = NOW - YEAR - timedelta(days=1)
        put("users", iter([{"channel": c, "external_id": e, "display_name": f"user {e}",
                            "status": "allowed", "role": None, "created_at": created,
                            "updated_at": created} for c, e in USERS]
                          + [{"channel": c, "external_id": e, "display_name": None, "status": "pending",
                              "role": None, "created_at": created,
                              "updated_at": NOW - timedelta(days=2 if i % 2 else 30)}
                             for i, (c, e) in enumerate(strangers)]))
        user_id = {key: i + 1 for i, key in enumerate(keys)}

        # Conversations: each user's private chat and the groups they are in. Per (user, chat),
        # consecutive windows of the year: archived ones (/new) and the active one, the last; rows
        # made at time t belong to the window holding t. User 0's private chat never had a /new:
        # its one active conversation holds 10% of all messages (the heavy one).
        pairs = [(key, c, e) for key, (c, e) in zip(keys, USERS, strict=True)]
        for i, (key, (c, _)) in enumerate(zip(keys, USERS, strict=True)):
            pairs += [(key, c, g) for g in GROUPS[c] if i % 2 == 0]
        archived_n = int(SIZES["archived_per_chat"] * scale)
        window = YEAR / (archived_n + 1)
        conversations: list[dict] = []
        archived: dict[int, list[int]] = {}
        for p, (key, c, chat) in enumerate(pairs):
            archived[p] = []
            for k in range(archived_n if p else 0):
                begins = NOW - YEAR + window * k
                conversations.append({"user_id": user_id[key], "channel": c, "chat_id": chat,
                                      "status": "archived", "created_at": begins,
                                      "updated_at": begins + window, "archived_at": begins + window})
                archived[p].append(len(conversations))
        active: dict[int, int] = {}
        for p, (key, c, chat) in enumerate(pairs):
            conversations.append({"user_id": user_id[key], "channel": c, "chat_id": chat,
                                  "status": "active", "created_at": NOW - YEAR + window * len(archived[p]),
                                  "updated_at": NOW, "archived_at": None})
            active[p] = len(conversations)
        put("conversations", iter(conversations))

        def conv_for(p: int, when: datetime) -> int:
            k = int((when - (NOW - YEAR)) / window)
            return archived[p][k] if k < len(archived[p]) else active[p]

        def pick() -> int:  # a (user, chat) pair: the heavy chat a tenth of the time
            return 0 if rng.random() < 0.1 else rng.randrange(len(pairs))

        # Messages, ids rising with time; a summary every 12 messages of a conversation, reaching
        # up to that message.
        n_msg = _n("messages", scale, 300)
        owner = [conv_for(pick(), at(i, n_msg)) for i in range(n_msg)]
        roles = ("user", "assistant", "assistant", "tool")

        def messages() -> Iterator[dict]:
            for i, conv in enumerate(owner):
                yield {"conversation_id": conv, "role": roles[i % 4], "content": text(rng, 60, 300),
                       "tool_calls": None, "tool_call_id": None, "token_count": rng.randint(10, 120),
                       "created_at": at(i, n_msg)}
        put("messages", messages())

        per_conv: dict[int, int] = {}
        summaries = []
        for i, conv in enumerate(owner):
            per_conv[conv] = per_conv.get(conv, 0) + 1
            if per_conv[conv] % 12 == 0:
                summaries.append({"conversation_id": conv, "up_to_message_id": i + 1,
                                  "content": text(rng, 300, 900), "token_count": 200,
                                  "created_at": at(i, n_msg)})
        put("summaries", iter(summaries))

        # The delivery journal: inbound messages and the replies to them, a year of them.
        n_in = _n("inbound_events", scale, 500)
        chat_of: dict[int, int] = {}  # inbound id -> its pair

        def inbound() -> Iterator[dict]:
            for i in range(n_in):
                p = chat_of[i + 1] = pick()
                key, c, chat = pairs[p]
                status = "received" if i >= n_in - 3 else ("failed" if rng.random() < 0.01 else "processed")
                when = at(i, n_in)
                yield {"channel": c, "message_id": str(i + 1), "user_key": key, "chat_id": chat,
                       "text": text(rng, 20, 120), "payload": None, "status": status,
                       "error": "stopped" if status == "failed" else None, "received_at": when,
                       "processed_at": None if status == "received" else when + timedelta(seconds=5)}
        put("inbound_events", inbound())

        n_out = _n("outbound_messages", scale, 500)
        pending_chats = [pairs[p][1:] for p in range(3)]

        def outbound() -> Iterator[dict]:
            for i in range(n_out):
                answered = min(i + 1, n_in - 3)
                p = chat_of[answered]
                status, when = "sent", at(i, n_out)
                if i >= n_out - 20:  # replies still to send, in three chats
                    p, status = i % 3, "pending"
                elif rng.random() < 0.005:
                    status = "failed"
                _, c, chat = pairs[p]
                yield {"conversation_id": conv_for(p, when), "inbound_event_id": answered,
                       "channel": c, "chat_id": chat, "text": text(rng, 30, 200), "status": status,
                       "attempts": 1, "external_message_id": None if status != "sent" else str(i),
                       "error": None, "created_at": when, "updated_at": when,
                       "sent_at": when if status == "sent" else None}
        put("outbound_messages", outbound())

        n_usage = _n("usage", scale, 600)

        def usage() -> Iterator[dict]:
            for i in range(n_usage):
                p, when = pick(), at(i, n_usage)
                yield {"at": when, "user_key": pairs[p][0], "conversation_id": conv_for(p, when),
                       "prompt_tokens": rng.randint(200, 3000), "completion_tokens": rng.randint(10, 400)}
        put("usage", usage())

        n_audit = _n("audit_log", scale, 100)
        skills = ("shell", "files.read", "files.write", "email.send", "reminders", "clock")
        put("audit_log", ({"at": at(i, n_audit, YEAR + timedelta(days=30)), "user_key": rng.choice(keys),
                           "skill": rng.choice(skills),
                           "arguments": {"command": text(rng, 10, 40)}, "decision": "allowed",
                           "exit_status": 0, "duration_ms": rng.randint(5, 900),
                           "output_bytes": rng.randint(0, 4000), "detail": None}
                          for i in range(n_audit)))

        # Reminders: mostly done or cancelled; ~7% active, a few of them due now.
        n_rem = _n("reminders", scale, 20)
        numbers: dict[str, int] = {}

        def reminders() -> Iterator[dict]:
            for i in range(n_rem):
                key, c, chat = pairs[pick()]
                numbers[key] = numbers.get(key, 0) + 1
                roll = rng.random()
                status = "active" if roll < 0.07 or i < 3 else ("cancelled" if roll < 0.2 else "done")
                due = (NOW - timedelta(minutes=1 + i) if i < 3 else
                       NOW + timedelta(hours=rng.randint(1, 2000)) if status == "active"
                       else at(i, n_rem))
                yield {"number": numbers[key], "user_key": key, "channel": c, "chat_id": chat,
                       "text": text(rng, 10, 80), "due_at": due, "repeat": None, "timezone": "UTC",
                       "local_time": due.time().isoformat(), "status": status,
                       "fired_count": 0 if status == "active" else 1, "created_at": at(i, n_rem),
                       "fired_at": None}
        put("reminders", reminders())

        # Pairing codes: the strangers' old ones, expired or used; three live.
        n_codes = _n("pairing_codes", scale, 5)
        first_stranger = len(keys) + 1

        def codes() -> Iterator[dict]:
            for i in range(n_codes):
                live = i >= n_codes - 3
                when = NOW - timedelta(minutes=10) if live else at(i, n_codes) - timedelta(days=1)
                yield {"code": f"C{i:07d}", "user_id": first_stranger + (i % len(strangers)),
                       "created_at": when, "expires_at": when + timedelta(hours=1),
                       "used_at": None if live or i % 3 else when + timedelta(minutes=5)}
        put("pairing_codes", codes())
    engine.dispose()

    return Filled(users=keys, strangers=[f"{c}:{e}" for c, e in strangers], chats=pairs,
                  heavy=pairs[0], pending_chats=pending_chats, rows=counts,
                  known_inbound=[(*pairs[p], str(i)) for i, p in chat_of.items() if i % 97 == 0 or i < 50],
                  fill_s=time.perf_counter() - started)


# -- timing and plans -----------------------------------------------------------------------------

class Capture:
    """The SQL a labelled call issues, from SQLAlchemy's before_cursor_execute."""

    def __init__(self, store: Store):
        self.label: str | None = None
        self.statements: dict[str, list[tuple[str, Any]]] = {}
        event.listen(store.engine.sync_engine, "before_cursor_execute", self._seen)

    def _seen(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any,
              executemany: bool) -> None:
        if self.label is None:
            return
        if executemany:
            parameters = parameters[0]
        seen = self.statements.setdefault(self.label, [])
        if statement not in (s for s, _ in seen):
            seen.append((statement, parameters))


@dataclass
class Case:
    label: str
    hot: bool
    call: Callable[[Store, Filled, int], Awaitable[Any]]
    calls: int | None = None  # fewer for the slow background ones


async def explain(store: Store, statements: list[tuple[str, Any]]) -> list[tuple[str, list[str]]]:
    plans = []
    async with store.engine.connect() as conn:
        for sql, params in statements:
            if not re.match(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", sql, re.I):
                continue
            rows = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, tuple(params))).all()
            plans.append((sql, [row[-1] for row in rows]))
        await conn.rollback()
    return plans


def scans(sql: str, plan: list[str]) -> list[str]:
    """The plan's SCANs of big tables; "(stops at LIMIT)" where it reads in the order asked."""
    found = []
    for line in plan:
        m = re.match(r"SCAN (\w+)", line)
        if m and m.group(1) in BIG_TABLES:
            limited = " LIMIT " in sql and not any("TEMP B-TREE" in p for p in plan)
            found.append(line + (" (stops at LIMIT)" if limited else ""))
    return found


async def unindexed_foreign_keys(store: Store) -> list[str]:
    """Foreign keys whose child column leads no index: a DELETE of a parent reads the child table."""
    missing = []
    async with store.engine.connect() as conn:
        for table in Base.metadata.tables:
            fks = (await conn.exec_driver_sql(f"PRAGMA foreign_key_list({table})")).all()
            leading = set()
            for ix in (await conn.exec_driver_sql(f"PRAGMA index_list({table})")).all():
                info = (await conn.exec_driver_sql(f"PRAGMA index_info({ix[1]})")).all()
                leading.add(info[0][2])
            missing += [f"{table}.{fk[3]} -> {fk[2]}" for fk in fks if fk[3] not in leading]
    return missing


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def timed(store: Store, filled: Filled, case: Case, n: int, capture: Capture) -> list[float]:
    times = []
    for i in range(n):
        capture.label = case.label if i < 3 else None  # the first calls show every branch
        started = time.perf_counter()
        await case.call(store, filled, i)
        times.append((time.perf_counter() - started) * 1000)
    capture.label = None
    return times


# -- the calls ------------------------------------------------------------------------------------

def _chat(f: Filled, i: int) -> tuple[str, str, str]:
    return f.heavy if i % 3 == 0 else f.chats[i % len(f.chats)]


class State:
    """Rows the calls make and later calls use, per store."""

    def __init__(self) -> None:
        self.conversations: dict[tuple[str, str, str], Any] = {}
        self.inbound: list[int] = []
        self.outbound: list[int] = []
        self.retention_step: dict[str, Any] = {}


STATE: dict[int, State] = {}


def st(store: Store) -> State:
    return STATE.setdefault(id(store), State())


async def conversation(store: Store, f: Filled, i: int) -> Any:
    key = _chat(f, i)
    found = st(store).conversations.get(key)
    if found is None:
        found = st(store).conversations[key] = await store.active_conversation(key[0], key[2], key[1])
    return found


async def _record_inbound(store: Store, f: Filled, i: int) -> None:
    user, channel, chat = _chat(f, i)
    event_, new = await store.record_inbound(channel, f"bench-{i}-{time.monotonic_ns()}", user, chat,
                                             "what is on my list for today?")
    st(store).inbound.append(event_.id)


async def _redelivered(store: Store, f: Filled, i: int) -> None:
    user, channel, chat, message_id = f.known_inbound[i % len(f.known_inbound)]
    _, new = await store.record_inbound(channel, message_id, user, chat, "x")
    assert not new


async def _get_user(store: Store, f: Filled, i: int) -> None:
    channel, external = f.users[i % len(f.users)].split(":")
    await store.get_user(channel, external)


async def _active_conversation(store: Store, f: Filled, i: int) -> None:
    user, channel, chat = _chat(f, i)
    await store.active_conversation(user, chat, channel)


async def _latest_summary(store: Store, f: Filled, i: int) -> None:
    await store.latest_summary((await conversation(store, f, i)).id)


async def _history(store: Store, f: Filled, i: int) -> None:
    conv = await conversation(store, f, i)
    summary = await store.latest_summary(conv.id)
    await store.list_messages(conv.id, after_id=summary.up_to_message_id if summary else None)


async def _add_message(store: Store, f: Filled, i: int) -> None:
    await store.add_message((await conversation(store, f, i)).id, "user", "hello there, a new message")


async def _tokens_today_user(store: Store, f: Filled, i: int) -> None:
    await store.tokens_today(f.users[i % len(f.users)])


async def _tokens_today_all(store: Store, f: Filled, i: int) -> None:
    await store.tokens_today()


async def _add_usage(store: Store, f: Filled, i: int) -> None:
    user = f.users[i % len(f.users)]
    await store.add_usage(user, 1200, 80, (await conversation(store, f, i)).id)


async def _add_reply(store: Store, f: Filled, i: int) -> None:
    user, channel, chat = _chat(f, i)
    answers = st(store).inbound[i % len(st(store).inbound)]
    [out] = await store.add_reply(channel, chat, ["Here is your answer."], answers=answers,
                                  conversation_id=(await conversation(store, f, i)).id)
    st(store).outbound.append(out.id)


async def _mark_outbound(store: Store, f: Filled, i: int) -> None:
    await store.mark_outbound(st(store).outbound[i], OutboundStatus.SENT, external_message_id=i)


async def _mark_inbound(store: Store, f: Filled, i: int) -> None:
    await store.mark_inbound(st(store).inbound[i % len(st(store).inbound)], "processed")


async def _pending_outbound_chat(store: Store, f: Filled, i: int) -> None:
    channel, chat = (f.pending_chats + [c[1:] for c in f.chats])[i % (len(f.chats) + 3)]
    await store.pending_outbound(channel, chat)


async def _pending_outbound_all(store: Store, f: Filled, i: int) -> None:
    await store.pending_outbound()


async def _reminders_due(store: Store, f: Filled, i: int) -> None:
    due = await store.active_reminders(due_by=store.now(), exclude=[])
    await store.active_reminders(exclude=[r.id for r in due], limit=1)


async def _reminders_of_user(store: Store, f: Filled, i: int) -> None:
    await store.active_reminders(f.users[i % len(f.users)])


async def _add_reminder(store: Store, f: Filled, i: int) -> None:
    user = f.users[i % len(f.users)]
    r = await store.add_reminder(user, user.split(":")[1], "water the plants", NOW + timedelta(days=1),
                                 max_active=10_000)
    await store.cancel_reminder(user, r.number)


async def _pairing_code(store: Store, f: Filled, i: int) -> None:
    await store.create_pairing_code(f.strangers[i % len(f.strangers)])


async def _list_pairing(store: Store, f: Filled, i: int) -> None:
    await store.list_pairing_codes()


async def _pending_inbound(store: Store, f: Filled, i: int) -> None:
    await store.pending_inbound()


async def _list_audit(store: Store, f: Filled, i: int) -> None:
    await store.list_audit(100)


async def _list_audit_user(store: Store, f: Filled, i: int) -> None:
    await store.list_audit(100, user=f.users[i % len(f.users)])


async def prune_run(store: Store, capture: Capture, r: retention_mod.Retention
                    ) -> dict[str, tuple[list[float], int]]:
    """The first clean-up after a year, as `RetentionTask` runs it (without its pauses between
    batches): each kind in order, batch after batch to its end. Per kind: each batch's time (one
    transaction, up to 500 rows) and the rows that went (or were unlinked)."""
    out = {}
    for step in retention_mod._steps(r, store.now()):
        kind = step.kind + (" unlinked" if step.unlink else "")
        times, rows = [], 0
        while True:
            capture.label = f"prune: {kind}" if len(times) < 2 else None
            started = time.perf_counter()
            gone = await retention_mod._delete(store, step, retention_mod.BATCH, 0.0, lambda: True)
            times.append((time.perf_counter() - started) * 1000)
            rows += gone
            if gone < retention_mod.BATCH:
                break
        out[kind] = (times, rows)
    capture.label = "prune: pending users"
    started = time.perf_counter()
    gone = await retention_mod._delete_strangers(store, retention_mod._strangers(r, store.now()), set(),
                                                 False, retention_mod.BATCH, 0.0, lambda: False)
    out["pending users"] = ([(time.perf_counter() - started) * 1000], gone)
    capture.label = None
    return out


async def _forget_dry(store: Store, f: Filled, i: int) -> None:
    await store.forget_user(f.users[1 + i % 3], dry_run=True)


async def _forget(store: Store, f: Filled, i: int) -> None:
    await store.forget_user(f.users[-1 - i])


CASES = [
    Case("record_inbound (new)", True, _record_inbound),
    Case("record_inbound (redelivered)", True, _redelivered),
    Case("get_user", True, _get_user),
    Case("active_conversation", True, _active_conversation),
    Case("latest_summary", True, _latest_summary),
    Case("latest_summary + list_messages after it", True, _history),
    Case("add_message", True, _add_message),
    Case("tokens_today(user)", True, _tokens_today_user),
    Case("tokens_today() everyone", True, _tokens_today_all),
    Case("add_usage", True, _add_usage),
    Case("add_reply (answers an inbound)", True, _add_reply),
    Case("mark_outbound (sent)", True, _mark_outbound),
    Case("mark_inbound", True, _mark_inbound),
    Case("pending_outbound(chat)", True, _pending_outbound_chat),
    Case("pending_outbound() all", True, _pending_outbound_all),
    Case("reminders due + next one", True, _reminders_due),
    Case("active_reminders(user)", True, _reminders_of_user),
    Case("add_reminder + cancel_reminder", True, _add_reminder),
    Case("create_pairing_code (stranger)", True, _pairing_code),
    Case("list_pairing_codes", True, _list_pairing),
    Case("pending_inbound (start)", False, _pending_inbound),
    Case("list_audit(100)", False, _list_audit),
    Case("list_audit(100, user)", False, _list_audit_user),
    Case("forget_user --dry-run", False, _forget_dry, 3),
    Case("forget_user", False, _forget, 2),
]


@dataclass
class Row:
    label: str
    hot: bool
    empty: list[float]
    full: list[float]
    note: str = ""


async def run_cases(cases: list[Case], stores: dict[str, Store], filled: dict[str, Filled],
                    capture: dict[str, Capture], calls: int) -> list[Row]:
    rows = []
    for case in cases:
        got = {name: await timed(stores[name], filled[name], case, case.calls or calls, capture[name])
               for name in ("empty", "full")}  # one case on both stores, one after the other
        rows.append(Row(case.label, case.hot, got["empty"], got["full"]))
        print(f"  {case.label}: empty p50 {statistics.median(got['empty']):.3f} ms, "
              f"full p50 {statistics.median(got['full']):.3f} ms", file=sys.stderr, flush=True)
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of a year's sizes (1)")
    parser.add_argument("--empty-scale", type=float, default=0.001,
                        help="the peer's sizes, a fraction of a year's (0.001)")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per hot-path case (300)")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/storescale"))
    parser.add_argument("--keep", action="store_true", help="leave the databases in --dir")
    parser.add_argument("--only", help="run only the cases whose label contains this (no prune)")
    parser.add_argument("--plans", action="store_true", help="print every statement's plan, not only scans")
    parser.add_argument("--keep-forever", action="store_true",
                        help="prune with keep_journal_days = keep_usage_days = 0 (the archived "
                             "conversations still have every reply and usage row)")
    args = parser.parse_args()

    args.dir.mkdir(parents=True, exist_ok=True)
    stores: dict[str, Store] = {}
    filled: dict[str, Filled] = {}
    try:
        for name, scale in (("empty", args.empty_scale), ("full", args.scale)):
            path = args.dir / f"{name}.db"
            for leftover in args.dir.glob(f"{name}.db*"):
                leftover.unlink()
            url = f"sqlite+aiosqlite:///{path}"
            await (await Store.open(url)).close()  # migrated, as the daemon's first start does
            filled[name] = fill(path, scale)
            stores[name] = await Store.open(url, clock=lambda: NOW)
            size = sum(p.stat().st_size for p in args.dir.glob(f"{name}.db*")) / 2**20
            print(f"{name}: scale {scale:g}, filled in {filled[name].fill_s:.1f} s, {size:.0f} MiB: "
                  + ", ".join(f"{t} {n:,}" for t, n in filled[name].rows.items()), flush=True)
        capture = {name: Capture(store) for name, store in stores.items()}
        # All cases on the stores as filled (forget_user too: the journal is at its largest),
        # then the clean-up.
        rows = await run_cases([c for c in CASES if not args.only or args.only in c.label], stores,
                               filled, capture, args.calls)
        if not args.only:
            kept = {"keep_journal_days": 0, "keep_usage_days": 0} if args.keep_forever else {}
            r = retention_mod.Retention(keep_archived_days=180, **kept)
            pruned = {name: await prune_run(store, capture[name], r) for name, store in stores.items()}
            for kind, (times, gone) in pruned["full"].items():
                empty_times, empty_gone = pruned["empty"][kind]
                batches = "" if kind == "pending users" else ", per batch"
                rows.append(Row(f"prune: {kind}{batches}", False, empty_times, times,
                                f"{empty_gone:,} / {gone:,} rows"))

        print(f"\nMachine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
              f"SQLite {__import__('sqlite3').sqlite_version}, SQLAlchemy {sqlalchemy.__version__}. "
              f"Full store: scale {args.scale:g}; peer: the same calls on an almost empty store "
              f"(scale {args.empty_scale:g}).\n")
        print("| call | calls | empty p50 ms | full p50 ms | full p99 ms | full/empty p50 | plan (full) |")
        print("|---|---:|---:|---:|---:|---:|---|")
        shown = []
        for row in rows:
            plans = await explain(stores["full"], capture["full"].statements.get(row.label.split(",")[0], []))
            real = [s for sql, plan in plans for s in scans(sql, plan) if "stops at LIMIT" not in s]
            verdict = ("SCAN " + ", ".join(sorted({s.split()[1] for s in real}))) if real else "indexed"
            if real or args.plans:
                shown.append((row.label, plans))
            e, full = statistics.median(row.empty), statistics.median(row.full)
            label = row.label if row.hot else f"*{row.label}*"
            note = f" ({row.note})" if row.note else ""
            print(f"| {label} | {len(row.full)} | {e:.3f} | {full:.3f} | {pct(row.full, 0.99):.3f} | "
                  f"{full / e:.2f} | {verdict}{note} |")
        print("\n(italic: background calls. prune: the first clean-up after a year, "
              f"keep_archived_days = 180{', journal and usage kept forever' if args.keep_forever else ''}"
              ", rows gone on the empty / full store)")
        missing = await unindexed_foreign_keys(stores["full"])
        print("\nForeign keys whose child column leads no index:", ", ".join(missing) or "none")
        for label, plans in shown:
            print(f"\n== {label}")
            for sql, plan in plans:
                print("  " + " ".join(sql.split())[:400])
                for line in plan:
                    bad = [s for s in scans(sql, [line]) if "stops at LIMIT" not in s]
                    print(f"      {line}{'  <-- SCAN of a big table' if bad else ''}")
    finally:
        for store in stores.values():
            await store.close()
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
