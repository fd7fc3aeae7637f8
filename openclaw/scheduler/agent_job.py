"""Agent jobs: a prompt the user scheduled, run at its time as an agent turn in the user's chosen
conversation, with that user's role, sandbox and approvals (the gateway's and the agent's own
machinery), at background priority; the answer comes back for the scheduler to deliver. A job that
should speak only when something needs the user ends with a constrained verdict: notify (with the
text) or stay silent."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from engine import SamplingParams
from engine.tool_parser import StreamingToolParser, ToolCall
from openclaw.agent import Caller, TurnResult
from openclaw.gateway.approvals import asking_in
from openclaw.gateway.gateway import Gateway
from openclaw.gateway.lanes import Lane
from openclaw.traces.record import record_turn, status_of
from skills.executor import Outcome

log = logging.getLogger(__name__)

# The engine's priority of scheduled work: lower runs first, and a chat's turns ask 0, so a message
# that arrives while a job runs is scheduled before it.
BACKGROUND = 10

VERDICT_TOOL = "verdict"
VERDICT_SPEC = {"type": "function", "function": {
    "name": VERDICT_TOOL,
    "description": "Say whether the result needs the user's attention now.",
    "parameters": {"type": "object", "properties": {
        "notify": {"type": "boolean",
                   "description": "true: tell the user now; false: say nothing"},
        "message": {"type": "string", "description": "what to tell the user, when notify is true"}},
        "required": ["notify", "message"]}}}
VERDICT_SYSTEM = (
    "You decide whether the result of a scheduled task needs the user's attention. Call the "
    f"{VERDICT_TOOL} tool: notify true with a short message for the user when something needs "
    "them, notify false (and an empty message) when nothing does.")
JOB_NOTE = "[Scheduled task, run now by the scheduler, not typed by the user just now] "


@dataclass(frozen=True)
class AgentJobRequest:
    """One run of an agent job: whose (`user`, "channel:id"), in which chat (`channel`,
    `chat_id`: its conversation holds the turn), what to do (`prompt`), and whether to speak only
    when something needs the user (`only_if_attention`). `name` labels its runs in the log."""

    user: str
    channel: str
    chat_id: str
    prompt: str
    only_if_attention: bool = False
    name: str = "job"


class QuietSink:
    """A scheduled turn shows no typing and no drafts: nobody asked for it just now."""

    async def typing(self) -> None:
        pass

    async def draft(self, text: str) -> None:
        pass

    async def tool_ran(self, name: str, arguments: Any, outcome: Outcome) -> None:
        pass


class AgentJobs:
    """What the scheduler calls at fire time (the daemon constructs it on its gateway).

    `await jobs.run(AgentJobRequest(...))` runs the job as a turn of the agent in its chat's
    conversation, in that chat's lane (between the chat's turns, never inside one), as the user:
    their role as the config says now, their sandbox, their daily tokens, and any approval asked in
    that chat. Returns the text to deliver there, or None to send nothing (the user may no longer
    use the agent, the verdict said stay silent, or /stop stopped it). Raises
    `openclaw.agent.model.ModelUnavailable` when the model cannot be reached: the run is missed.
    Heartbeats: see openclaw/scheduler/heartbeat.py (`Heartbeats.run`)."""

    def __init__(self, gateway: Gateway, priority: int = BACKGROUND) -> None:
        self.gateway, self.priority = gateway, priority

    async def run(self, job: AgentJobRequest) -> str | None:
        gw = self.gateway
        if not gw.lanes.accepting:
            return None
        if not await gw.access.still_allowed(job.user):
            log.info("agent job %s of %s not run: the user is no longer allowed", job.name, job.user)
            return None
        try:
            return await gw.lanes.errand((job.channel, job.chat_id, job.user),
                                         functools.partial(self._in_lane, job))
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # our caller's own cancel
                raise
            log.info("agent job %s of %s not run: the daemon is stopping", job.name, job.user)
            return None  # the lane dropped it as the daemon drains

    async def _in_lane(self, job: AgentJobRequest, lane: Lane) -> str | None:
        gw, user = self.gateway, job.user
        conversation_id = await gw.lanes.conversation(lane, user, job.chat_id, job.channel)
        try:
            principal = gw.access.principal(user)  # the role as the config says now
        except OSError as exc:  # the role's workspace cannot be created
            log.error("agent job %s of %s not run: their workspace is not usable (see roles.*."
                      "workspace): %s", job.name, user, exc)
            return None
        if not await self._has_tokens(user):
            log.info("agent job %s of %s not run: their tokens for today are spent", job.name, user)
            return None
        caller = Caller(principal, job.chat_id,
                        approver=asking_in(gw.approvals, gw.outbox, job.channel, job.chat_id),
                        still_allowed=functools.partial(gw.access.still_allowed, user),
                        principal_now=functools.partial(gw.access.principal, user),
                        has_tokens=functools.partial(self._has_tokens, user),
                        priority=self.priority)
        run_id = f"{job.name}-{uuid.uuid4().hex[:8]}"
        result = gw.spending.begin(user)
        started, started_at, ran = time.monotonic(), gw.store.now(), False
        try:
            await gw.agent.run_turn(conversation_id, caller, JOB_NOTE + job.prompt, QuietSink(),
                                    run_id=run_id, result=result)
            ran = not result.refused
            if result.refused:
                return None
            if not job.only_if_attention or result.failed:
                return result.text
            return await self._verdict(job, result, run_id)
        finally:
            await gw.spending.end(user, result, conversation_id)
            if ran:  # its trace, as a chat turn's (no inbound message: the scheduler asked)
                await record_turn(gw.store, gw.agent, user=user, conversation_id=conversation_id,
                                  result=result, status=status_of(result), started_at=started_at,
                                  duration_s=time.monotonic() - started)
            await gw.agent.count_later(result)  # its prompt's token count, last

    async def _verdict(self, job: AgentJobRequest, result: TurnResult, run_id: str) -> str | None:
        """Ask the model, constrained to one call of the verdict tool, whether the turn's answer
        needs the user; the message to send, or None (silent)."""
        prompt = [{"role": "system", "content": VERDICT_SYSTEM},
                  {"role": "user", "content": f"The task: {job.prompt}\n\nIts result:\n{result.text}"}]
        params = SamplingParams(temperature=0.0, max_tokens=256, parallel_tool_calls=False,
                                tool_choice={"type": "function", "function": {"name": VERDICT_TOOL}})
        parser = StreamingToolParser()
        model = self.gateway.agent.model
        out = None
        try:
            async with aclosing(model.generate(prompt, params, f"{run_id}-verdict",
                                               tools=[VERDICT_SPEC], priority=self.priority,
                                               cache_salt=job.user)) as stream:
                async for out in stream:
                    parser.feed(out.delta_text)
        finally:  # spent also when cut short, as a turn's steps count
            if out is not None:
                result.prompt_tokens += out.prompt_tokens
                result.completion_tokens += out.completion_tokens
        return verdict_text(parser.finish().tool_calls, result.text, job)

    async def _has_tokens(self, user: str) -> bool:
        limit = self.gateway.access.role(user).daily_tokens
        return not limit or await self.gateway.spending.today(user) < limit


def verdict_text(calls: list[ToolCall], answer: str, job: AgentJobRequest) -> str | None:
    """The verdict's message to send, or None (silent). A verdict that cannot be read is taken as
    notify with the turn's answer: a check that failed to decide must not hide what it found."""
    call = next((c for c in calls if c.name == VERDICT_TOOL), None)
    args = call.arguments if call is not None and isinstance(call.arguments, dict) else None
    if args is None or not isinstance(args.get("notify"), bool):
        log.warning("agent job %s of %s: unreadable verdict %s; delivering the answer", job.name,
                    job.user, json.dumps(args) if args is not None else "(none)")
        return answer
    if not args["notify"]:
        return None
    message = args.get("message")
    return message.strip() if isinstance(message, str) and message.strip() else answer
