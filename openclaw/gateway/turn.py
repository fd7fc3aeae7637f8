"""One turn: a message answered by the agent. The user's files are fetched into their workspace,
the model runs with typing (and drafts, where the channel streams them) shown in the chat, the
reply is delivered, and the tokens spent are counted against the role's daily cap. A model that
cannot be reached (its server down) keeps the turn: the user is told once, and it goes on from
what it stored when the model is back."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from openclaw.agent import Agent, Caller, TurnResult
from openclaw.agent.model import ModelUnavailable
from openclaw.agent.resume import take_up
from openclaw.gateway.access import Access
from openclaw.gateway.approvals import Approvals, asking_in
from openclaw.gateway.contract import Connector, Folder, InboundMessage
from openclaw.gateway.lanes import Lane, Lanes, TurnJob
from openclaw.gateway.outbox import Outbox
from openclaw.gateway.tool_lines import tool_line, with_tool_lines
from openclaw.metrics import Metrics
from openclaw.store import Store
from openclaw.store.records import InboundEvent, InboundStatus
from openclaw.store.trace_records import TraceStatus
from openclaw.traces.record import record_turn, status_of
from sandbox.disk_budget import DiskFull, check_room
from sandbox.grants import UnsafeGrant, open_folder, writable_folders
from sandbox.policy import Principal
from sandbox.to_end import run_to_end
from skills.executor import Outcome

log = logging.getLogger(__name__)

TYPING_REFRESH_S = 4.0  # chat apps show "typing" for about 5 s after each signal
# Waits between tries of a turn whose model cannot be reached: doubling up to the most.
MODEL_RETRY_S = 2.0
MODEL_RETRY_MAX_S = 60.0
MODEL_AWAY = ("I cannot reach my model right now, so your message waits: I will answer it as soon "
              "as the model is back.")


class Sink:
    """Typing and draft updates for one chat, rate-limited so a phone app is not flooded; and the
    lines that show the turn's tool calls (`show_tools`: see tool_lines), in the draft where it
    streams, and before the reply."""

    def __init__(self, connector: Connector, chat_id: str, stream: bool,
                 show_tools: str = "off") -> None:
        self.connector, self.chat_id, self.stream = connector, chat_id, stream
        self.show_tools = show_tools
        self.tool_lines: list[str] = []
        self._last_typing = 0.0
        self.draft_text = ""
        self.paused = False  # no typing shown while the turn waits for the model
        self._kept: asyncio.Task | None = None  # keep_typing's task, once started

    async def typing(self) -> None:
        if self._kept is not None:  # shown and refreshed from its own task: the turn never
            return  # waits for the service's answer
        now = time.monotonic()
        if now - self._last_typing >= TYPING_REFRESH_S:
            await self._show_typing()

    async def draft(self, text: str) -> None:
        if self.stream and self.connector.streams_drafts:
            self.draft_text = with_tool_lines(self.tool_lines, text)
            await self.connector.draft(self.chat_id, self.draft_text)

    async def tool_ran(self, name: str, arguments: Any, outcome: Outcome) -> None:
        line = tool_line(self.show_tools, name, arguments, outcome)
        if line is not None:
            self.tool_lines.append(line)
            await self.draft("")  # the step's text before the call gives way to the lines

    def reply(self, text: str) -> str:
        """The reply as the chat gets it: after the tool lines, as the draft it replaces shows."""
        return with_tool_lines(self.tool_lines, text)

    def keep_typing(self) -> asyncio.Task:
        """The typing indicator on, in a task of its own, and kept on (it fades after about 5 s)
        until the task is cancelled: `typing` then leaves it to the task."""
        async def keep() -> None:
            while True:
                if not self.paused:
                    await self._show_typing()
                await asyncio.sleep(TYPING_REFRESH_S)

        self._kept = asyncio.create_task(keep())
        return self._kept

    async def _show_typing(self) -> None:
        self._last_typing = time.monotonic()
        try:
            await self.connector.typing(self.chat_id)
        except Exception as exc:  # cosmetic: never fail a turn over it
            log.debug("typing indicator failed: %s", exc)


class Spending:
    """Tokens each user spent today: what the store has, and what their running turns spent so
    far (it reaches the store only when a turn ends, and the daily cap must count it before)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.running: dict[str, list[TurnResult]] = {}  # each user's turns now running
        # Held while a turn's usage moves from `running` to the store, and while both are read:
        # a look in between would count that turn twice.
        self._lock = asyncio.Lock()

    def begin(self, user: str) -> TurnResult:
        """A turn's result, filled as it goes: what a turn cut short (/stop, /new) spent counts."""
        result = TurnResult(text="", steps=0)
        self.running.setdefault(user, []).append(result)
        return result

    async def end(self, user: str, result: TurnResult, conversation_id: int,
                  together: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Write what the turn spent to the store, and stop counting it as running. `together`:
        a write that stores the usage with what else it stores (the turn's trace), in one
        transaction; whether it did (if not, the usage is written alone)."""
        async with self._lock:
            try:  # a store call ends whole even if the turn is cancelled meanwhile
                if together is None or not await together():
                    await self.store.add_usage(user, result.prompt_tokens,
                                               result.completion_tokens,
                                               conversation_id=conversation_id)
            finally:  # in the store now (or lost with it): no longer counted as running
                spending = self.running.get(user, [])
                spending[:] = [r for r in spending if r is not result]  # this one, not an equal
                if not spending and self.running.get(user) is spending:
                    del self.running[user]

    async def today(self, user: str | None = None) -> int:
        """The user's tokens today (everyone's: None), with those of turns still running."""
        async with self._lock:
            running = [r for u, results in self.running.items() if user in (None, u)
                       for r in results]
            stored = await self.store.tokens_today(user)
            # Summed after the read: what they spent meanwhile counts too.
            return stored + sum(r.prompt_tokens + r.completion_tokens for r in running)


class Turns:
    def __init__(self, store: Store, agent: Agent, access: Access, approvals: Approvals,
                 outbox: Outbox, lanes: Lanes, spending: Spending, metrics: Metrics) -> None:
        self.store, self.agent, self.access, self.approvals = store, agent, access, approvals
        self.outbox, self.lanes, self.spending, self.metrics = outbox, lanes, spending, metrics

    async def run(self, lane: Lane, job: TurnJob) -> None:
        msg, event = job.message, job.event
        connector = self.outbox.connectors.get(msg.channel)
        if connector is None:
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "connector not running")
            return
        if not job.fresh and not await self.access.still_allowed(msg.user):  # blocked meanwhile
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
            return
        conversation_id = await self.lanes.conversation(lane, msg.user, msg.chat_id, msg.channel)
        if lane.stop_requested:
            lane.stop_requested = False
            self.metrics.inc("openclaw_turns_total", result="stopped")
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped by the user")
            return
        config = self.access.config
        role = self.access.role_name(msg.user)  # now, not at admission: a reload may change it
        try:
            principal = self.access.policy.principal(msg.user, role)
        except OSError as exc:  # the role's workspace cannot be created: tell the user, and the log
            log.error("cannot prepare the workspace of %s (role %s; see roles.%s.workspace): %s",
                      msg.user, role, role, exc)
            await self.outbox.reply(msg.channel, msg.chat_id, "Sorry, I cannot work right now: my "
                                    "workspace for you is not usable. The owner has been told (see "
                                    "the daemon's log).", conversation_id=None, event=event)
            return
        if await self._out_of_tokens(principal, msg, event):
            return
        approver = asking_in(self.approvals, self.outbox, msg.channel, msg.chat_id)
        caller = Caller(principal, msg.chat_id, approver=approver,
                        still_allowed=functools.partial(self.access.still_allowed, msg.user),
                        principal_now=functools.partial(self.access.principal, msg.user),
                        has_tokens=functools.partial(self._has_tokens, msg.user),
                        in_group=msg.is_group)
        # Drafts are one per chat: in a group two users' answers could stream into the same one.
        stream = (bool(getattr(getattr(config, msg.channel, None), "stream_edits", False))
                  and not msg.is_group) or msg.channel == "terminal"
        sink = Sink(connector, msg.chat_id, stream, config.agent.show_tools)
        started, started_at = time.monotonic(), self.store.now()
        result = self.spending.begin(msg.user)
        traced: TraceStatus | None = None  # how the turn ended, once it ran: for its trace
        ended = started

        text: str | None = None  # the message as the turn stores it, once made

        async def attempt(resumed: bool) -> TurnResult:
            nonlocal text
            taken_up = await take_up(
                self.agent.context, self.agent.executor, principal, conversation_id,
                functools.partial(stored_as, msg), event.received_at) if resumed else None
            if taken_up is not None and taken_up.uncounted_id is not None:
                result.uncounted = (taken_up.uncounted_id, taken_up.text)
            if taken_up is not None and taken_up.answer is not None:
                result.text = taken_up.answer  # the turn had ended: its answer, not a second run
                return result
            if taken_up is not None:  # as stored: its files are not fetched (and saved) again
                text = taken_up.text
            elif text is None:
                note = await self._attachments_note(connector, msg.attachments, principal)
                text = (msg.text + note).strip()
            return await self.agent.run_turn(
                conversation_id, caller, text, sink,
                run_id=f"turn-{event.id}-{uuid.uuid4().hex[:8]}", stored=taken_up is not None,
                result=result)

        async def answer() -> TurnResult:  # what /stop cancels: the files, then the turn
            resumed, delay, told = job.resumed, MODEL_RETRY_S, False
            while True:
                try:
                    return await attempt(resumed)
                except ModelUnavailable as exc:
                    log.log(logging.DEBUG if told else logging.WARNING,
                            "message %d waits for the model: %s", event.id, exc)
                    if not told:
                        told = True
                        await self._say_model_away(msg, exc)
                    sink.paused = True
                    if not await self._wait_for_model(delay):
                        raise  # the daemon is stopping: the message waits for the next start
                    sink.paused = False
                    # Again from what this try stored (its steps are not run twice).
                    resumed, delay = True, min(delay * 2, MODEL_RETRY_MAX_S)

        typing = sink.keep_typing()
        try:
            lane.current = asyncio.current_task()  # the lane's worker: what /stop cancels now
            try:
                await answer()
            except asyncio.CancelledError:
                lane.current = None
                if lane.took_stops():  # the daemon is stopping, not (only) /stop
                    raise
                self.metrics.inc("openclaw_turns_total", result="stopped")
                traced, ended = TraceStatus.STOPPED, time.monotonic()
                await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped by the user")
                return
            except ModelUnavailable:  # left unanswered in the store, for the next start
                log.info("message %d is left for the next start: the model is still away", event.id)
                return
            finally:
                lane.current = None
                lane.took_stops()  # a cancel the turn let pass must not cancel a later await
                typing.cancel()
            self.metrics.observe("openclaw_turn_seconds", time.monotonic() - started)
            self.metrics.inc("openclaw_turns_total", result="refused" if result.refused else
                             "failed" if result.failed else "answered")
            await self._deliver(msg, event, caller, result, conversation_id, sink)
            traced, ended = None if result.refused else status_of(result), time.monotonic()
        finally:
            # After the send (the user does not wait for this write), and however the turn
            # ended: stopped, failed, cut by shutdown.
            self.metrics.inc("openclaw_completion_tokens_total", result.completion_tokens)
            self.metrics.inc("openclaw_prompt_tokens_total", result.prompt_tokens)
            # The turn's trace with its usage: one transaction, after the reply is out.
            trace = None if traced is None else functools.partial(
                record_turn, self.store, self.agent, user=msg.user,
                conversation_id=conversation_id, result=result, status=traced,
                started_at=started_at, duration_s=ended - started, inbound_event_id=event.id,
                with_usage=True)
            await self.spending.end(msg.user, result, conversation_id, together=trace)
            # The user's message's token count, now that the reply is out (or the turn stopped);
            # not while the daemon stops: a message left unanswered is counted when taken up.
            if not asyncio.current_task().cancelling():
                await self.agent.count_later(result)

    async def _deliver(self, msg: InboundMessage, event: InboundEvent, caller: Caller,
                       result: TurnResult, conversation_id: int, sink: Sink) -> None:
        """Send a turn's reply. Storing it marks the message answered, in one transaction: after
        a crash the reply is re-sent, the turn never run twice. The tool lines go with it in the
        outbox (sent once, with the reply), never into the conversation the model reads."""
        # Access withdrawn during the turn: the agent stopped before its next tool or model call,
        # or the answer was written meanwhile; either way they get nothing, not even a word that
        # it stopped. (One indexed SELECT for a user the store admitted; none for the config's.)
        if result.refused or not await caller.still_allowed():
            log.info("message %d left unanswered: access of %s was withdrawn during its turn",
                     event.id, msg.user)
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
        else:
            await self.outbox.reply(msg.channel, msg.chat_id, sink.reply(result.text),
                                    conversation_id=conversation_id, event=event)

    async def _say_model_away(self, msg: InboundMessage, exc: ModelUnavailable) -> None:
        """Tell the user their message waits for the model; the owner also hears why."""
        text = MODEL_AWAY + (f" ({exc})" if self.access.is_owner(msg.user) else "")
        await self.outbox.reply(msg.channel, msg.chat_id, text, conversation_id=None, event=None)

    async def _wait_for_model(self, delay: float) -> bool:
        """Wait `delay` seconds before the turn tries the model again, or less if the daemon
        starts stopping meanwhile (it must not wait for a model that may stay away); whether to
        try again."""
        loop = asyncio.get_running_loop()
        end = loop.time() + delay
        while self.lanes.accepting and (left := end - loop.time()) > 0:
            await asyncio.sleep(min(left, 0.1))
        return self.lanes.accepting

    async def _has_tokens(self, user: str) -> bool:
        """Whether the user's role, as the config says now, leaves them tokens today."""
        limit = self.access.role(user).daily_tokens
        return not limit or await self.spending.today(user) < limit

    async def _out_of_tokens(self, principal: Principal, msg: InboundMessage,
                             event: InboundEvent) -> bool:
        """Whether the user's role caps their tokens a day and today's are spent; if so they are
        told, and the model is not asked."""
        limit = principal.role.daily_tokens
        if not limit or (used := await self.spending.today(msg.user)) < limit:
            return False
        log.info("message %d not answered: %s has used %d of their %d tokens today", event.id,
                 msg.user, used, limit)
        text = (f"You have used today's {limit} tokens, so I cannot answer until 00:00 UTC. "
                "(Commands such as /reminders still work.)")
        if self.access.is_owner(msg.user):  # the one who can change it
            text += (f" The cap is daily_tokens in [roles.{principal.role.name}]; raise it in the "
                     f"config, then {self.access.apply_edit}.")
        await self.outbox.reply(msg.channel, msg.chat_id, text, conversation_id=None, event=event)
        return True

    async def _attachments_note(self, connector: Connector, refs: list[str],
                                principal: Principal) -> str:
        """Fetch the user's files into their workspace (only now: the user is admitted) and tell
        the agent where they are, or why one could not be. Each is fetched only while the
        workspace is under its quota and the disk above the reserve, as a command is run. Every
        file is created relative to the workspace's descriptor, opened as the sandbox opens it, so
        a folder a command swapped for a link gets nothing."""
        if not refs:
            return ""
        try:  # a few opens, in the loop: a descriptor opened in a thread leaks if /stop comes
            fd = open_folder(principal.workspace, writable_folders(principal.scope))
        except OSError as exc:  # UnsafeGrant, or no folder there
            return "\n\n" + _not_saved(principal, len(refs), exc)
        folder = Folder(fd, principal.scope.uid if os.geteuid() == 0 else None)
        config = self.access.config
        names, notes = [], []
        try:
            for ref in refs:
                try:
                    # The folder opened, through its descriptor, not the path (now maybe a link);
                    # to its end on /stop: it uses the descriptor closed below.
                    await run_to_end(asyncio.to_thread(
                        check_room, Path(f"/proc/self/fd/{fd}"), (config.data_dir,),
                        quota=principal.limits.disk_bytes,
                        reserve=config.sandbox.min_free_disk_mb << 20))
                except DiskFull as full:
                    notes.append(f"[The user sent a file, which was not saved: {full}.]")
                    continue
                name, note = await connector.fetch_attachment(ref, folder)
                names += [name] if name else []
                notes += [note] if note else []
        finally:
            os.close(fd)
        parts = ([f"[attached files, in your workspace: {', '.join(names)}]"] if names else []) + notes
        return "\n\n" + "\n".join(parts)


def _not_saved(principal: Principal, count: int, exc: OSError) -> str:
    """The agent's note, and the log's error, for files not saved because the workspace could not
    be opened safely: nothing was written anywhere."""
    log.error("not saving %d file(s) %s sent: their workspace %s cannot be opened safely: %s",
              count, principal.user, principal.workspace, exc)
    if isinstance(exc, UnsafeGrant):
        why = ("the way to your workspace leads through a symbolic link inside a folder sandboxed "
               "commands may write, which a command may have put there, so I write nothing into "
               "it (your commands are refused too)")
    else:
        why = f"your workspace cannot be opened ({exc.strerror or exc})"
    files = "a file, which was" if count == 1 else f"{count} files, which were"
    return (f"[The user sent {files} not saved: {why}. The owner must check the workspace; "
            "the daemon's log says which.]")


def stored_as(msg: InboundMessage, stored: str) -> bool:
    """Whether `stored` is `msg` as a turn stores it: its text, then the note on its files."""
    if not msg.attachments:
        return stored == msg.text.strip()
    text = msg.text.lstrip()  # (text + note).strip(): the note starts with "\n\n"
    note = stored[len(text):] if stored.startswith(text) else ""
    return note.startswith("\n\n[") or (not text.strip() and stored.startswith("["))
