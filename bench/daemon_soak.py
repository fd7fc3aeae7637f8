"""A soak test of the whole daemon: what it keeps, holds open or leaves behind as people come and go.

One daemon runs in this process (real SQLite store, gateway, agent, skills in the bubblewrap
sandbox, the real python-telegram-bot and discord.py connectors) against the local fake Telegram
and Discord servers, which run in a child process so that their own memory, sockets and tasks are
not counted. Traffic comes in phases; each phase brings new users (admitted by the config, by
`openclaw users allow`, by pairing, and strangers who are never admitted) plus a few returning ones,
who chat in rounds: plain messages, tool calls (clock, reminders that fire a few seconds later,
files, shell: a background process, one killed at its wall clock, one stopped by /stop; those of
the config's users wait for /approve, which they give, refuse or let time out), attachments, /new,
/stop of a slow answer, /status (also as Discord's slash command), /remind, group mentions, users
blocked while their answer streams; the console (`openclaw chat`) attaches and hangs up, the admin
port is scraped and held open, a send fails now and then (the outbox retries), the network drops
once a phase (both connectors reconnect). Midway the config is reloaded (SIGHUP). After each
phase the daemon is left idle (a lane, and a draft, ends after `--lane-idle` seconds, 600 / 3600
in production) and measured: process RSS, file descriptors, asyncio tasks, threads, child
processes, the sizes of the daemon's in-memory maps, the database and its WAL, files left in
data_dir and the temporary folder, memory cgroups left behind; and before the start against
after the stop (a command and answers running at the stop).

A measure that grows with the users or messages ever seen, rather than with those active now, is a
leak: the verdict column says GROWS when a measure taken at idle keeps rising from phase to phase
(and what is expected to grow, such as the database, says so).

    .venv/bin/python bench/daemon_soak.py                 # scripted model, a few minutes
    .venv/bin/python bench/daemon_soak.py --engine real --phases 4 --users-per-phase 16 \
        --rounds 3                                         # the embedded model (no tool calls)
    --network: shell commands get the network (a slirp4netns per command); --tracemalloc: what
    allocated the Python memory that grew, and which objects.

Never run by `make test`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import tracemalloc
import types as types_module
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/daemon_soak.py` from the repository root
    sys.path.insert(0, str(ROOT))

TG_ADMIN = 900
TG_BASE, DC_BASE = 50_000, 1_500_000_000_000_000_000
CODE = re.compile(r"pairing code is (\w+)")
APPROVE = re.compile(r"/approve (\d+)")


# ---- the fake services, in a child process ----------------------------------------------------


def _fakes_main(conn) -> None:  # the child: serve both fakes, obey commands from the pipe
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(_fakes(conn))


async def _fakes(conn) -> None:
    from tests.fakes.discord_api import FakeDiscord, Upload
    from tests.fakes.telegram_api import FakeTelegram

    tg, dc = FakeTelegram(), FakeDiscord()
    await tg.start()
    await dc.start()
    conn.send({"tg_token": tg.token, "tg_base_url": tg.base_url, "tg_file_url": tg.base_file_url,
               "dc_token": dc.token, "dc_api": dc.api_base, "dc_gateway": dc.gateway_url})
    loop = asyncio.get_running_loop()

    def bot_count() -> int:
        bot = dc.bot["id"]
        return (sum(len(v) for v in tg.bot_messages.values())
                + sum(1 for msgs in dc.messages.values() for m in msgs if m["author"]["id"] == bot))

    while True:
        op, args = await loop.run_in_executor(None, conn.recv)
        try:
            if op == "stop":
                await dc.stop()
                await tg.stop()
                conn.send(None)
                return
            if op == "tg":
                tg.send(args["text"], user=args["user"])
                result = None
            elif op == "tg_doc":
                tg.send_document(args["name"], args["content"], user=args["user"],
                                 caption=args["text"])
                result = None
            elif op == "dc":
                files = [Upload(args["name"], args["content"])] if args.get("name") else ()
                dc.send_dm(args["user"], args["text"], files=files)
                result = None
            elif op == "fail":  # the next send to each service fails (the outbox retries it)
                tg.fail_next("sendMessage", 500)
                dc.fail("POST /channels/*/messages", 500)
                result = None
            elif op == "blip":  # the network drops: Discord's gateway socket, Telegram for a while
                dc.drop_websocket(4000)
                await tg.stop()
                await asyncio.sleep(args["seconds"])
                await tg.start()
                if args.get("discord_down"):  # Discord away too: REST and gateway refuse
                    await dc.stop()
                    await asyncio.sleep(args["seconds"])
                    await dc.start()
                result = None
            elif op == "group":  # in a Telegram group, or Discord's guild channel, to the bot
                if args["channel"] == "telegram":
                    tg.send(f"@{tg.username} {args['text']}", user=args["user"], chat=-100900)
                else:
                    dc.send_guild_message(args["user"], args["text"], mention=True)
                result = None
            elif op == "dc_slash":
                dc.slash(args["user"], args["command"])
                result = None
            elif op == "texts":
                if args["channel"] == "telegram":
                    result = tg.texts(args["user"])
                else:
                    result = dc.texts(dc.dm_channel_id(args["user"]))
            elif op == "quiet":  # (bot messages so far, telegram updates not yet confirmed)
                result = (bot_count(), len(tg.updates), tg.polls_waiting)
            else:
                raise ValueError(op)
        except Exception as exc:  # noqa: BLE001 -- reported to the parent
            result = {"error": repr(exc)}
        conn.send(result)


class Fakes:
    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_fakes_main, args=(child,), daemon=True)
        self.proc.start()
        self.endpoints = self.conn.recv()

    def call(self, op: str, **args: Any) -> Any:
        # Blocking, on the daemon's loop: the child answers in well under a millisecond, and a
        # thread of ours would show in the thread count being measured.
        self.conn.send((op, args))
        result = self.conn.recv()
        if isinstance(result, dict) and "error" in result:
            raise RuntimeError(result["error"])
        return result

    def stop(self) -> None:
        try:
            self.call("stop")
        finally:
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()


# ---- the model --------------------------------------------------------------------------------


def _call(name: str, args: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


PLANS = {  # first word of the user's message -> the tool calls the model makes, in order
    "clock": [("clock", {})],
    "remind": [("reminders", {"action": "add", "when": "in 3 seconds", "text": "stretch"})],
    "file": [("files", {"action": "write", "path": "notes/soak.txt", "content": "soak " * 20}),
             ("files", {"action": "read", "path": "notes/soak.txt"}),
             ("files", {"action": "list", "path": "."})],
    "shell": [("shell", {"command": "echo hello; ls -la . | head -3; cat /proc/self/status | head -2"})],
    # A process left running in the background, and a command that outlives its wall clock (or
    # is stopped by /stop): nothing of either may outlive the call.
    "shellbg": [("shell", {"command": "sleep 60 >/dev/null 2>&1 & echo started"})],
    "shellslow": [("shell", {"command": "sleep 30; echo never"})],
}


def scripted_reply(messages: list[dict]) -> str:
    if "You write the memory" in messages[0]["content"]:
        return "SUMMARY: they chatted"
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    text = messages[last]["content"]
    done = sum(1 for m in messages[last:] if m["role"] == "tool")
    plan = PLANS.get(text.split(" ", 1)[0], [])
    if done < len(plan):
        return _call(*plan[done])
    if text.startswith("slow"):
        return "a long and slow answer " * 40
    return f"answer after {done} tool(s) to: {text[:60]}"


def make_scripted_model():
    from tests.helpers.scripted_model import ScriptedModel

    class SoakModel(ScriptedModel):
        """The scripted model; an answer to "slow ..." trickles out, for /stop to cut."""

        async def generate(self, prompt, params=None, request_id=None, *, tools=None,
                           priority=0, cache_salt=None) -> AsyncIterator:
            slow = next((m["content"] for m in reversed(prompt) if m["role"] == "user"),
                        "").startswith("slow")
            async for out in super().generate(prompt, params, request_id, tools=tools,
                                              priority=priority):
                yield out
                if slow:
                    await asyncio.sleep(0.05)

    return SoakModel(scripted_reply, chunk=16)


# ---- measures ---------------------------------------------------------------------------------


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


IGNORED_CHILDREN: set[int] = set()  # the fake services' process, multiprocessing's helper


def _children() -> list[str]:
    """This process's children (the soak's own helpers left out): "pid state command"."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in IGNORED_CHILDREN:
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if int(fields[1]) == me:
                if "resource_tracker" in cmd:
                    IGNORED_CHILDREN.add(int(entry.name))
                    continue
                found.append(f"{entry.name} {fields[0]} {cmd}")
    return found


def _object_types() -> Counter:
    return Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _cgroups() -> int:
    from sandbox import cgroups

    place, _ = cgroups.default.available()
    if place is None:
        return 0
    return sum(1 for p in place.root.iterdir() if p.name.startswith(cgroups.PREFIX))


TORCH_CACHE = (f"torchinductor_{os.environ.get('USER', 'root')}",)  # torch's own, made once


def _files_under(path: Path, skip: tuple[str, ...] = ()) -> int:
    count = 0
    for _, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in skip]
        count += len(files) + len(dirs)
    return count


def _size_kb(path: Path) -> int:
    try:
        return path.stat().st_size // 1024
    except OSError:
        return 0


def measure(daemon, tmpdir: Path, tmp_before: set[str]) -> dict[str, float]:
    gc.collect()
    gw = daemon.gateway
    connectors = {c.name: c for c in daemon.connectors}
    tg, dc = connectors.get("telegram"), connectors.get("discord")
    m: dict[str, float] = {
        "rss_mb": round(_rss_mb(), 1),
        "fds": len(os.listdir("/proc/self/fd")),
        "tasks": len(asyncio.all_tasks()),
        "threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "children": len(_children()),
        "lanes": len(gw.lanes.by_key),
        "listed": len(gw.access.listed),
        "moved": len(gw.lanes.moved),
        "warned": len(gw.due.warned),
        "ctx_cache": len(gw.agent.context._cache),
        "approvals": len(gw.approvals._pending),
        "ob_locks": len(gw.outbox._locks),
        "ob_retry": len(gw.outbox._retrying),
        "ob_wake": len(gw.outbox._wake),
        "rem_flight": len(daemon.reminders._in_flight),
        "tg_read": len(tg._read) if tg else 0,
        "tg_drafts": len(tg._drafts) if tg else 0,
        "dc_drafts": len(dc._drafts) if dc else 0,
        "metric_keys": daemon.metrics.counter_series(),
    }
    client = getattr(dc, "_client", None)
    state = getattr(client, "_connection", None)
    m["dc_users"] = len(getattr(state, "_users", {}) or {})
    m["dc_dm_chans"] = len(getattr(state, "_private_channels", {}) or {})
    # Everything discord.py's client state keeps in maps (users, channels, interactions...).
    m["dc_state"] = sum(len(v) for v in vars(state).values()
                        if isinstance(v, dict | list | set)) if state is not None else 0
    model = daemon.model
    if hasattr(model, "_streams"):  # the real engine
        m["eng_streams"] = len(model._streams)
        m["eng_owners"] = len(model._owners)
        m["eng_reqs"] = len(model.engine._requests)
        m["eng_seqs"] = len(model.engine.scheduler.running) + model.engine.scheduler.num_waiting
        # Tool-call grammars' token masks, cached per grammar state (engine/constrained).
        masks = getattr(model.engine.tool_constraints, "_masks", {}) or {}
        m["eng_grammars"] = len(masks)
        m["eng_mask_states"] = sum(len(c._cache) for c in masks.values())
        m["eng_mask_mb"] = round(sum(getattr(ids, "nbytes", 0) for c in masks.values()
                                     for _, ids in c._cache.values()) / 2**20, 1)
    data = daemon.config.data_dir
    m["db_kb"] = _size_kb(data / "openclaw.db")
    m["wal_kb"] = _size_kb(data / "openclaw.db-wal")
    m["data_files"] = _files_under(data, skip=("workspaces",))
    m["ws_files"] = _files_under(data / "workspaces")
    m["tmp_files"] = _files_under(tmpdir, skip=TORCH_CACHE)
    m["sys_tmp_new"] = len(set(os.listdir("/tmp")) - tmp_before)
    m["cgroups"] = _cgroups()
    return m


# What may grow with the users or messages ever seen, by design.
EXPECTED_GROWTH = {
    "db_kb": "the store keeps every conversation (retention prunes after keep_*_days)",
    "wal_kb": "checkpointed by SQLite; bounded by its autocheckpoint, not by us",
    "ws_files": "each user's workspace keeps what they wrote",
    "listed": "users the config lists (bounded by the config)",
    "ctx_cache": "an LRU of conversations, bounded by ContextBuilder.MAX_CACHED",
    "sys_tmp_new": "the whole machine's /tmp: other processes write there too",
    "rss_mb": None,  # judged with a tolerance below
}
# Slack for a measure that settles after the warm-up: the database's pool and the HTTP clients'
# connections open as they are first needed, the reload's outcome file and counter appear once.
TOLERANCE = {"rss_mb": 2.0, "fds": 3, "threads": 1, "os_threads": 1, "tasks": 1, "wal_kb": 4096,
             "metric_keys": 2, "data_files": 1,
             # Drafts of turns that ended without a reply, kept until DRAFT_IDLE_S (--lane-idle).
             "tg_drafts": 3, "dc_drafts": 3}


def verdicts(rows: list[dict[str, float]], users: list[int]) -> dict[str, str]:
    """Per measure, from the idle measures of phase 1 on (phase 0 warms up: imports, caches)."""
    out = {}
    for key in rows[0]:
        if key in ("phase", "users_seen", "messages"):
            continue
        values = [r[key] for r in rows[1:]] or [rows[0][key]]
        seen = users[1:] or users
        if key == "rss_mb" and len(values) >= 4:
            # Caches fill first (the prefix cache's KV pages, SQLite's, the history LRU): memory
            # that levels off is not a leak. Judged on the second half, per phase.
            values, seen = values[len(values) // 2:], seen[len(seen) // 2:]
        first, last = values[0], values[-1]
        rises = sum(1 for a, b in zip(values, values[1:], strict=False) if b > a)
        steps = max(len(values) - 1, 1)
        tolerance = TOLERANCE.get(key, 0)
        if key == "rss_mb":
            tolerance = max(tolerance, first / 200)
        grew = last - first > tolerance and rises >= max(1, steps * 2 // 3)
        idle_should_be_zero = key in ("lanes", "approvals", "ob_retry", "ob_wake",
                                      "rem_flight", "tg_read",
                                      "eng_streams", "eng_owners", "eng_reqs", "eng_seqs",
                                      "children", "cgroups", "tmp_files", "ob_locks")
        if grew and key == "rss_mb" and (len(values) < 3 or rises < steps):
            out[key] = f"noisy: {first:g} -> {last:g}, not rising at every phase (run more phases)"
        elif grew and key in EXPECTED_GROWTH and EXPECTED_GROWTH[key]:
            out[key] = f"grows, expected ({EXPECTED_GROWTH[key]})"
        elif grew:
            per = (last - first) / max(seen[-1] - seen[0], 1)
            out[key] = f"GROWS: {first:g} -> {last:g} ({per:.3g} per user seen)"
        elif idle_should_be_zero and last > 0:
            out[key] = f"LEFT OVER at idle: {last:g} (expected 0)"
        else:
            out[key] = "ok"
    return out


def print_table(rows: list[dict[str, float]], verdict: dict[str, str]) -> None:
    keys = list(rows[0])
    width = max(len(k) for k in keys) + 1
    print()
    print(f"{'measure':<{width}}" + "".join(f"{'p' + str(int(r['phase'])):>9}" for r in rows)
          + "  verdict")
    for key in keys:
        line = f"{key:<{width}}" + "".join(f"{r[key]:>9g}" for r in rows)
        print(line + ("  " + verdict[key] if key in verdict else ""))
    sys.stdout.flush()


# ---- the soak ---------------------------------------------------------------------------------


class User:
    def __init__(self, channel: str, uid: int, how: str) -> None:
        self.channel, self.uid, self.how = channel, uid, how  # how: config | allow | pairing | stranger
        self.sent = 0

    @property
    def key(self) -> str:
        return f"{self.channel}:{self.uid}"


def write_config(path: Path, data: Path, ep: dict, allowed: list[str], system_prompt: str,
                 extra: str, network: bool = False) -> None:
    path.write_text(f"""
data_dir = "{data}"
[access]
admins = ["telegram:{TG_ADMIN}"]
allow = [{", ".join(f'"{u}"' for u in allowed)}]
dm_policy = "pairing"
roles = {{ {", ".join(f'"{u}" = "careful"' for u in allowed)} }}
[admin]
enabled = true
port = 0
[agent]
temperature = 0.0
system_prompt = "{system_prompt}"
tool_timeout_s = 20
{extra}
[sandbox]
min_free_disk_mb = 16
[skills]
enabled = ["clock", "reminders", "files", "shell"]
[roles.user]
skills = ["clock", "reminders", "files", "shell"]
memory_mb = 256
wall_seconds = 3
network = {str(network).lower()}
[roles.careful]
skills = ["clock", "reminders", "files", "shell"]
approval = ["shell", "files"]
approval_timeout_s = 2
wall_seconds = 3
[telegram]
enabled = true
stream_edits = true
token = "{ep['tg_token']}"
base_url = "{ep['tg_base_url']}"
base_file_url = "{ep['tg_file_url']}"
[discord]
enabled = true
stream_edits = true
token = "{ep['dc_token']}"
api_base = "{ep['dc_api']}"
gateway_url = "{ep['dc_gateway']}"
""")
    path.chmod(0o600)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(args.dir)
        self.sent = 0
        self.users: list[User] = []
        self.config_allowed: list[str] = []
        self.rows: list[dict[str, float]] = []
        self.snapshot = None
        self.mute: list[asyncio.StreamWriter] = []
        self.answered: set[str] = set()

    async def send(self, user: User, text: str, *, attach: bool = False) -> None:
        user.sent += 1
        self.sent += 1
        if user.channel == "telegram":
            if attach:
                self.fakes.call("tg_doc", user=user.uid, text=text, name=f"doc{self.sent}.txt",
                                content=b"attached bytes\n" * 10)
            else:
                self.fakes.call("tg", user=user.uid, text=text)
        elif attach:
            self.fakes.call("dc", user=user.uid, text=text, name=f"doc{self.sent}.txt",
                            content=b"attached bytes\n" * 10)
        else:
            self.fakes.call("dc", user=user.uid, text=text)

    async def quiesce(self, settle: float = 0.6, timeout: float = 120.0) -> None:
        """Until every message is answered, nothing is pending, and the services saw no new bot
        message for `settle` seconds."""
        gw = self.daemon.gateway
        deadline = time.monotonic() + timeout
        last, since = None, time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            bot, unconfirmed, _ = self.fakes.call("quiet")
            dc = next(c for c in self.daemon.connectors if c.name == "discord")
            soon = await self.daemon.store.active_reminders(
                due_by=self.daemon.store.now() + timedelta(seconds=10))
            busy = (gw.queue_length() or gw.outbox.backlog or unconfirmed
                    or dc._inboxes or self.daemon.reminders._in_flight or soon)
            state = (bot, busy)
            if state != last or busy:
                last, since = state, time.monotonic()
            elif time.monotonic() - since >= settle:
                return
        print("  (quiesce timed out)", flush=True)

    async def idle(self) -> None:
        """Quiet, then long enough for idle lanes to end."""
        await self.quiesce()
        await asyncio.sleep(self.args.lane_idle + 0.5)
        await self.quiesce(settle=0.2)

    def new_users(self, phase: int) -> list[User]:
        n = self.args.users_per_phase
        made = []
        for i in range(n):
            index = phase * n + i
            channel = "telegram" if i % 2 == 0 else "discord"
            uid = (TG_BASE if channel == "telegram" else DC_BASE) + index
            how = ["config", "allow", "allow", "allow", "pairing", "stranger"][i % 6]
            made.append(User(channel, uid, how))
        return made

    async def admit(self, users: list[User]) -> None:
        """Admit this phase's users: the config's are listed in it already; `openclaw users
        allow` for some; pairing codes, a few at a time (the store keeps 3 waiting at most)."""
        store = self.daemon.store
        for u in users:
            if u.how == "allow":
                await store.ensure_user(u.channel, str(u.uid))
                await store.set_user_status(u.channel, str(u.uid), "allowed")
        for code in await store.list_pairing_codes():  # the owner clears the queue first
            await store.deny_pairing(code.code)
        pairing = [u for u in users if u.how == "pairing"]
        for batch in (pairing[i:i + 3] for i in range(0, len(pairing), 3)):
            for u in batch:
                await self.send(u, "hello, may I?")
            await self.quiesce()
            for u in batch:
                texts = self.fakes.call("texts", channel=u.channel, user=u.uid)
                codes = [c for t in texts for c in CODE.findall(t)]
                if codes and await store.approve_pairing(codes[-1]) is None:
                    print(f"  pairing code of {u.key} not approved", flush=True)
                    u.how = "stranger"
                elif not codes:
                    print(f"  no pairing code for {u.key}: {texts[-1:]}", flush=True)
                    u.how = "stranger"
        # Strangers ask too, and are never admitted; the owner denies their codes (a waiting code
        # holds one of the 3 places for an hour).
        for u in users:
            if u.how == "stranger":
                await self.send(u, "hello, who are you?")
        await self.quiesce()
        for code in await store.list_pairing_codes():
            await store.deny_pairing(code.code)

    async def scrape(self) -> None:
        """/metrics and /healthz, as Prometheus and `doctor` ask; and a client that connects and
        says nothing (the server's read timeout must end it)."""
        admin = self.daemon.admin
        for path in ("/metrics", "/healthz"):
            reader, writer = await asyncio.open_connection(admin.host, admin.port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            await reader.read()
            writer.close()
            await writer.wait_closed()
        _, mute = await asyncio.open_connection(admin.host, admin.port)
        self.mute.append(mute)
        while len(self.mute) > 3:  # hung up on after a while by the client too
            old = self.mute.pop(0)
            old.close()

    async def console(self, rnd: int) -> None:
        """`openclaw chat` attaches, says a line and waits for "done"; every other time it hangs
        up before the answer."""
        reader, writer = await asyncio.open_unix_connection(
            str(self.root / "data" / "openclaw.sock"))
        writer.write(json.dumps({"text": f"slow console line {rnd}" if rnd % 2 else
                                 f"console line {rnd}"}).encode() + b"\n")
        self.sent += 1
        if rnd % 2 == 0:
            while line := await reader.readline():
                if json.loads(line)["type"] == "done":
                    break
        writer.close()
        await writer.wait_closed()
        if rnd % 2:  # the reply waits for a console; the next one to attach gets it
            reader, writer = await asyncio.open_unix_connection(
                str(self.root / "data" / "openclaw.sock"))
            try:
                async with asyncio.timeout(15):
                    while line := await reader.readline():
                        if json.loads(line)["type"] == "reply":
                            break
            except TimeoutError:
                print("  the console's waiting reply did not come", flush=True)
            writer.close()
            await writer.wait_closed()

    async def chat_round(self, users: list[User], rnd: int) -> None:
        kinds = self.args.kinds
        await self.scrape()
        await self.console(rnd)
        if rnd % 3 == 1:
            self.fakes.call("fail")
        blocked: list[User] = []
        for i, u in enumerate(users):
            kind = kinds[(u.uid + rnd + i) % len(kinds)]
            if kind == "stop":
                await self.send(u, "slow please tell me everything")
                await asyncio.sleep(0.02)
                await self.send(u, "/stop")
            elif kind == "stopshell":
                await self.send(u, "shellslow and then stopped")
                await asyncio.sleep(0.5)
                await self.send(u, "/stop")
            elif kind == "blockme":  # `openclaw users block` while their answer streams
                await self.send(u, "slow tell me a story")
                blocked.append(u)
            elif kind == "group":
                self.fakes.call("group", channel=u.channel, user=u.uid,
                                text=f"plain from {u.key} in the group")
                self.sent += 1
            elif kind == "new":
                await self.send(u, "/new")
            elif kind == "status":
                if u.channel == "discord" and rnd % 2:
                    self.fakes.call("dc_slash", user=u.uid, command="status")
                    self.sent += 1
                else:
                    await self.send(u, "/status")
            elif kind == "attach":
                await self.send(u, "here is a file for you", attach=True)
            elif kind == "remindcmd":
                await self.send(u, "/remind in 2 seconds drink water")
            else:
                await self.send(u, f"{kind} round {rnd} from {u.key}")
        # The careful users' calls wait for their /approve: one approves, one denies, one lets
        # it time out (approval_timeout_s).
        await asyncio.sleep(0.5)
        for u in users:
            if u.how != "config":
                continue
            for text in self.fakes.call("texts", channel=u.channel, user=u.uid):
                for number in APPROVE.findall(text):
                    if number in self.answered:
                        continue
                    self.answered.add(number)
                    if int(number) % 3 == 0:
                        await self.send(u, f"/approve {number}")
                    elif int(number) % 3 == 1:
                        await self.send(u, f"/deny {number}")
        if blocked:
            await asyncio.sleep(0.4)
            for u in blocked:
                await self.daemon.store.set_user_status(u.channel, str(u.uid), "blocked")
                u.how = "blocked"
        await self.quiesce()

    async def reload(self) -> None:
        """SIGHUP midway: a new system prompt, and this phase's config users listed."""
        self.config_allowed = list(dict.fromkeys(
            self.config_allowed + [u.key for u in self.users if u.how == "config"]))
        write_config(self.config_path, self.root / "data", self.fakes.endpoints,
                     self.config_allowed, "You are a soak-tested assistant (reloaded).", self.extra,
                     self.args.network)
        before = self.daemon.metrics.value("openclaw_config_reloads_total", result="ok")
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if self.daemon.metrics.value("openclaw_config_reloads_total", result="ok") > before:
                print("  config reloaded (SIGHUP)", flush=True)
                return
        print("  the reload did not take effect", flush=True)

    async def run(self) -> int:
        from connectors import drafts as drafts_module
        from connectors.telegram import Backoff, TelegramConnector
        from openclaw.channels import configured_connectors
        from openclaw.cli.chat import console_connector
        from openclaw.config import load_config
        from openclaw.daemon import Daemon
        from openclaw.gateway import lanes as lanes_module

        args = self.args
        # Months in minutes: what ends after a while idle (lanes, drafts) ends after --lane-idle.
        lanes_module.LANE_IDLE_S = args.lane_idle
        drafts_module.DRAFT_IDLE_S = args.lane_idle
        self.fakes = Fakes()
        IGNORED_CHILDREN.add(self.fakes.proc.pid)
        self.config_path = self.root / "openclaw.toml"
        self.extra = ("reply_max_tokens = 24\n[engine]\nkv_cache_gib = 0.25\n"
                      "max_num_seqs = 8\nmax_model_len = 2048\n" if args.engine == "real" else "")
        # The config users of every phase are listed at the start, but for the reload's.
        phases = args.phases
        planned = [u for p in range(phases) for u in self.new_users(p)]
        half = phases // 2
        self.config_allowed = [u.key for u in planned[: half * args.users_per_phase]
                               if u.how == "config"]
        write_config(self.config_path, self.root / "data", self.fakes.endpoints,
                     self.config_allowed, "You are a soak-tested assistant.", self.extra,
                     args.network)
        config = load_config(self.config_path)
        model = make_scripted_model() if args.engine == "scripted" else None
        connectors = [c for c in configured_connectors(config) if c.name == "discord"]
        ep = self.fakes.endpoints
        connectors.append(TelegramConnector(ep["tg_token"], base_url=ep["tg_base_url"],
                                            base_file_url=ep["tg_file_url"], poll_timeout=2,
                                            backoff=Backoff(0.05, 0.4)))
        self.daemon = daemon = Daemon(config, model=model, connectors=connectors)
        # The console `openclaw chat` attaches to, as `openclaw run` serves it.
        daemon.connectors.append(console_connector(self.root / "data" / "openclaw.sock", daemon))
        t0 = time.monotonic()
        before = {"fds": len(os.listdir("/proc/self/fd")), "tasks": len(asyncio.all_tasks()),
                  "threads": threading.active_count(), "children": len(_children()),
                  "cgroups": _cgroups()}
        await daemon.start()
        print(f"daemon started in {time.monotonic() - t0:.1f} s ({args.engine} model)", flush=True)
        tmp_before = self.tmp_before
        try:
            returning: list[User] = []
            for phase in range(phases):
                t = time.monotonic()
                users = [u for u in self.new_users(phase)]
                if phase == half and phase > 0:
                    self.users += users
                    await self.reload()
                else:
                    self.users += users
                await self.admit(users)
                talkers = [u for u in users if u.how not in ("stranger", "blocked")] + returning
                for rnd in range(args.rounds):
                    await self.chat_round([u for u in talkers if u.how != "blocked"], rnd)
                returning = talkers[: max(2, len(talkers) // 6)]
                # The network drops once a phase (a home router's nightly reconnect): both
                # connectors reconnect; nothing of the old connections may stay.
                self.fakes.call("blip", seconds=1.0, discord_down=phase % 2 == 1)
                await self.idle()
                if hasattr(daemon.model, "prompts"):  # the scripted model keeps every prompt
                    daemon.model.prompts.clear()      # (a test double's record, not the daemon's)
                    daemon.model.aborted.clear()
                row = {"phase": phase, "users_seen": len(self.users), "messages": self.sent,
                       **measure(daemon, Path(tempfile.gettempdir()), tmp_before)}
                self.rows.append(row)
                if args.tracemalloc and phase == 1:
                    self.snapshot = tracemalloc.take_snapshot()
                    self.types = _object_types()
                for key, lane in daemon.gateway.lanes.by_key.items():
                    print(f"  lane left at idle: {key} busy={lane.busy} queued={lane.queue.qsize()}"
                          f" worker={lane.worker}", flush=True)
                for child in _children():
                    print(f"  child process at idle: {child}", flush=True)
                print(f"phase {phase}: {len(self.users)} users seen, {self.sent} messages sent, "
                      f"{time.monotonic() - t:.1f} s; rss {row['rss_mb']} MB, fds {row['fds']}, "
                      f"tasks {row['tasks']}, lanes {row['lanes']}", flush=True)
            self.audit = Counter(
                (a.skill, a.decision, a.exit_status, (a.detail or "")[:50])
                for a in await daemon.store.list_audit(limit=100_000))
            # A stop while a command runs and answers stream: nothing of them may outlive it.
            last = [u for u in self.users if u.how not in ("stranger", "blocked")][:4]
            for u in last:
                await self.send(u, "shellslow at the stop" if u.uid % 2 else "slow at the stop")
            await asyncio.sleep(0.8)
        finally:
            for writer in self.mute:
                writer.close()
            await daemon.stop(drain_timeout=0.5)
            self.fakes.stop()
        await asyncio.sleep(0.5)
        gc.collect()
        after = {"fds": len(os.listdir("/proc/self/fd")), "tasks": len(asyncio.all_tasks()),
                 "threads": threading.active_count(), "children": len(_children()),
                 "cgroups": _cgroups()}
        print("\nbefore the start -> after the stop: " + ", ".join(
            f"{k} {before[k]} -> {after[k]}" for k in before))
        for child in _children():
            print(f"  child process after the stop: {child}")
        if args.tracemalloc and self.snapshot is not None:
            gc.collect()
            grown = tracemalloc.take_snapshot().compare_to(self.snapshot, "lineno")
            print("\nallocations grown since phase 1 (tracemalloc, top 15):")
            for stat in grown[:15]:
                print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  "
                      f"{stat.traceback[0].filename.replace(str(ROOT) + '/', '')}:"
                      f"{stat.traceback[0].lineno}")
        if args.tracemalloc and self.snapshot is not None:
            types = _object_types()
            types.subtract(self.types)
            print("objects (gc) grown since phase 1: " + ", ".join(
                f"{name} {n:+d}" for name, n in types.most_common(12)))
            kept = Counter()  # which code the tracebacks still alive point into (exceptions kept)
            for o in gc.get_objects():
                if isinstance(o, types_module.TracebackType):
                    while o.tb_next is not None:
                        o = o.tb_next
                    kept[f"{o.tb_frame.f_code.co_filename.rsplit('/', 2)[-1]}:"
                         f"{o.tb_frame.f_code.co_name}"] += 1
            print("tracebacks alive, by innermost frame: " + ", ".join(
                f"{name} x{n}" for name, n in kept.most_common(6)))
        verdict = verdicts(self.rows, [int(r["users_seen"]) for r in self.rows])
        print_table(self.rows, verdict)
        print(f"\n{self.sent} messages from {len(self.users)} users in {time.monotonic() - t0:.0f} s")
        print("tool calls (skill, decision, exit status, detail): " + "; ".join(
            f"{k} x{n}" for k, n in sorted(self.audit.items(), key=str)))
        new_tmp = sorted(set(os.listdir("/tmp")) - tmp_before)
        if new_tmp:
            print(f"/tmp entries that appeared during the run (any process): {new_tmp[:20]}")
        bad = {k: v for k, v in verdict.items()
               if not v.startswith(("ok", "grows, expected", "noisy"))}
        # The fake services' pipe and the asyncio.run task itself may remain; threads of the
        # default executor stay (idle) until the loop closes.
        for key, slack in (("fds", 2), ("tasks", 0), ("children", 0), ("cgroups", 0)):
            if after[key] > before[key] + slack:
                bad[f"{key} after stop"] = f"{before[key]} -> {after[key]}"
        print("verdict:", "no leak found" if not bad else f"{len(bad)} suspect measure(s): "
              + ", ".join(bad))
        return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("scripted", "real"), default="scripted",
                        help="the scripted model (fast), or the embedded SmolLM2 on the CPU")
    parser.add_argument("--phases", type=int, default=6)
    parser.add_argument("--users-per-phase", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=6, help="chat rounds per phase")
    parser.add_argument("--lane-idle", type=float, default=1.5,
                        help="seconds before an idle lane ends (LANE_IDLE_S; 600 in production)")
    parser.add_argument("--kinds", default="plain,clock,file,shell,remind,attach,new,stop,status,"
                        "remindcmd,shellbg,shellslow,stopshell,plain,blockme,group",
                        help="what users send, in turn")
    parser.add_argument("--network", action="store_true",
                        help="shell commands get the network (slirp4netns per command)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="print what allocated the memory that grew from phase 1 to the end")
    parser.add_argument("--dir", default="/tmp/soak/run")
    parser.add_argument("--keep", action="store_true", help="keep --dir afterwards")
    args = parser.parse_args()
    args.kinds = args.kinds.split(",")
    if args.engine == "real" and "shell" in args.kinds:
        # A random-ish small model does not call tools on cue: only chat, /new, /stop, /status.
        args.kinds = ["plain", "new", "stop", "status", "plain"]
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    (root / "tmp").mkdir(parents=True)
    os.environ["TMPDIR"] = str(root / "tmp")  # the daemon's temporary files, counted apart
    tempfile.tempdir = None
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.tracemalloc:
        tracemalloc.start(1)
    soak = Soak(args)
    soak.tmp_before = set(os.listdir("/tmp"))
    try:
        return asyncio.run(soak.run())
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
