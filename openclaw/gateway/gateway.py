"""The gateway: every inbound message passes here. Access check, persist (dedupe), chat commands,
then one serial lane per conversation, concurrent across conversations, then delivery.

The inbound message is stored before `handle` returns, which is when a connector acknowledges it
to its service: a crash loses nothing, and a redelivery is recognised and not answered twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw import reminders
from openclaw.agent import Agent, Caller, TurnResult
from openclaw.agent.resume import take_up
from openclaw.config import Config
from openclaw.gateway import access
from openclaw.gateway.approvals import STALE_REQUEST, Approvals
from openclaw.gateway.contract import APPROVAL_ASKED, Connector, DeliveryRefused, Folder, InboundMessage
from openclaw.gateway.outbox import Outbox, chunk_text
from openclaw.metrics import Metrics
from openclaw.store import Reminder, Store, UnknownUserError
from openclaw.store.records import (
    InboundEvent,
    InboundStatus,
    OutboundMessage,
    UserStatus,
    parse_user_key,
)
from sandbox.disk_budget import DiskFull, check_room
from sandbox.grants import UnsafeGrant, open_folder, writable_folders
from sandbox.policy import Policy, Principal, UnknownRole
from sandbox.to_end import run_to_end
from skills.base import visible
from skills.builtin.spoken_time import split_request

log = logging.getLogger(__name__)

HELP = (
    "Commands:\n"
    "/new - archive this conversation and start a fresh one\n"
    "/stop - stop the answer being generated (and any running tool)\n"
    "/status - model, device, queue, KV cache use, tokens used today\n"
    "/approve N, /deny N - answer a request to run a tool\n"
    "/remind WHEN TEXT - e.g. /remind in 20 minutes stretch, /remind every weekday at 8:00 pills\n"
    "/reminders - your reminders in this chat; /reminders cancel N\n"
    "/pairing - (the owner) who asked for access; /pairing approve CODE, /pairing deny CODE\n"
    "/help - this list"
)
COMMANDS = ("/new", "/stop", "/status", "/help", "/start", "/approve", "/deny", "/remind",
            "/reminders", "/pairing")
# The reminders skill's words for the model, said to the person who typed /remind or /reminders.
TO_THE_PERSON = (("list shows them", "/reminders shows them"),
                 ("ask the user which, then say", "which one? Write"))
REMIND_NOT_REPEATED = ("I restarted before answering your /remind, so I did not repeat it: see "
                       "/reminders, and send it again if it is not there.")
REMIND_USAGE = ("Tell me when and what, e.g. /remind in 20 minutes stretch, /remind tomorrow 9:00 "
                "dentist, /remind every weekday at 8:00 pills.")
REMINDERS_USAGE = ("/reminders lists your reminders in this chat; /reminders cancel N cancels one, N "
                   "as the list numbers it (e.g. /reminders cancel 2).")
TYPING_REFRESH_S = 4.0  # chat apps show "typing" for about 5 s after each signal
# A lane with nothing to do for this long ends (its worker too): over months, people and chats come
# and go, and each lane kept would cost memory and a look at every /metrics, /status and stop. The
# next message of its chat makes a new one, which looks its conversation up again.
LANE_IDLE_S = 600.0
WARNED_KEPT = 1024  # reminder ids remembered as warned about (see Gateway._warn_no_channel)


@dataclass
class _ReminderDue:
    """A lane's job besides turns: deliver a due reminder (`done` gets whether it was handled)."""

    reminder: Reminder
    done: asyncio.Future


@dataclass
class Lane:
    """One conversation's queue and worker: turns run one at a time, in arrival order."""

    key: tuple[str, str, str]  # where it is in Gateway._lanes: (channel, chat_id, user)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    worker: asyncio.Task | None = None
    current: asyncio.Task | None = None  # the running turn, for /stop
    busy: bool = False
    conversation_id: int | None = None  # the active conversation, until /new
    generation: int = 0  # bumped by /new, so a look-up that raced it is not cached
    stop_requested: bool = False  # /stop arrived while a turn was starting
    reminding: bool = False  # busy with a due reminder, not a turn: nothing for /stop to stop


class _Sink:
    """Typing and draft updates for one chat, rate-limited so a phone app is not flooded."""

    def __init__(self, connector: Connector, chat_id: str, stream: bool) -> None:
        self.connector, self.chat_id, self.stream = connector, chat_id, stream
        self._last_typing = 0.0
        self.draft_text = ""

    async def typing(self) -> None:
        now = time.monotonic()
        if now - self._last_typing >= 4.0:  # chat apps show "typing" for about 5 s
            self._last_typing = now
            try:
                await self.connector.typing(self.chat_id)
            except Exception as exc:  # cosmetic: never fail a turn over it
                log.debug("typing indicator failed: %s", exc)

    async def draft(self, text: str) -> None:
        if self.stream and self.connector.streams_drafts:
            self.draft_text = text
            await self.connector.draft(self.chat_id, text)


class Gateway:
    def __init__(self, config: Config, store: Store, agent: Agent, model: Any,
                 metrics: Metrics | None = None, policy: Policy | None = None) -> None:
        self.config, self.store, self.agent, self.model = config, store, agent, model
        self.metrics = metrics or Metrics()
        self.policy = policy or config.policy()
        self.connectors: dict[str, Connector] = {}
        self.outbox = Outbox(store, self.connectors, self.metrics)
        self.outbox.on_chat_refused = self._chat_refused
        self.approvals = Approvals()
        self._lanes: dict[tuple[str, str, str], Lane] = {}
        self._accepting = True
        # Users the config lets in, once their row exists (forgotten at a reload). Everyone else
        # is looked up each time, because `openclaw users block` or `revoke` may change the store
        # under it.
        self._listed: set[str] = set()
        # Messages admitted into an idle lane: their turn starts at once, so the admission's look
        # at the store still holds (a query costs ~0.6 ms); one that waited is looked at again.
        self._fresh: set[int] = set()
        # Each user's turns now running (their TurnResults, filled as they go): what they spent
        # is in the store only once they end, and the daily cap must count it before.
        self._spending: dict[str, list[TurnResult]] = {}
        # Held while a turn's usage is written and handed from `_spending` to the store, and while
        # both are read: a look in between would count that turn twice.
        self._usage = asyncio.Lock()
        # Chats that moved to a new id while running, (channel, old id) -> new id: a turn queued
        # under the old id goes on in the lane and the conversation that moved.
        self._moved_chats: dict[tuple[str, str], str] = {}
        # What makes a config edit take effect, as the owner is told in chat: the service re-reads
        # the file on `openclaw reload`; a chat that runs the daemon in its terminal (the daemon
        # says so) only when restarted.
        self.apply_edit = "run `openclaw reload`"
        # Reminders due on a channel not running here, warned about once each; the newest
        # WARNED_KEPT, so a daemon that runs for months does not keep every one ever due.
        self._warned_no_channel: OrderedDict[int, None] = OrderedDict()

    def reconfigure(self, config: Config) -> None:
        """Serve from now on with a reloaded config (its access lists and roles; the agent was
        given its skills and settings). Running turns follow it from their next step: access
        checks, each tool call's principal; queued messages and due reminders too."""
        self.config, self.policy = config, config.policy()
        self._listed.clear()  # the config's lists may have changed
        # A call waiting for its user's /approve may wait minutes: one the new roles or skills
        # no longer grant is denied now, not run when the answer comes.
        registry, policy = self.agent.executor.registry, self.policy
        withdrawn = self.approvals.withdraw_if(lambda user, skill: skill not in registry.names or
                                               not policy.role(config.user_role(user)).grants(skill))
        if withdrawn:
            log.info("%d approval request(s) denied: the reloaded config no longer grants them",
                     withdrawn)

    def add_connector(self, connector: Connector) -> None:
        self.connectors[connector.name] = connector
        connector.on_chat_moved = self._chat_moved  # a service whose chats change ids (Telegram)

    # ---- inbound -------------------------------------------------------------------------

    async def handle(self, msg: InboundMessage) -> None:
        """Called by connectors. Returns once the message is stored (or deliberately dropped)."""
        if not self._accepting:
            # Refused, so a connector whose service delivers it again does not confirm it. But an
            # admitted user's message is kept first, 'received' as the queued ones are, for the
            # next start to answer (a redelivery is then recognised): Discord never delivers a
            # message again, and one refused during a drain (up to 30 s) was lost. No pairing
            # code here: a refused update comes back again and again while the drain lasts.
            if await self._still_allowed(msg.user):
                await self._record(msg)
            raise RuntimeError("the daemon is shutting down")  # the connector must not ack it
        self.metrics.inc("openclaw_inbound_messages_total", channel=msg.channel)
        if not await self._admit(msg):
            return
        event, is_new = await self._record(msg)
        if not is_new:
            log.info("ignoring redelivered message %s:%s", msg.channel, msg.message_id)
            return
        command = _command_of(msg.text)
        if command:
            await self._command(command, msg, event)
            return
        if msg.notice and not msg.text.strip():
            await self._send(msg.channel, msg.chat_id, msg.notice, conversation_id=None, event=event)
            return
        lane = self._lane(msg)
        if not lane.busy and lane.queue.empty():
            self._fresh.add(event.id)
        lane.queue.put_nowait((msg, event, False))

    async def _record(self, msg: InboundMessage) -> tuple[InboundEvent, bool]:
        return await self.store.record_inbound(
            msg.channel, msg.message_id, msg.user, msg.chat_id, msg.text,
            payload={"display_name": msg.display_name, "attachments": msg.attachments,
                     "notice": msg.notice, "is_group": msg.is_group})

    async def void_stale_requests(self) -> int:
        """Before the outbox sends what an earlier run left pending (Daemon.start): that run's
        approval requests are not sent. Their waits ended with it (Approvals lives in memory), and
        the turns it left are taken up again, asking anew under new numbers; an old one sent now
        would only be answered with "no request N". One Telegram took just before a crash, which
        the run never recorded, is not sent a second time either. How many pieces were voided."""
        void: set[int] = set()
        pending = await self.store.pending_outbound()
        for at, item in enumerate(pending):
            if not APPROVAL_ASKED.search(item.text):
                continue
            # The request's earlier pieces, if its summary was long: stored right before it.
            first = at
            while first > 0 and (prev := pending[first - 1]).id == pending[first].id - 1 \
                    and (prev.channel, prev.chat_id) == (item.channel, item.chat_id) \
                    and prev.created_at == item.created_at:
                first -= 1
            void.update(piece.id for piece in pending[first:at + 1])
        voided = await self.store.fail_unsent(void, STALE_REQUEST) if void else 0
        if voided:
            log.info("not sending %d piece(s) of approval requests an earlier run left pending",
                     voided)
        return voided

    async def recover(self) -> int:
        """Re-queue messages stored but never answered (the daemon stopped in between)."""
        pending = await self.store.pending_inbound()
        for event in pending:
            channel, _, user_id = event.user.partition(":")
            payload = event.payload or {}
            msg = InboundMessage(channel, user_id, event.chat_id, event.message_id, event.text,
                                 display_name=payload.get("display_name"),
                                 attachments=payload.get("attachments") or [],
                                 notice=payload.get("notice"),
                                 # What a group may see (/status, /pairing, drafts) stays so.
                                 is_group=bool(payload.get("is_group")))
            if not await self._still_allowed(msg.user):
                await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
                continue
            if msg.notice and not msg.text.strip():
                await self._send(msg.channel, msg.chat_id, msg.notice, conversation_id=None, event=event)
                continue
            if command := _command_of(msg.text):  # a command is answered as one, not by the model
                if command == "/remind":  # it may have been set just before the stop: not twice
                    await self._send(msg.channel, msg.chat_id, REMIND_NOT_REPEATED,
                                     conversation_id=None, event=event)
                else:
                    await self._command(command, msg, event)
                continue
            self._lane(msg).queue.put_nowait((msg, event, True))
        if pending:
            log.info("recovered %d unanswered messages", len(pending))
        return len(pending)

    async def _admit(self, msg: InboundMessage) -> bool:
        """Whether the caller may talk to the agent; if not, answer (pairing) or drop."""
        user, config = msg.user, self.config
        if user in self._listed:
            return True
        decided = access.config_status(config, user)
        if decided is UserStatus.BLOCKED:
            self._withdraw_approvals(user)
            return False
        if decided is UserStatus.ALLOWED:
            # The row their conversations hang on; the store's status is left alone, so taking
            # them out of the config later takes their access away too.
            await self.store.ensure_user(msg.channel, msg.user_id, msg.display_name)
            self._remember_listed(user, config)
            return True
        known = await self.store.ensure_user(msg.channel, msg.user_id, msg.display_name,
                                             status=UserStatus.PENDING)
        if known.status is UserStatus.ALLOWED:
            return True
        self._withdraw_approvals(user)
        if known.status is UserStatus.BLOCKED:
            return False
        if self.config.access.dm_policy == "open" and not msg.is_group:
            await self.store.set_user_status(msg.channel, msg.user_id, UserStatus.ALLOWED)
            return True
        if self.config.access.dm_policy == "pairing" and not msg.is_group:
            try:
                code = await self.store.create_pairing_code(user)
            except UnknownUserError:  # store retention removed the stranger's old row just now
                await self.store.ensure_user(msg.channel, msg.user_id, msg.display_name,
                                             status=UserStatus.PENDING)
                code = await self.store.create_pairing_code(user)
            if code is None and (await self.store.get_user(msg.channel, msg.user_id)).status \
                    is not UserStatus.PENDING:
                return False  # blocked (or let in) by `openclaw users` a moment ago
            text = (f"Hi! I don't know you yet. Your pairing code is {code}. Ask the owner of this "
                    f"assistant to approve it: /pairing approve {code} in their chat with me, or "
                    f"openclaw pairing approve {code}" if code else
                    "Hi! I don't know you yet, and too many pairing requests are waiting. "
                    "Please try again later.")
            await self._send(msg.channel, msg.chat_id, text, conversation_id=None, event=None)
        return False

    def _withdraw_approvals(self, user: str) -> None:
        """A user shut out (blocked, sent back to pairing) while a call of theirs waits for their
        /approve: their answer is no longer heard, so the call is denied now rather than at its
        timeout, and the turn stops at its next access check, sending nothing."""
        if withdrawn := self.approvals.withdraw(user):
            log.info("%d approval request(s) of %s denied: their access was withdrawn", withdrawn, user)

    async def _still_allowed(self, user: str) -> bool:
        """What `_admit` would say now, for a user who was admitted before (their turn waited
        for a restart, their reminder is due)."""
        config = self.config
        decided = access.config_status(config, user)
        if decided is None:
            known = await self.store.get_user(*parse_user_key(user))
            decided = known.status if known is not None else None
        elif decided is UserStatus.ALLOWED and user not in self._listed:
            await self.store.ensure_user(*parse_user_key(user))  # as _admit: the row it needs
            self._remember_listed(user, config)
        return decided is UserStatus.ALLOWED

    def _principal_now(self, user: str) -> Principal:
        return self.policy.principal(user, self.config.user_role(user))

    def _remember_listed(self, user: str, config: Config) -> None:
        """Skip the store for `user` from now on, as `config` lets them in; unless a reload came
        while the store was asked, whose lists may not (and which emptied the set meanwhile)."""
        if config is self.config:
            self._listed.add(user)

    # ---- commands ------------------------------------------------------------------------

    async def _command(self, command: str, msg: InboundMessage, event: InboundEvent) -> None:
        settle = None  # an approval's answer, given once its reply is out
        if command == "/new":
            lane = self._lanes.get(_lane_key(msg))
            if lane and lane.current:
                lane.current.cancel()
            conv = await self.store.active_conversation(msg.user, msg.chat_id, msg.channel)
            await self.store.archive_conversation(conv.id)
            # The lane now, not the one before the awaits: an idle lane may have ended meanwhile,
            # and a message made a new one, whose look-up may have found the archived conversation.
            if lane := self._lanes.get(_lane_key(msg)):
                lane.conversation_id = None
                lane.generation += 1
            text = "Started a new conversation."
        elif command == "/stop":
            text = "Stopped." if await self._stop(self._lanes.get(_lane_key(msg))) else \
                "Nothing to stop."
        elif command == "/status":
            text = await self._status_text(msg.user, msg.is_group)
        elif command in ("/approve", "/deny"):
            argument = msg.text.strip().split(maxsplit=1)[1:]
            text, settle = self.approvals.answer(msg.user, argument[0] if argument else "",
                                                 command == "/approve")
        elif command in ("/remind", "/reminders"):
            text = await self._reminder_command(command, msg)
        elif command == "/pairing":
            text = await self._pairing_command(msg)
        elif command == "/start":
            text = "Hello! I'm your OpenClaw assistant. Send me a message.\n\n" + HELP
        else:
            text = HELP
        try:
            await self._send(msg.channel, msg.chat_id, text, conversation_id=None, event=event)
        finally:
            if settle is not None:  # the call goes on only now, after its "Approved"/"Denied"
                settle()

    async def _stop(self, lane: Lane | None) -> int:
        """/stop: the lane's running turn is cancelled and its queued ones dropped; how many. A due
        reminder is not the user's request: it stays queued. All that is done before the first
        await, so the lane never looks idle (and ends) with a reminder out of its queue, and a
        message sent after the /stop is answered, not stopped."""
        if lane is None:
            return 0
        dropped = []
        for _ in range(lane.queue.qsize()):
            job = lane.queue.get_nowait()
            lane.queue.task_done()
            if isinstance(job, _ReminderDue):
                lane.queue.put_nowait(job)
            else:
                dropped.append(job[1])
                self._fresh.discard(job[1].id)  # its turn never starts to take it out
        stopped = len(dropped)
        if lane.current and not lane.current.done():
            lane.current.cancel()
            stopped += 1
        elif lane.busy and not lane.reminding:  # between taking the message and the model
            lane.stop_requested = True
            stopped += 1
        for event in dropped:
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped")
        return stopped

    async def _pairing_command(self, msg: InboundMessage) -> str:
        """/pairing [approve|deny CODE]: what `openclaw pairing` does, from the owner's phone.
        Only admins (and the console) may: a paired user must not let others in."""
        if not access.is_owner(self.config, msg.user):
            return "Only the owner (an admin) can answer pairing requests."
        if msg.is_group:  # the codes and who asked are for the owner's eyes, not the group's
            return "Pairing requests are answered in a private chat with me, not in a group."
        words = msg.text.strip().split()[1:]
        if not words:
            codes = await self.store.list_pairing_codes()
            if not codes:
                return "Nobody is waiting for access."
            return "\n".join(["Waiting for access (/pairing approve CODE or /pairing deny CODE):"] + [
                f"{c.code}  {c.user}  {visible(c.display_name or '')}" for c in codes])
        if len(words) != 2 or words[0].lower() not in ("approve", "deny"):
            return "Use /pairing, /pairing approve CODE or /pairing deny CODE."
        approve = words[0].lower() == "approve"
        user = await (self.store.approve_pairing if approve else self.store.deny_pairing)(words[1])
        if user is None:
            return f"No pending pairing code {words[1]!r} (expired, used, or mistyped)."
        name = f"{user.key} ({visible(user.display_name or 'no name')})"
        return f"Approved {name}." if approve else f"Denied {name}: blocked from now on."

    async def _reminder_command(self, command: str, msg: InboundMessage) -> str:
        """/remind and /reminders: the reminders skill without the model (a small one may not
        manage the call), through the same policy and audit as the model's calls."""
        try:
            principal = self.policy.principal(msg.user, self.config.user_role(msg.user))
        except OSError as exc:  # as in a turn: the workspace cannot be created
            log.error("cannot prepare the workspace of %s: %s", msg.user, exc)
            return "Sorry, I cannot do that right now (see the daemon's log)."
        executor = self.agent.executor
        if "reminders" not in executor.available(principal):
            return self._no_reminders_text(msg.user, principal.role.name)
        if principal.needs_approval("reminders"):  # a command cannot wait for an /approve
            return "Your reminders need approval each time: ask me in a message instead."
        argument = (msg.text.strip().split(maxsplit=1)[1:] or [""])[0].strip()
        if command == "/reminders":
            cancel = re.fullmatch(r"cancel\s+#?(\d+)", argument, re.IGNORECASE)
            if cancel is None and argument:  # "/reminders cancel", "... cancel abc": no list
                return REMINDERS_USAGE
            args = {"action": "cancel", "number": int(cancel[1])} if cancel else {"action": "list"}
        else:
            request = split_request(argument)
            if request is None:
                return REMIND_USAGE
            args = {"action": "add", "when": request[0], "text": request[1]}
        outcome = await executor.call("reminders", args, principal, chat_id=msg.chat_id)
        # The skill speaks to the model ("list shows them", "ask the user which"); a person typed
        # a command.
        text = outcome.text.removeprefix("error: ")
        for to_model, to_person in TO_THE_PERSON:
            text = text.replace(to_model, to_person)
        return text

    def _no_reminders_text(self, user: str, role: str) -> str:
        """Why /remind is refused: the skill is not enabled (what the owner can do about it), or
        not the user's role's."""
        if "reminders" not in self.agent.executor.registry.names:
            if access.is_owner(self.config, user):
                return ("The reminders skill is not enabled: add \"reminders\" to [skills] enabled "
                        f"in the config, then {self.apply_edit}.")
            return "Reminders are not available to you (the owner can enable the reminders skill)."
        return (f"Your role ({role}) does not include reminders; the owner can add it to "
                f"[roles.{role}] skills.")

    async def _status_text(self, user: str, in_group: bool) -> str:
        stats = self.model.stats()
        daily = self.policy.role(self.config.user_role(user)).daily_tokens
        limit = f" of {daily} a day" if daily else ""
        busy = sum(1 for lane in self._lanes.values() if lane.busy)
        queued = sum(lane.queue.qsize() for lane in self._lanes.values())
        return (f"Model: {stats.get('model', 'local')} on {stats.get('device', '?')}\n"
                f"Conversations answering: {busy}, queued messages: {queued}\n"
                f"Engine: {stats.get('num_running', 0)} running, {stats.get('num_waiting', 0)} "
                f"waiting, KV cache {100 * float(stats.get('kv_usage', 0)):.0f}% used\n"
                f"Tokens used today: you {await self._tokens_today(user)}{limit}"
                # What others use is the owner's business, not every user's, nor a group's.
                + (f", everyone {await self._tokens_today()}"
                   if access.is_owner(self.config, user) and not in_group else ""))

    # ---- lanes ---------------------------------------------------------------------------

    def _lane(self, msg: InboundMessage) -> Lane:
        return self._lane_of(_lane_key(msg))

    def _lane_of(self, key: tuple[str, str, str]) -> Lane:
        channel, chat_id, user = key
        key = (channel, self._moved_chats.get((channel, chat_id), chat_id), user)
        lane = self._lanes.get(key)
        if lane is None:  # new, or ended while idle: it looks its conversation up again
            lane = self._lanes[key] = Lane(key)
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(lane), name=f"lane {key}")
        return lane

    def _move_lanes(self, channel: str, chat_id: str, new_chat_id: str) -> None:
        """A chat's lanes follow it to its new id, their queued jobs in order. Where the user
        already has a lane under the new id (the move came late), that lane takes over the queued
        jobs, so the conversation goes on one turn at a time (a turn already running in the old
        lane finishes there). Every lane of either id looks its conversation up again: the store
        moved it, or archived the one the lane had."""
        self._moved_chats[(channel, chat_id)] = new_chat_id
        for key in [k for k in self._lanes if k[:2] == (channel, chat_id)]:
            new_key = (channel, new_chat_id, key[2])
            if new_key not in self._lanes:
                lane = self._lanes[new_key] = self._lanes.pop(key)
                lane.key = new_key
                continue
            old, target = self._lanes[key], self._lanes[new_key]
            while not old.queue.empty():
                target.queue.put_nowait(old.queue.get_nowait())
                old.queue.task_done()
        for key, lane in self._lanes.items():
            if key[:2] in ((channel, chat_id), (channel, new_chat_id)):
                lane.conversation_id = None
                lane.generation += 1

    async def _work(self, lane: Lane) -> None:
        while True:
            job = await self._next_job(lane)
            if job is None:  # nothing came for LANE_IDLE_S
                if self._retire(lane):
                    return
                continue  # something came just as the wait ended
            if not self._accepting:  # draining: leave it 'received'; it is answered after restart
                if isinstance(job, _ReminderDue):
                    job.done.cancel()  # and a reminder stays due
                lane.queue.task_done()
                continue
            if isinstance(job, _ReminderDue):
                await self._reminder_job(lane, job)
                continue
            msg, event, resumed = job
            lane.busy, lane.stop_requested = True, False
            try:
                await self._turn(lane, msg, event, resumed)
            except Exception:
                log.exception("turn for %s failed", msg.user)
                self.metrics.inc("openclaw_turns_total", result="failed")
                try:
                    await self.store.mark_inbound(event.id, InboundStatus.FAILED, "internal error")
                except Exception:  # the lane must outlive a store hiccup
                    log.exception("could not mark message %s failed", event.id)
            finally:
                lane.busy = False
                lane.queue.task_done()

    @staticmethod
    async def _next_job(lane: Lane) -> tuple | _ReminderDue | None:
        """The lane's next job; None when none came for LANE_IDLE_S. A job put as the wait ends
        stays in the queue (Queue.get takes it only when it returns), for `_retire` to see."""
        try:
            async with asyncio.timeout(LANE_IDLE_S):
                return await lane.queue.get()
        except TimeoutError:
            return None

    def _retire(self, lane: Lane) -> bool:
        """End an idle lane: whether it may (nothing queued, nothing running). No await here, nor
        between this and its worker's end: a message put before this look is in the queue (the
        lane goes on); one after it finds no lane under its key and makes a new one. The key is
        removed only while it still names this lane."""
        if lane.busy or not lane.queue.empty():
            return False
        if self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]
        self._forget_moves(lane.key[0])
        return True

    def _forget_moves(self, channel: str) -> None:
        """Forget the channel's chat moves that no lane needs any more: a move is looked up only
        for jobs queued under the old id before it, which sit in lanes of the old or new id."""
        chats = {key[1] for key in self._lanes if key[0] == channel}
        for (moved_channel, old), new in list(self._moved_chats.items()):
            if moved_channel == channel and old not in chats and new not in chats:
                del self._moved_chats[(moved_channel, old)]

    async def _conversation(self, lane: Lane, user: str, chat_id: str, channel: str) -> int:
        conversation_id = lane.conversation_id
        while conversation_id is None:
            generation = lane.generation
            chat_id = self._moved_chats.get((channel, chat_id), chat_id)  # queued before a move
            conv = await self.store.active_conversation(user, chat_id, channel)
            # Else /new archived it, or its chat moved, meanwhile: look again.
            if generation == lane.generation:
                conversation_id = lane.conversation_id = conv.id
        return conversation_id

    async def _turn(self, lane: Lane, msg: InboundMessage, event: InboundEvent,
                    resumed: bool) -> None:
        connector = self.connectors.get(msg.channel)
        if connector is None:
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "connector not running")
            return
        fresh = event.id in self._fresh
        self._fresh.discard(event.id)
        if not fresh and not await self._still_allowed(msg.user):  # blocked or revoked meanwhile
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
            return
        conversation_id = await self._conversation(lane, msg.user, msg.chat_id, msg.channel)
        if lane.stop_requested:
            lane.stop_requested = False
            self.metrics.inc("openclaw_turns_total", result="stopped")
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped by the user")
            return
        role = self.config.user_role(msg.user)  # now, not at admission: a reload may change it
        try:
            principal = self.policy.principal(msg.user, role)
        except OSError as exc:  # the role's workspace cannot be created: tell the user, and the log
            log.error("cannot prepare the workspace of %s (role %s; see roles.%s.workspace): %s",
                      msg.user, role, role, exc)
            await self._send(msg.channel, msg.chat_id, "Sorry, I cannot work right now: my workspace "
                             "for you is not usable. The owner has been told (see the daemon's log).",
                             conversation_id=None, event=event)
            return
        if await self._out_of_tokens(principal, msg, event):
            return
        caller = Caller(principal, msg.chat_id, approver=self._approver(msg),
                        still_allowed=functools.partial(self._still_allowed, msg.user),
                        principal_now=functools.partial(self._principal_now, msg.user),
                        has_tokens=functools.partial(self._has_tokens, msg.user))
        # Drafts are one per chat: in a group two users' answers could stream into the same one.
        stream = (bool(getattr(getattr(self.config, msg.channel, None), "stream_edits", False))
                  and not msg.is_group) or msg.channel == "terminal"
        sink = _Sink(connector, msg.chat_id, stream)
        started = time.monotonic()
        # Filled as the turn goes, so what a turn cut short (/stop, /new) spent is counted too.
        result = TurnResult(text="", steps=0)
        spending = self._spending.setdefault(msg.user, [])
        spending.append(result)

        async def answer():  # one task for /stop to cancel: fetching the files, then the turn
            taken_up = await take_up(
                self.agent.context, self.agent.executor, principal, conversation_id,
                functools.partial(_stored_as, msg), event.received_at) if resumed else None
            if taken_up is not None and taken_up.answer is not None:
                result.text = taken_up.answer  # the turn had ended: its answer, not a second run
                return result
            if taken_up is not None:  # as stored: its files are not fetched (and saved) again
                text = taken_up.text
            else:
                note = await self._attachments_note(connector, msg.attachments, principal)
                text = (msg.text + note).strip()
            return await self.agent.run_turn(
                conversation_id, caller, text, sink,
                run_id=f"turn-{event.id}-{uuid.uuid4().hex[:8]}", stored=taken_up is not None,
                result=result)

        typing = asyncio.create_task(self._keep_typing(sink))
        try:
            try:
                lane.current = asyncio.create_task(answer())
                await lane.current
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():  # the daemon is stopping, not /stop
                    raise
                self.metrics.inc("openclaw_turns_total", result="stopped")
                await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped by the user")
                return
            finally:
                lane.current = None
                typing.cancel()
            self.metrics.observe("openclaw_turn_seconds", time.monotonic() - started)
            self.metrics.inc("openclaw_turns_total", result="refused" if result.refused else
                             "failed" if result.failed else "answered")
            await self._deliver_turn(msg, event, caller, result, conversation_id)
        finally:
            # After the send (the user does not wait for this write), and however the turn
            # ended: stopped, failed, cut by shutdown.
            self.metrics.inc("openclaw_completion_tokens_total", result.completion_tokens)
            self.metrics.inc("openclaw_prompt_tokens_total", result.prompt_tokens)
            async with self._usage:
                try:  # a store call ends whole even if the turn is cancelled meanwhile
                    await self.store.add_usage(msg.user, result.prompt_tokens,
                                               result.completion_tokens,
                                               conversation_id=conversation_id)
                finally:  # in the store now (or lost with it): no longer counted as running
                    spending[:] = [r for r in spending if r is not result]  # this one, not an equal
                    if not spending and self._spending.get(msg.user) is spending:
                        del self._spending[msg.user]

    async def _deliver_turn(self, msg: InboundMessage, event: InboundEvent, caller: Caller,
                            result: TurnResult, conversation_id: int) -> None:
        """Send a turn's reply. Storing it marks the message answered, in one transaction: after
        a crash the reply is re-sent, the turn never run twice."""
        # Access withdrawn during the turn: the agent stopped before its next tool or model
        # call, or the answer was written meanwhile; either way they get nothing, not even a
        # word that it stopped. (One indexed SELECT for a user the store admitted; none for
        # the config's.)
        if result.refused or not await caller.still_allowed():
            log.info("message %d left unanswered: access of %s was withdrawn during its turn",
                     event.id, msg.user)
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
        else:
            await self._send(msg.channel, msg.chat_id, result.text,
                             conversation_id=conversation_id, event=event)

    async def _tokens_today(self, user: str | None = None) -> int:
        """The user's tokens today (everyone's: None): stored, and spent so far by turns still
        running."""
        async with self._usage:
            running = [r for u, results in self._spending.items() if user in (None, u)
                       for r in results]
            stored = await self.store.tokens_today(user)
            # Summed after the read: what they spent meanwhile counts too.
            return stored + sum(r.prompt_tokens + r.completion_tokens for r in running)

    async def _has_tokens(self, user: str) -> bool:
        """Whether the user's role, as the config says now, leaves them tokens today."""
        limit = self.policy.role(self.config.user_role(user)).daily_tokens
        return not limit or await self._tokens_today(user) < limit

    async def _out_of_tokens(self, principal: Principal, msg: InboundMessage,
                             event: InboundEvent) -> bool:
        """Whether the user's role caps their tokens a day and today's are spent; if so they are
        told, and the model is not asked."""
        limit = principal.role.daily_tokens
        if not limit or (used := await self._tokens_today(msg.user)) < limit:
            return False
        log.info("message %d not answered: %s has used %d of their %d tokens today", event.id,
                 msg.user, used, limit)
        text = (f"You have used today's {limit} tokens, so I cannot answer until 00:00 UTC. "
                "(Commands such as /reminders still work.)")
        if access.is_owner(self.config, msg.user):  # the one who can change it
            text += (f" The cap is daily_tokens in [roles.{principal.role.name}]; raise it in the "
                     f"config, then {self.apply_edit}.")
        await self._send(msg.channel, msg.chat_id, text, conversation_id=None, event=event)
        return True

    # ---- reminders -----------------------------------------------------------------------

    async def remind(self, reminder: Reminder) -> bool:
        """Deliver a due reminder in its chat's lane, between turns (its message joins the
        conversation, which must not land in the middle of a turn's tool calls). True once it was
        handled; False when it cannot be sent now (its channel is not running)."""
        if not self._accepting:
            return False
        if await self._dropped(reminder):  # whatever the state of its channel
            return True
        connector = self.connectors.get(reminder.channel)
        # Not now without the channel, or while it cannot deliver (a console nobody is attached
        # to, a service out of reach): it stays due, and is late, and says so, when sent.
        if connector is None:
            self._warn_no_channel(reminder)
            return False
        if not connector.connected:
            log.debug("reminder id %d waits for the %s channel", reminder.id, reminder.channel)
            return False
        job = _ReminderDue(reminder, asyncio.get_running_loop().create_future())
        self._lane_of((reminder.channel, reminder.chat_id, reminder.user)).queue.put_nowait(job)
        return await job.done

    def _warn_no_channel(self, r: Reminder) -> None:
        """A channel this daemon does not run (not enabled in the config) may never come: said
        once per reminder, not at every look the scheduler takes."""
        if r.id in self._warned_no_channel:
            return
        self._warned_no_channel[r.id] = None
        if len(self._warned_no_channel) > WARNED_KEPT:
            self._warned_no_channel.popitem(last=False)
        log.warning("reminder id %d is due but cannot be sent: the %s channel is not enabled in the "
                    "config; enable [%s] and restart, or cancel it with `openclaw reminders cancel "
                    "%s %d`", r.id, r.channel, r.channel, r.user, r.number)

    async def _reminder_job(self, lane: Lane, job: _ReminderDue) -> None:
        lane.busy = lane.reminding = True
        try:
            handled = await self._fire(lane, job.reminder)
            if not job.done.done():  # else the scheduler stopped waiting (shutdown)
                job.done.set_result(handled)
        except asyncio.CancelledError:
            job.done.cancel()
            raise
        except Exception as exc:  # the scheduler logs it and tries again later
            if not job.done.done():
                job.done.set_exception(exc)
        finally:
            lane.busy = lane.reminding = False
            lane.queue.task_done()

    async def _fire(self, lane: Lane, r: Reminder) -> bool:
        connector = self.connectors.get(r.channel)
        if connector is None:
            return False
        if await self._dropped(r):  # again: access may have changed while it was queued
            return True
        conversation_id = await self._conversation(lane, r.user, r.chat_id, r.channel)
        now = self.store.now()
        text = reminders.message(r, now)
        # Recorded as delivered and queued for sending in one transaction: after a crash it is
        # sent (the outbox), never fired twice.
        stored = await self.store.fire_reminder(r.id, r.due_at, reminders.next_time(r, now),
                                                chunk_text(text, connector.max_message_len),
                                                conversation_id=conversation_id)
        if stored is None:  # cancelled meanwhile
            return True
        try:
            await self.agent.context.add(conversation_id, "assistant", text)
        except Exception:  # the message matters more than the model's memory of it
            log.exception("could not add reminder id %d to conversation %d", r.id, conversation_id)
        await self.outbox.deliver(r.channel, r.chat_id, stored)
        return True

    async def _chat_refused(self, channel: str, chat_id: str, refusal: DeliveryRefused) -> None:
        """A chat moved (see _chat_moved: the refused reply is among what moves) or refuses the
        bot for good (blocked, removed, deleted: its reminders would fail at every time they
        repeat, so they end now). The log says which reminders."""
        if refusal.moved_to:
            await self._chat_moved(channel, chat_id, refusal.moved_to)
            return
        cancelled = await self.store.cancel_chat_reminders(channel, chat_id)
        if cancelled:
            log.warning("cancelled reminder(s) with id %s for %s:%s, which refuses messages: %s",
                        ", ".join(str(r.id) for r in cancelled), channel, chat_id, refusal)

    async def _chat_moved(self, channel: str, chat_id: str, new_chat_id: str) -> None:
        """A chat lives on under a new id (a Telegram group upgraded to a supergroup), as its
        connector reports or a refused reply says, whichever comes first (then the other finds
        nothing left to move): its conversations, pending replies and reminders move there, its
        lanes follow, and the replies are sent there."""
        moved = await self.store.move_chat(channel, chat_id, new_chat_id)
        self._move_lanes(channel, chat_id, new_chat_id)
        if moved.outbound:
            self.outbox.redeliver(channel, new_chat_id)
        if moved.conversations or moved.outbound or moved.reminders:
            log.warning("%s chat %s is now %s: moved %d conversation(s), %d pending piece(s) of "
                        "replies, reminder(s) with id %s", channel, chat_id, new_chat_id,
                        len(moved.conversations), len(moved.outbound),
                        ", ".join(str(r.id) for r in moved.reminders) or "none")

    async def _dropped(self, r: Reminder) -> bool:
        """Cancel `r` if its user may no longer be reminded; whether it was."""
        why_not = await self._why_no_reminders(r.user)
        if why_not:
            log.info("cancelling reminder id %d: %s", r.id, why_not)
            await self.store.cancel_reminder(r.user, r.number)
        return why_not is not None

    async def _why_no_reminders(self, user: str) -> str | None:
        """Why `user` may no longer be reminded: access lost, or the reminders skill (with which
        they would cancel) no longer theirs. None when they may."""
        if not await self._still_allowed(user):
            return f"{user} is no longer allowed"
        try:
            role = self.policy.role(self.config.user_role(user))
        except UnknownRole as exc:
            return str(exc)
        if "reminders" not in self.agent.executor.registry.names or not role.grants("reminders"):
            return f"{user} may no longer use the reminders skill"
        return None

    async def _send(self, channel: str, chat_id: str, text: str, *, conversation_id: int | None,
                    event: InboundEvent | None, kept: list[OutboundMessage] | None = None) -> None:
        """Chunk to the channel's limit and hand to the outbox (stored, sent in order, retried).
        With `event`, storing the reply also marks that message processed. `kept`: see
        Outbox.send."""
        connector = self.connectors.get(channel)
        if connector is None:
            log.warning("no %s connector to deliver a reply", channel)
            if event is not None:
                await self.store.mark_inbound(event.id, InboundStatus.FAILED, "connector not running")
            return
        await self.outbox.send(channel, chat_id, chunk_text(text, connector.max_message_len),
                               conversation_id=conversation_id, answers=event.id if event else None,
                               kept=kept)

    async def _attachments_note(self, connector: Connector, refs: list[str], principal: Principal) -> str:
        """Fetch the user's files into their workspace (only now: the user is admitted) and tell
        the agent where they are, or why one could not be fetched. Each is fetched only while the
        workspace is under its quota and the disk above the reserve, as a command is run (one
        file, at most the connector's max_file_mb, may take it past). The workspace is opened as
        the sandbox opens it (sandbox.grants) and every file is created relative to that
        descriptor: one a command swapped for a link (`mv alice old; ln -s /etc alice` in a
        writable share) gets nothing, and the agent is told why."""
        if not refs:
            return ""
        fetch = getattr(connector, "fetch_attachment", None)
        if fetch is None:  # the files are already in the workspace: the refs are their names
            return f"\n\n[attached files, in your workspace: {', '.join(refs)}]"
        try:  # a few opens, in the loop: a descriptor opened in a thread leaks if /stop comes
            fd = open_folder(principal.workspace, writable_folders(principal.scope))
        except OSError as exc:  # UnsafeGrant, or no folder there
            return "\n\n" + _not_saved(principal, len(refs), exc)
        folder = Folder(fd, principal.scope.uid if os.geteuid() == 0 else None)
        names, notes = [], []
        try:
            for ref in refs:
                try:
                    # The folder opened, through its descriptor, not the path (now maybe a link);
                    # to its end on /stop: it uses the descriptor closed below.
                    await run_to_end(asyncio.to_thread(
                        check_room, Path(f"/proc/self/fd/{fd}"), (self.config.data_dir,),
                        quota=principal.limits.disk_bytes,
                        reserve=self.config.sandbox.min_free_disk_mb << 20))
                except DiskFull as full:
                    notes.append(f"[The user sent a file, which was not saved: {full}.]")
                    continue
                name, note = await fetch(ref, folder)
                names += [name] if name else []
                notes += [note] if note else []
        finally:
            os.close(fd)
        parts = ([f"[attached files, in your workspace: {', '.join(names)}]"] if names else []) + notes
        return "\n\n" + "\n".join(parts)

    def _approver(self, msg: InboundMessage):
        """Asks in this chat; the answer must come from this user (see Approvals)."""
        async def approve(principal: Principal, skill: str, summary: str) -> bool:
            asked: list[OutboundMessage] = []

            async def send(text: str) -> None:
                await self._send(msg.channel, msg.chat_id, text, conversation_id=None, event=None,
                                 kept=asked)
            try:
                return await self.approvals.ask(principal.user, skill, summary, send)
            finally:
                # Its wait is over (answered, timed out, /stop): a piece of the request still
                # waiting to go out (a retry, a send cut short) would name a void number.
                await self.outbox.give_up(asked, STALE_REQUEST)
        return approve

    @staticmethod
    async def _keep_typing(sink: _Sink) -> None:
        """The typing indicator stays on while the model works (it fades after about 5 s)."""
        while True:
            await sink.typing()
            await asyncio.sleep(TYPING_REFRESH_S)

    # ---- shutdown ------------------------------------------------------------------------

    def queue_length(self) -> int:
        return sum(lane.queue.qsize() + lane.busy for lane in self._lanes.values())

    async def wait_idle(self, channel: str | None = None) -> None:
        """Until every queued message (of `channel`, or of all) has been answered."""
        await asyncio.gather(*(lane.queue.join() for key, lane in self._lanes.items()
                               if channel is None or key[0] == channel))

    async def wait_answered(self, channel: str, chat_id: str) -> None:
        """Until the channel's queued messages are answered and this chat's replies are out of the
        outbox (sent, or given up): what the console's "done" promises."""
        await self.wait_idle(channel)
        await self.outbox.settled(channel, chat_id)

    async def drain(self, timeout: float) -> None:
        """Stop taking messages; let running turns finish within `timeout`, then abort them.
        Aborted and queued messages stay 'received' in the store and are answered after restart."""
        self._accepting = False
        self._say_what_drains(timeout)
        try:
            if any(lane.busy for lane in self._lanes.values()):
                await asyncio.wait_for(self._finish_running(), timeout)
        except TimeoutError:
            log.warning("drain timed out after %.0f s: aborting the turns still running", timeout)
        for lane in self._lanes.values():
            if lane.worker:
                lane.worker.cancel()
        await asyncio.gather(*(lane.worker for lane in self._lanes.values() if lane.worker),
                             return_exceptions=True)

    def _say_what_drains(self, timeout: float) -> None:
        """A stop may wait `timeout` for running turns: the log says so, and for what."""
        running = sum(lane.busy for lane in self._lanes.values())
        queued = sum(lane.queue.qsize() for lane in self._lanes.values())
        left = f"{queued} queued message(s) wait for the next start" if queued else ""
        if running:
            log.info("stopping: finishing %d running conversation(s), up to %g s%s", running,
                     timeout, f"; {left}" if left else "")
        elif left:
            log.info("stopping: %s", left)

    async def _finish_running(self) -> None:
        while any(lane.busy for lane in self._lanes.values()):
            await asyncio.sleep(0.05)


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


def _stored_as(msg: InboundMessage, stored: str) -> bool:
    """Whether `stored` is `msg` as a turn stores it: its text, then the note on its files."""
    if not msg.attachments:
        return stored == msg.text.strip()
    text = msg.text.lstrip()  # (text + note).strip(): the note starts with "\n\n"
    note = stored[len(text):] if stored.startswith(text) else ""
    return note.startswith("\n\n[") or (not text.strip() and stored.startswith("["))


def _lane_key(msg: InboundMessage) -> tuple[str, str, str]:
    return (msg.channel, msg.chat_id, msg.user)


def _command_of(text: str) -> str:
    """The chat command a message is ("/new"), or "" for ordinary text."""
    if not text.startswith("/"):
        return ""
    command = text.strip().split(maxsplit=1)[0].lower().split("@", 1)[0]  # Telegram: /cmd@botname
    return command if command in COMMANDS else ""
