"""One skill call, start to end, the same for the model and for `openclaw skills run`: policy check,
argument check, approval, the run itself with a time limit, and the audit row.

The caller's identity comes in as a Principal built from the config; nothing the model wrote
(arguments, earlier tool output) can widen what it may do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from sandbox.disk_budget import DiskFull
from sandbox.policy import Principal
from sandbox.runner import Sandbox
from sandbox.scope import SandboxUnavailable
from skills.base import (
    AuditNote,
    JobBook,
    MemoryBook,
    ReminderBook,
    SkillContext,
    SkillDenied,
    SkillError,
)
from skills.budget import CAPTURE_BYTES
from skills.registry import SkillRegistry, check_arguments

log = logging.getLogger(__name__)

WALL_CLOCK_GRACE_S = 10.0  # past a skill's own wall-clock limit, for it to stop and report

MAX_RESULT_CHARS = 16_000
MAX_AUDIT_VALUE_CHARS = 2_000  # a 64 MiB file write is audited by its size, not its content

# (principal, skill name, what it will do) -> approved? The gateway asks in the chat.
Approver = Callable[[Principal, str, str], Awaitable[bool]]
# The audit sink: Store.add_audit's signature.
AuditSink = Callable[..., Awaitable[Any]]


@dataclass
class Outcome:
    text: str  # what the model (or the admin) reads
    ok: bool
    decision: str  # one of AUDIT_DECISIONS but "interrupted", which only the audit row says
    exit_status: int | None = None  # of the program it ran, if it ran one
    # The audit row, when the caller asked to write it itself (Executor.call keep_audit): the
    # audit sink's keyword arguments, for one transaction with what the caller stores of the call.
    audit: dict[str, Any] | None = None


# What an audit row's decision can be: "allowed" (it ran, whatever its exit), "interrupted" (the
# daemon stopped during the call), the others (it did not run, and why).
AUDIT_DECISIONS = ("allowed", "denied", "invalid", "rejected", "timeout", "unknown", "interrupted")


class ApprovalUnavailable(Exception):
    """An approver's answer when nobody can be asked (the message says why): the call is refused
    as a denied one is, but nobody is said to have denied it."""


async def never_approve(principal: Principal, skill: str, summary: str) -> bool:
    raise ApprovalUnavailable("nobody can be asked from here")


class Executor:
    def __init__(self, registry: SkillRegistry, sandbox: Sandbox, audit: AuditSink | None = None,
                 timeout_s: float = 60.0, reminders: ReminderBook | None = None,
                 jobs: JobBook | None = None, memory: MemoryBook | None = None) -> None:
        self.registry, self.sandbox, self._audit, self.timeout_s = registry, sandbox, audit, timeout_s
        self.reminders, self.jobs, self.memory = reminders, jobs, memory

    async def record_interrupted(self, principal: Principal, name: str, args: Any,
                                 detail: str) -> None:
        """Audit a call that an earlier run of the daemon began and never ended (it crashed): the
        row the call's end would have written, with decision "interrupted"."""
        if self._audit is not None:
            await self._audit(principal.user, name, audit_arguments(args), "interrupted", detail=detail)

    def available(self, principal: Principal) -> list[str]:
        """The skills this principal may call: enabled here and granted by its role."""
        return [name for name in self.registry.names if principal.may_use(name)]

    async def call(self, name: str, args: Any, principal: Principal, *, chat_id: str = "",
                   approver: Approver = never_approve, in_group: bool | None = None,
                   keep_audit: bool = False) -> Outcome:
        """`in_group`: whether `chat_id` is a group chat (None: not known; the memory skill
        then refuses, rather than guess a private chat). `keep_audit`: the audit row of a call
        that ends is not written but handed back in `Outcome.audit`, for the caller to store
        with the call's result in one transaction, where the sink can count a call without
        writing its row (its `counted`); a call cut short by a cancel is still audited here."""
        skill = self.registry.get(name)
        if skill is None or not principal.may_use(name):
            available = ", ".join(self.available(principal)) or "none"
            if skill is None:
                return await self._done(principal, name, args, keep_audit, Outcome(
                    f"error: there is no tool named {name!r}; available tools: {available}",
                    False, "unknown"))
            return await self._done(principal, name, args, keep_audit, Outcome(
                f"error: denied: the role {principal.role.name!r} of {principal.user} may not use "
                f"{name!r} (it may use: {available}); the owner can add it to "
                f"[roles.{principal.role.name}] skills", False, "denied"))
        problems = check_arguments(skill.parameters, args)
        if problems:
            return await self._done(principal, name, args, keep_audit, Outcome(
                f"error: bad arguments for {name}: " + "; ".join(problems), False, "invalid"))
        if principal.needs_approval(name):
            verdict = await self._ask(approver, principal, name, skill.describe(args))
            if verdict is not None:
                return await self._done(principal, name, args, keep_audit, verdict)
        ctx = SkillContext(principal=capture_bounded(principal), sandbox=self.sandbox, chat_id=chat_id,
                           settings=self.registry.settings(name), reminders=self.reminders,
                           jobs=self.jobs, memory=self.memory, in_group=in_group)
        started = time.monotonic()
        limit = self.timeout_s
        if skill.keeps_wall_clock:  # its own limit is the role's; ours only catches a hang past it
            limit = max(limit, principal.limits.wall_seconds + WALL_CLOCK_GRACE_S)
        budget = asyncio.timeout(limit)
        try:
            async with budget:
                output = await skill.run(args, ctx)
            # A program that ran but failed (non-zero exit, killed at a limit) is not a success.
            outcome = Outcome(output, ctx.audit.exit_status in (None, 0) and not ctx.audit.failed,
                              "allowed")
        except (SkillDenied, DiskFull) as exc:  # DiskFull: a command refused by ctx.run
            outcome = Outcome(f"error: denied: {exc}", False, "denied")
        except SkillError as exc:
            outcome = Outcome(f"error: {exc}", False, "allowed")
        except SandboxUnavailable as exc:
            outcome = Outcome(f"error: {exc}", False, "allowed")
        except TimeoutError as exc:
            if budget.expired() and skill.keeps_wall_clock:
                text = f"error: {name} did not finish within {limit:g} s and was stopped"
            elif budget.expired():
                # Work in a worker thread (files, mail) cannot be interrupted, so the model must not
                # assume the action did not happen: it may still complete after this answer.
                text = (f"error: {name} did not finish within {limit:g} s and was abandoned; "
                        "what it started may still complete, so check before retrying")
            else:  # the skill's own timeout (a socket, an upstream API): it has finished
                text = f"error: {name} failed: TimeoutError: {exc}"
            outcome = Outcome(text, False, "allowed")
        except asyncio.CancelledError:
            ctx.audit.detail = "cancelled (/stop or shutdown)"
            await self._done(principal, name, args, False, Outcome("", False, "allowed"), ctx.audit,
                             started)
            raise
        except Exception as exc:  # a broken skill must not end the conversation
            log.exception("skill %s failed", name)
            outcome = Outcome(f"error: {name} failed: {type(exc).__name__}: {exc}", False, "allowed")
        if not outcome.ok and ctx.audit.detail is None and outcome.text.startswith("error"):
            ctx.audit.detail = outcome.text[:500]
        outcome.exit_status = ctx.audit.exit_status
        return await self._done(principal, name, args, keep_audit, outcome, ctx.audit, started)

    async def _ask(self, approver: Approver, principal: Principal, name: str,
                   summary: str) -> Outcome | None:
        """None when approved; else the outcome that says why it did not run."""
        timeout = principal.role.approval_timeout_s
        try:
            async with asyncio.timeout(timeout):  # not wait_for, which on 3.11 can lose a /stop
                approved = await approver(principal, name, summary)  # that comes with the answer
        except TimeoutError:
            return Outcome(f"error: {name} needs the user's approval, and none came within "
                           f"{timeout:g} s; it did not run", False, "timeout")
        except ApprovalUnavailable as exc:
            return Outcome(f"error: {name} needs the user's approval, which cannot be asked for: "
                           f"{exc}; it did not run", False, "rejected")
        if not approved:
            return Outcome(f"error: the user denied this {name} call; it did not run", False, "rejected")
        return None

    async def _done(self, principal: Principal, name: str, args: Any, keep_audit: bool,
                    outcome: Outcome, note: AuditNote | None = None,
                    started: float | None = None) -> Outcome:
        if len(outcome.text) > MAX_RESULT_CHARS:
            outcome.text = (outcome.text[:MAX_RESULT_CHARS]
                            + f"\n[cut: {len(outcome.text)} characters in all]")
        if self._audit is not None:
            note = note or AuditNote(detail=None if outcome.ok else outcome.text[:500])
            duration = None if started is None else int((time.monotonic() - started) * 1000)
            row = {"user": principal.user, "skill": name, "arguments": audit_arguments(args),
                   "decision": outcome.decision, "exit_status": note.exit_status,
                   "duration_ms": duration, "output_bytes": len(outcome.text.encode()),
                   "detail": note.detail}
            # Only with a sink that can count a call whose row it does not write (the daemon's).
            if keep_audit and (counted := getattr(self._audit, "counted", None)) is not None:
                counted(**row)
                outcome.audit = row
                return outcome
            try:
                first = [row.pop(key) for key in ("user", "skill", "arguments", "decision")]
                await self._audit(*first, **row)
            except Exception:  # the audit must not turn a finished action into a crash
                log.exception("could not write the audit row for %s", name)
        return outcome


def capture_bounded(principal: Principal) -> Principal:
    """`principal` with its commands' output captured to at most budget.CAPTURE_BYTES: the model
    reads MAX_RESULT_CHARS of a result, and a role's larger output_bytes would only make the
    daemon hold (and copy, building the result) that much of every command's output."""
    limits = principal.limits
    if limits.output_bytes <= CAPTURE_BYTES:
        return principal
    bounded = replace(limits, output_bytes=CAPTURE_BYTES)
    return replace(principal, role=replace(principal.role, limits=bounded))


def audit_arguments(args: Any) -> dict[str, Any]:
    """The arguments as the audit row keeps them: long texts cut, with their length noted."""
    if not isinstance(args, dict):
        args = {"raw": args}
    return {k: (v[:MAX_AUDIT_VALUE_CHARS] + f"[... {len(v)} characters in all]"
                if isinstance(v, str) and len(v) > MAX_AUDIT_VALUE_CHARS else v) for k, v in args.items()}
