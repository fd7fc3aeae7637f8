"""Direct commands: `/sh CMD` and `/run SKILL {json}` or `/run SKILL key=value ...` call a skill
without the model, through the same executor call (policy, argument check, approval, sandbox,
audit) as a model's call for the same user. They run as jobs on the conversation's lane, like a
turn: a call that waits for `/approve` must not hold up the gateway the answer comes through, and
`/stop` stops it. The answer is the skill's output, literal, and is not part of the conversation
the model reads: the model did not make the call, and would take its output for its own doing."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
from typing import Any

from openclaw.agent import Agent
from openclaw.gateway.access import Access
from openclaw.gateway.approvals import Approvals, asking_in
from openclaw.gateway.contract import InboundMessage, literal_block
from openclaw.gateway.lanes import Lane, TurnJob
from openclaw.gateway.outbox import Outbox
from openclaw.store import Store
from openclaw.store.records import InboundStatus
from skills.executor import Outcome

log = logging.getLogger(__name__)

DIRECT_COMMANDS = ("/sh", "/run")
SH_USAGE = "Use /sh COMMAND, e.g. /sh ls -la"
RUN_USAGE = ('Use /run SKILL {"key": "value"} or /run SKILL key=value ... (a value is read as JSON '
             'when it is JSON, else as text), e.g. /run clock timezone=Europe/Paris')
NOT_REPEATED = ("I restarted before answering your {command}, so I did not run it again: /audit "
                "shows whether it ran; send it again if you still want it.")


def parse(command: str, argument: str) -> tuple[str, Any] | str:
    """The (skill, arguments) a direct command calls, or what is wrong with how it is written."""
    if command == "/sh":
        return ("shell", {"command": argument}) if argument else SH_USAGE
    skill, _, rest = argument.partition(" ")
    if not skill:
        return RUN_USAGE
    rest = rest.strip()
    if rest.startswith("{"):
        try:
            return skill, json.loads(rest)
        except json.JSONDecodeError as exc:
            return f"The arguments are not valid JSON ({exc}).\n{RUN_USAGE}"
    try:
        words = shlex.split(rest)
    except ValueError as exc:  # an unclosed quote
        return f"The arguments cannot be read: {exc}.\n{RUN_USAGE}"
    args: dict[str, Any] = {}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or not key:
            return f"{word!r} is not key=value.\n{RUN_USAGE}"
        try:
            args[key] = json.loads(value)
        except json.JSONDecodeError:
            args[key] = value
    return skill, args


def said(outcome: Outcome) -> str:
    """The outcome as the user reads it: the output literal (no app's Markdown may change what a
    command printed), or why it did not run."""
    if outcome.decision != "allowed":
        return outcome.text.removeprefix("error: ")
    return literal_block(outcome.text or "(no output)")


class Direct:
    def __init__(self, store: Store, agent: Agent, access: Access, approvals: Approvals,
                 outbox: Outbox) -> None:
        self.store, self.agent, self.access = store, agent, access
        self.approvals, self.outbox = approvals, outbox

    async def run(self, lane: Lane, job: TurnJob) -> None:
        """Run the direct command `job` is, on its lane, and answer it."""
        msg, event = job.message, job.event
        if not job.fresh and not await self.access.still_allowed(msg.user):  # blocked meanwhile
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "user not allowed")
            return
        if lane.stop_requested:
            lane.stop_requested = False
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped by the user")
            return
        text = await self._answer(lane, msg)
        if text is None:
            await self.store.mark_inbound(event.id, InboundStatus.FAILED, "stopped by the user")
            return
        await self.outbox.reply(msg.channel, msg.chat_id, text, conversation_id=None, event=event)

    async def _answer(self, lane: Lane, msg: InboundMessage) -> str | None:
        """The reply, or None when /stop ended the call."""
        words = msg.text.strip().split(maxsplit=1)
        command = words[0].lower().split("@", 1)[0]
        call = parse(command, words[1].strip() if len(words) > 1 else "")
        if isinstance(call, str):
            return call
        try:
            principal = self.access.principal(msg.user)  # now: a reload may have changed the role
        except OSError as exc:
            log.error("cannot prepare the workspace of %s: %s", msg.user, exc)
            return "Sorry, I cannot do that right now (see the daemon's log)."
        skill, args = call
        executor = self.agent.executor  # now: a reload gives the agent a new one
        approver = asking_in(self.approvals, self.outbox, msg.channel, msg.chat_id)
        lane.current = asyncio.create_task(executor.call(skill, args, principal,
                                                         chat_id=msg.chat_id, approver=approver,
                                                         in_group=msg.is_group))
        try:
            outcome = await lane.current
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # the daemon is stopping, not /stop
                raise
            return None
        finally:
            lane.current = None
        if outcome.decision == "invalid":  # what the skill takes, beside what was wrong
            schema = executor.registry.get(skill).parameters
            return f"{said(outcome)}\nIts arguments:\n{literal_block(json.dumps(schema, indent=1))}"
        return said(outcome)
