"""Chat commands (/new, /stop, /status, /help, /start, /approve, /deny, /pairing, /remind,
/reminders, /jobs, /audit, /good, /bad, and /sh and /run, queued on the chat's lane: direct.py):
answered by the gateway itself, never by the model."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from openclaw.agent import Agent, ChatModel
from openclaw.gateway.access import REFUSED_HEADING, Access, refusal_line
from openclaw.gateway.approvals import Approvals
from openclaw.gateway.audit import chat_lines
from openclaw.gateway.contract import InboundMessage, literal_block
from openclaw.gateway.direct import DIRECT_COMMANDS
from openclaw.gateway.feedback import FEEDBACK_COMMANDS, answer_feedback
from openclaw.gateway.lanes import Lanes, TurnJob, key_of
from openclaw.gateway.memory_commands import MEMORY_COMMANDS, answer_memory
from openclaw.gateway.outbox import Outbox
from openclaw.gateway.private_commands import PRIVATE_COMMANDS, answer_private
from openclaw.gateway.turn import Spending
from openclaw.kv_report import status_line as kv_status_line
from openclaw.store import Store
from openclaw.store.records import InboundEvent
from skills.base import visible

log = logging.getLogger(__name__)

HELP = (
    "Commands:\n"
    "/new - archive this conversation and start a fresh one\n"
    "/stop - stop the answer being generated (and any running tool)\n"
    "/status - model, device, queue, KV cache use, tokens used today\n"
    "/approve N, /deny N - answer a request to run a tool\n"
    "/remind WHEN TEXT - e.g. /remind in 20 minutes stretch, /remind every weekday at 8:00 pills\n"
    "/reminders - your reminders in this chat; /reminders cancel N\n"
    "/jobs - your scheduled jobs, with their next runs; /jobs cancel N\n"
    "/pairing - (the owner) who asked for access; /pairing approve CODE, /pairing deny CODE\n"
    "/audit - your last tool calls and how they ended\n"
    "/good, /bad - grade my last reply to you here (or react to one with 👍 or 👎)\n"
    "/remember TEXT - keep TEXT in my memory of you; /memory - what I keep (forget N, off, on)\n"
    "/heartbeat - a check of your checklist now and then: on, off, every 30m, edit TEXT, quiet\n"
    "/private on|off - keep no trace of your turns for improving me (none exported)\n"
    "/sh COMMAND - run a shell command yourself, as my tool calls run\n"
    "/run SKILL {json} or /run SKILL key=value ... - call a skill yourself\n"
    "/help - this list"
)
COMMANDS = ("/new", "/stop", "/status", "/help", "/start", "/approve", "/deny", "/remind",
            "/reminders", "/jobs", "/pairing", "/audit", "/heartbeat", *MEMORY_COMMANDS,
            *FEEDBACK_COMMANDS, *PRIVATE_COMMANDS, *DIRECT_COMMANDS)
AUDIT_SHOWN = 10  # calls /audit lists
# The skill each skill command calls, as the person's own call (policy and audit as the model's).
TYPED_SKILLS = {"/remind": "reminders", "/reminders": "reminders", "/jobs": "schedule"}
# The skills' words for the model, said to the person who typed /remind, /reminders or /jobs.
TO_THE_PERSON = (("list shows them", "/reminders shows them"),
                 ("ask the user which, then say", "which one? Write"))
REMIND_NOT_REPEATED = ("I restarted before answering your /remind, so I did not repeat it: see "
                       "/reminders, and send it again if it is not there.")


def command_of(text: str) -> str:
    """The chat command a message is ("/new"), or "" for ordinary text."""
    if not text.startswith("/"):
        return ""
    command = text.strip().split(maxsplit=1)[0].lower().split("@", 1)[0]  # Telegram: /cmd@botname
    return command if command in COMMANDS else ""


def argument_of(text: str) -> str:
    """What follows the command: "in 5 minutes tea" of "/remind in 5 minutes tea"."""
    return (text.strip().split(maxsplit=1)[1:] or [""])[0].strip()


class Commands:
    def __init__(self, store: Store, agent: Agent, model: ChatModel, access: Access,
                 approvals: Approvals, outbox: Outbox, lanes: Lanes, spending: Spending, *,
                 on_approved: Callable[[], None] = lambda: None) -> None:
        self.store, self.agent, self.model, self.access = store, agent, model, access
        self.approvals, self.outbox, self.lanes, self.spending = approvals, outbox, lanes, spending
        self.on_approved = on_approved  # a stranger let in: their welcome goes now (welcome.py)
        # /heartbeat's answer (openclaw/scheduler/heartbeat.py), set by the daemon.
        self.heartbeat: Callable[[InboundMessage, str], Awaitable[str]] | None = None

    async def answer(self, command: str, msg: InboundMessage, event: InboundEvent) -> None:
        """Answer `command` in its chat; storing the answer marks the message processed."""
        if command in DIRECT_COMMANDS:  # may wait for an /approve: run in turn on the lane
            self.lanes.put(TurnJob(msg, event))
            return
        settle: Callable[[], None] | None = None  # an approval's answer, given once it is said
        if command == "/new":
            text = await self._new(msg)
        elif command == "/stop":
            text = "Stopped." if await self.lanes.stop(self.lanes.get(key_of(msg))) else \
                "Nothing to stop."
        elif command == "/status":
            text = await self._status(msg.user, msg.is_group)
        elif command in ("/approve", "/deny"):
            text, settle = self.approvals.answer(msg.user, argument_of(msg.text),
                                                 command == "/approve")
        elif command in TYPED_SKILLS:
            text = await self._reminders(command, msg)
        elif command == "/pairing":
            text = await self._pairing(msg)
        elif command == "/audit":
            text = await self._audit(msg)
        elif command in FEEDBACK_COMMANDS:
            text = await answer_feedback(self.store, command, msg)
        elif command in MEMORY_COMMANDS:
            text = await answer_memory(self.agent.memory, command, msg, argument_of(msg.text))
        elif command in PRIVATE_COMMANDS:
            text = await answer_private(self.store, msg, argument_of(msg.text))
        elif command == "/heartbeat":
            text = (await self.heartbeat(msg, argument_of(msg.text)) if self.heartbeat
                    else "Heartbeats are not available here.")
        elif command == "/start":
            text = "Hello! I'm your OpenClaw assistant. Send me a message.\n\n" + HELP
        else:
            text = HELP
        try:
            await self.outbox.reply(msg.channel, msg.chat_id, text, conversation_id=None, event=event)
        finally:
            if settle is not None:  # the call goes on only now, after its "Approved"/"Denied"
                settle()

    async def _new(self, msg: InboundMessage) -> str:
        lane = self.lanes.get(key_of(msg))
        if lane:
            lane.stop_current()
        conv = await self.store.active_conversation(msg.user, msg.chat_id, msg.channel)
        await self.store.archive_conversation(conv.id)
        # The lane now, not the one before the awaits: an idle lane may have ended meanwhile,
        # and a message made a new one, whose look-up may have found the archived conversation.
        if lane := self.lanes.get(key_of(msg)):
            lane.forget_conversation()
        return "Started a new conversation."

    async def _status(self, user: str, in_group: bool) -> str:
        stats = self.model.stats()
        daily = self.access.role(user).daily_tokens
        limit = f" of {daily} a day" if daily else ""
        kv = kv_status_line(stats, self.agent.settings.conversation_tokens(self.model.max_model_len))
        kv = f"{kv}\n" if kv else ""
        return (f"Model: {stats.get('model', 'local')} on {stats.get('device', '?')}\n"
                f"Conversations answering: {self.lanes.answering()}, queued messages: "
                f"{self.lanes.queued()}\n"
                f"Engine: {stats.get('num_running', 0)} running, {stats.get('num_waiting', 0)} "
                f"waiting, KV cache {100 * float(stats.get('kv_usage', 0)):.0f}% used\n"
                f"{kv}"
                f"Tokens used today: you {await self.spending.today(user)}{limit}"
                # What others use is the owner's business, not every user's, nor a group's.
                + (f", everyone {await self.spending.today()}"
                   if self.access.is_owner(user) and not in_group else ""))

    async def _audit(self, msg: InboundMessage) -> str:
        """/audit: the sender's own last calls. Not in a group: a call's arguments (a mail, a
        command) may come from a private chat, and are not the group's to read."""
        if msg.is_group:
            return "Your tool calls are shown in a private chat with me, not in a group."
        return chat_lines(await self.store.list_audit(AUDIT_SHOWN, msg.user))

    async def _pairing(self, msg: InboundMessage) -> str:
        """/pairing [approve|deny CODE]: what `openclaw pairing` does, from the owner's phone.
        Only admins (and the console) may: a paired user must not let others in."""
        if not self.access.is_owner(msg.user):
            return "Only the owner (an admin) can answer pairing requests."
        if msg.is_group:  # the codes and who asked are for the owner's eyes, not the group's
            return "Pairing requests are answered in a private chat with me, not in a group."
        words = msg.text.strip().split()[1:]
        if not words:
            codes = await self.store.list_pairing_codes()
            refused = await self.store.list_pairing_refusals()
            # Literal: the owner approves a person by what this shows, names are strangers' own.
            text = ("Waiting for access (/pairing approve CODE or /pairing deny CODE):\n" + literal_block(
                "\n".join(f"{c.code}  {c.user}  {visible(c.display_name or '')}" for c in codes))
                if codes else "Nobody is waiting for access.")
            if refused:  # as `openclaw pairing list`: the strangers the rates kept out
                text += f"\n\n{REFUSED_HEADING}\n" + literal_block("\n".join(map(refusal_line, refused)))
            return text
        if len(words) != 2 or words[0].lower() not in ("approve", "deny"):
            return "Use /pairing, /pairing approve CODE or /pairing deny CODE."
        approve = words[0].lower() == "approve"
        user = await (self.store.approve_pairing if approve else self.store.deny_pairing)(words[1])
        if user is None:
            return f"No pending pairing code {words[1]!r} (expired, used, or mistyped)."
        name = f"{user.key} ({visible(user.display_name or 'no name')})"
        if not approve:
            return f"Denied {name}: blocked from now on."
        self.on_approved()
        return f"Approved {name}: they are told, and their first message is answered."

    async def _reminders(self, command: str, msg: InboundMessage) -> str:
        """/remind and /reminders: the reminders skill without the model (a small one may not
        manage the call), through the same policy and audit as the model's calls."""
        try:
            principal = self.access.principal(msg.user)
        except OSError as exc:  # as in a turn: the workspace cannot be created
            log.error("cannot prepare the workspace of %s: %s", msg.user, exc)
            return "Sorry, I cannot do that right now (see the daemon's log)."
        executor, name = self.agent.executor, TYPED_SKILLS[command]
        skill = executor.registry.get(name)
        if skill is None or name not in executor.available(principal):
            return self._no_reminders(msg.user, principal.role.name, name)
        if principal.needs_approval(name):  # a command cannot wait for an /approve
            return f"Your {name} need approval each time: ask me in a message instead."
        args = skill.typed_command(command, argument_of(msg.text))
        if isinstance(args, str):  # not a call: how to write it
            return args
        outcome = await executor.call(name, args, principal, chat_id=msg.chat_id)
        # The skill speaks to the model ("list shows them", "ask the user which"); a person typed
        # a command.
        text = outcome.text.removeprefix("error: ")
        for to_model, to_person in TO_THE_PERSON:
            text = text.replace(to_model, to_person if name == "reminders" else "/jobs shows them")
        return text

    def _no_reminders(self, user: str, role: str, name: str = "reminders") -> str:
        """Why /remind (or /jobs) is refused: the skill is not enabled (what the owner can do
        about it), or not the user's role's."""
        if name not in self.agent.executor.registry.names:
            if self.access.is_owner(user):
                return (f"The {name} skill is not enabled: add \"{name}\" to [skills] enabled "
                        f"in the config, then {self.access.apply_edit}.")
            what = "Reminders are" if name == "reminders" else "Scheduled jobs are"
            return f"{what} not available to you (the owner can enable the {name} skill)."
        return (f"Your role ({role}) does not include {name}; the owner can add it to "
                f"[roles.{role}] skills.")
