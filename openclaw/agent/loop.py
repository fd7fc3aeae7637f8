"""One user turn: the model answers, maybe calls tools, reads their results, and answers again,
until it replies in plain text or hits the step limit. Every message is stored as it happens."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from engine import SamplingParams
from engine.tool_parser import StreamingToolParser, ToolCall, new_call_id
from openclaw.agent.context import (
    Budget,
    ContextBuilder,
    Held,
    HistoryStore,
    PromptTooLong,
    Remember,
    TokensSpent,
)
from openclaw.agent.memory import MemorySource, entry_line, fitted
from openclaw.agent.model import ChatModel, ModelOutput, ModelUnavailable
from openclaw.agent.repetition import LoopGuard
from openclaw.agent.sampling import reply_params, summary_params
from openclaw.agent.untrusted import EarlierSources, Untrusted, explained, requiring_approval
from openclaw.config import AgentConfig
from openclaw.metrics import Metrics
from openclaw.prompts import CONFIG, PromptChoice, PromptSource, choose, decide
from openclaw.prompts.choice import SYSTEM
from openclaw.store.memory_records import chat_scope
from openclaw.store.prompts import PromptSnapshot
from sandbox.policy import Principal
from skills import Executor
from skills.executor import Approver, Outcome, never_approve

log = logging.getLogger(__name__)

APOLOGY = "Sorry, something went wrong while I was answering. It has been logged; please try again."


class ReplySink(Protocol):
    """Where a turn's progress shows: a typing indicator and, where enabled, a growing draft."""

    async def typing(self) -> None: ...

    async def draft(self, text: str) -> None: ...

    async def tool_ran(self, name: str, arguments: Any, outcome: Outcome) -> None:
        """A tool call ended (the chat may show it: [agent] show_tools); not for the model."""



@dataclass
class TurnResult:
    text: str  # the reply to deliver
    steps: int  # model calls made
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed: bool = False
    refused: bool = False  # the caller lost access during the turn: nothing is to be delivered
    # For the turn's trace (openclaw/traces): its calls (a malformed one counts, as an error),
    # whether the last one failed, ms from the turn's start to the first token, and the ids of
    # the messages it stored (the first None when its user message was stored before: resumed).
    tool_calls: int = 0
    tool_errors: int = 0
    last_tool_failed: bool = False
    first_token_ms: int | None = None
    first_message_id: int | None = None
    last_message_id: int | None = None
    prompt_version: str = ""  # the label of the prompt versions it was answered with
    # The user's message (its id and text), stored without its token_count: counted once the
    # reply is out (Agent.count_later); the prompt's budget takes its bound far from the limit.
    uncounted: tuple[int, str] | None = None


async def _always_allowed() -> bool:
    return True


UNREADABLE_CALL = "unreadable_tool_call"  # the name a malformed call is stored under
# The result of a call its turn was stopped in. Without one the prompt says "not run" (see
# agent.context), false for a command cut short or a mail a worker thread still sends.
STOPPED_CALL = ("error: stopped: the turn was stopped before this call ended; it may have done "
                "part of its work (none, if it still waited for the user's approval). Check "
                "before doing it again.")

TOKENS_SPENT = ("I have used today's tokens partway through this answer, so I stopped here. I can "
                "go on after 00:00 UTC.")


@dataclass
class Caller:
    """Who this turn acts for, as the gateway established it from the messaging service and the
    config; and how to ask them to approve a call."""

    principal: Principal
    chat_id: str
    approver: Approver = never_approve
    # Asked before each tool call and each model call that follows tool results: access may be
    # withdrawn while a turn runs (`openclaw users block`, /pairing deny), and then it ends there.
    still_allowed: Callable[[], Awaitable[bool]] = _always_allowed
    # The principal as the config says now, asked at each tool call: a reload during the turn
    # (a skill, a folder, the network taken away) applies to its next call. None: `principal`.
    principal_now: Callable[[], Principal] | None = None
    # Whether the caller's daily tokens (with what their running turns spent) still allow a model
    # call, asked before each one that follows tool results: a cap looked at only as a turn
    # begins would not hold its later steps, nor the caller's turns in other chats.
    has_tokens: Callable[[], Awaitable[bool]] = _always_allowed
    # Whether the chat is a group: the user's memory there is the group's alone. None (not
    # known): the turn reads and writes no memory, and the memory skill refuses.
    in_group: bool | None = None
    # The engine's priority of the turn's model calls (lower runs first): a chat's turns 0, a
    # scheduled job's higher, so a message arriving meanwhile goes first.
    priority: int = 0

    @property
    def user(self) -> str:
        return self.principal.user


class Agent:
    def __init__(self, model: ChatModel, store: HistoryStore, executor: Executor,
                 settings: AgentConfig, metrics: Metrics | None = None,
                 memory: MemorySource | None = None, prompts: PromptSource | None = None) -> None:
        self.model, self.store, self.executor, self.settings = model, store, executor, settings
        self.metrics = metrics or Metrics()
        self.memory = memory
        self.prompts = prompts  # the prompt library (None: the config's system prompt)
        self._earlier = EarlierSources()
        self.context = ContextBuilder(model, store, settings.system_prompt, self._budget(settings))
        self.context.summary_params = summary_params(settings, self.context.budget.summary_tokens)

    def _budget(self, settings: AgentConfig) -> Budget:
        model = self.model
        context = settings.conversation_tokens(model.max_model_len)
        if context - settings.reply_max_tokens < 64:
            raise ValueError(
                f"agent.context_tokens ({context}, at most the model's {model.max_model_len}) minus "
                f"agent.reply_max_tokens ({settings.reply_max_tokens}) leaves no room for a prompt")
        return Budget(prompt_tokens=context - settings.reply_max_tokens,
                      keep_messages=settings.compaction_keep_messages)

    def reconfigure(self, executor: Executor, settings: AgentConfig) -> None:
        """A reloaded config, from the next step of every turn, running ones too: calls go
        through `executor` (its skills, its sandbox) and prompts are built with `settings`. The
        history cache stays. ValueError, and nothing changed, when the budget does not fit."""
        budget = self._budget(settings)
        self.executor, self.settings = executor, settings
        self.context.system_prompt, self.context.budget = settings.system_prompt, budget
        self.context.summary_params = summary_params(settings, budget.summary_tokens)

    async def run_turn(self, conversation_id: int, caller: Caller, text: str, sink: ReplySink,
                       run_id: str, stored: bool = False,
                       result: TurnResult | None = None) -> TurnResult:
        """Store the user's message and answer it. Cancelling the task (/stop) aborts the model
        and any running tool; what was stored before stays stored. `stored`: the user's text is
        stored already (a turn taken up after a restart: see agent.resume). `result`: filled as
        the turn goes, so its caller still has the tokens spent when the turn is cancelled."""
        tools = self.executor.registry.tool_specs(self.executor.available(caller.principal)) or None
        result = result if result is not None else TurnResult(text="", steps=0)
        # The user's prompt versions, once per turn (cached by the store: no round trip).
        choice = await self._prompt_choice(caller)
        result.prompt_version = choice.label
        # A library version holds for the whole turn; the config's follows a reload at each step.
        system = None if choice.versions[SYSTEM] == CONFIG else choice.system
        if not await self.context.fits_alone(text, tools, system, choice.tools):
            # Never stored: a message that cannot fit would break every later turn of the chat.
            result.text, result.failed = (
                f"Sorry, that message is too long for me ({self.context.budget.prompt_tokens} "
                "tokens at most, with my instructions). Please shorten it or split it."), True
            return result
        # Held, not stored yet: stored with the turn's first step or answer, one commit for both
        # (or alone as the turn ends otherwise: see _held_stored).
        user = None if stored else self.context.hold(conversation_id, "user", text)
        try:
            return await self._steps(conversation_id, caller, text, sink, run_id, result, tools,
                                     choice, system)
        finally:
            if user is not None:
                await self._held_stored(conversation_id, user, result)

    async def _held_stored(self, conversation_id: int, user: Held, result: TurnResult) -> None:
        """The turn's user message stored, if no step or answer of the turn stored it (the turn
        ended before one: stopped, failed, the model away): a message the user sent stays in the
        conversation, as it is read next time. Its id for the trace, and for its count."""
        if user.stored is None:
            try:
                await self.context.flush(conversation_id)
            except Exception as exc:  # the turn's own outcome (an error, a cancel) goes on
                log.warning("the message of the turn in conversation %s was not stored: %s",
                            conversation_id, exc)
        if user.stored is not None:
            result.first_message_id = user.stored.id
            result.uncounted = (user.stored.id, user.fields["content"])

    async def _steps(self, conversation_id: int, caller: Caller, text: str, sink: ReplySink,
                     run_id: str, result: TurnResult, tools: list[dict] | None,
                     choice: PromptChoice, system: str | None) -> TurnResult:
        """The turn's model steps and tool calls, after its user message was held."""
        # "auto": the engine constrains every call the model opens, so it parses; the error path
        # below remains for models and formats outside the constraint (Llama 3.1 JSON calls).
        max_steps = self.settings.max_steps  # as the turn began, also if a reload changes it
        # What earlier turns left in the prompt counts as this turn's own reading.
        untrusted = Untrusted(earlier=self._earlier.of(
            conversation_id, (await self.context.history(conversation_id))[1],
            self.executor.registry))
        # Recalled in the turn's own task: the store reads it on the loop's connection (a task
        # would cost more than what it could overlap: the message is held, not stored, now).
        # Nothing where nothing is to be recalled (most users' turns).
        memory, remember = (await self._memory(caller, text) if self._recalls(caller)
                            else (None, self._remember(caller)))
        meter = _TurnMeter(result, caller.has_tokens, started=time.monotonic())
        try:
            for step in range(max_steps):
                result.steps = step + 1
                # Each step, with the prompt budget: a reload between steps changes both together.
                params = reply_params(self.settings, tools)  # [agent.sampling] chat, tool_arguments
                # Each user's prompts share cached prefixes only with their own: by timing theirs,
                # one user could otherwise tell what another's conversation holds.
                prompt = await self.context.build(conversation_id, tools, caller.user, meter,
                                                  memory, remember, system=system,
                                                  instructions=choice.tools)
                if not await meter.may_call():
                    result.text = TOKENS_SPENT
                    return result
                content, calls, errors, out = await self._generate(
                    prompt, params, tools, f"{run_id}-{step}", sink, meter, caller, choice.tools)
                # A malformed call is a call too, answered by its id: a tool message answering
                # none makes strict servers refuse every later request of the conversation.
                unreadable = [new_call_id() for _ in errors]
                step_message = dict(
                    role="assistant", content=content,
                    token_count=out.completion_tokens if out is not None else 0,
                    tool_calls=[*map(_unreadable_json, unreadable), *map(_call_json, calls)] or None,
                    prompt_version=choice.label)
                # A step of calls is stored by _run_calls: with its first call's result where that
                # call only reads (one commit for both), else before the call acts.
                pending = step_message if calls and not errors else None
                if pending is None:
                    result.last_message_id = (await self.context.add(conversation_id,
                                                                     **step_message)).id
                if not calls and not errors:
                    result.text = content if content.strip() else "(no answer)"
                    return result
                for call_id, error in zip(unreadable, errors, strict=True):
                    # back to the model, not to the user
                    result.last_message_id = (await self.context.add(
                        conversation_id, "tool", f"error: {error}", tool_call_id=call_id)).id
                    meter.tool_ended(ok=False)
                if not await self._run_calls(conversation_id, calls, pending, caller, untrusted,
                                             sink, meter, result):
                    return _refused(result)
                # Before the next model call (or the step-limit message). The first model call
                # needs no look: the gateway admitted the caller just before the turn.
                if not await caller.still_allowed():
                    return _refused(result)
            result.text = (f"I stopped after {max_steps} tool steps without a final "
                           "answer. Tell me how to continue, or ask again more narrowly.")
            return result
        except PromptTooLong as exc:
            result.text, result.failed = f"Sorry, that message is too long for me: {exc}.", True
            return result
        except TokensSpent:  # before a summary its history needed
            result.text = TOKENS_SPENT
            return result
        except (asyncio.CancelledError, ModelUnavailable):  # the caller's to handle: see Turns
            raise
        except Exception:
            log.exception("turn %s failed", run_id)
            result.text, result.failed = APOLOGY, True
            return result

    async def count_later(self, result: TurnResult) -> None:
        """Store the token_count of the turn's user message (`result.uncounted`), once its reply
        is out: its count alone, as the model counts it (the cached history keeps the message as
        it was stored, without it: nothing reads it there). Never raises but a cancel: the reply
        is out; a count lost leaves the column empty."""
        if result.uncounted is None:
            return
        (message_id, text), result.uncounted = result.uncounted, None
        try:
            tokens = await self.context.counter.alone({"role": "user", "content": text})
            await self.store.set_token_count(message_id, tokens)
        except Exception as exc:
            log.warning("the token count of message %s was not stored: %s", message_id, exc)

    async def _prompt_choice(self, caller: Caller) -> PromptChoice:
        if self.prompts is None:
            return decide(PromptSnapshot(), caller.user, self.settings.system_prompt)
        return await choose(self.prompts, caller.user, self.settings.system_prompt)

    def _only_reads(self, call: ToolCall, principal: Principal) -> bool:
        """Whether `call` is to a skill that changes nothing with these arguments, and asks for
        no approval."""
        skill = self.executor.registry.get(call.name)
        args = call.arguments if isinstance(call.arguments, dict) else {}
        return not (skill is None or skill.acts(args) or principal.needs_approval(call.name))

    def _recalls(self, caller: Caller) -> bool:
        """Whether the turn's memory is to be recalled: a memory, a known chat kind, and entries
        for the user as far as the memory knows without asking its store."""
        return (self.memory is not None and caller.in_group is not None
                and not self.memory.holds_nothing(caller.user))

    def _remember(self, caller: Caller) -> Remember | None:
        """Where the turn's compaction summaries go: none without a memory or a known chat kind."""
        if self.memory is None or caller.in_group is None:
            return None
        return functools.partial(self.memory.remember_summary, caller.user,
                                 chat_scope(caller.chat_id, caller.in_group))

    async def _memory(self, caller: Caller, text: str) -> tuple[dict | None, Remember | None]:
        """The turn's memory message (recalled for its message, within [agent] memory_tokens),
        and where its compaction summaries go; neither without a memory or a known chat kind."""
        if self.memory is None or caller.in_group is None:
            return None, None
        scope = chat_scope(caller.chat_id, caller.in_group)
        budget = self.settings.memory_tokens
        if budget is None:  # a tenth of the prompt: room enough for a name, rules, a few facts
            budget = self.context.budget.prompt_tokens // 10
        entries = await self.memory.recall(caller.user, scope, text)
        counter = self.context.counter
        if self.context.sums_hold():  # the message alone from its sums, as the model counts it
            count, bound = counter.alone, counter.bound_alone
        else:
            count, bound = (lambda message: self.context.count([message])), None
        message = await fitted([entry_line(e) for e in entries], budget, count, bound)
        return message, self._remember(caller)

    async def _generate(self, prompt: list[dict], params: SamplingParams, tools: list[dict] | None,
                        request_id: str, sink: ReplySink, meter: _TurnMeter, caller: Caller,
                        instructions: str | None = None
                        ) -> tuple[str, list[ToolCall], list[str], ModelOutput | None]:
        parser = StreamingToolParser()
        guard = LoopGuard(self.settings.loop_repeats)
        out: ModelOutput | None = None
        await sink.typing()
        started = time.monotonic()
        # The user's tool-instruction template, when the library gives one (a model without the
        # library's templates is never handed the keyword).
        template = {} if instructions is None else {"tool_instructions": instructions}
        try:
            # Closed as the loop is left (/stop, an error): the request ends now, not when the
            # stream is collected.
            async with aclosing(self.model.generate(prompt, params, request_id, tools=tools,
                                                    priority=caller.priority,
                                                    cache_salt=caller.user, **template)) as stream:
                async for out in stream:
                    if started is not None:
                        self.metrics.observe("openclaw_time_to_first_token_seconds",
                                             time.monotonic() - started)
                        started = None
                        meter.first_token()
                    if parser.feed(out.delta_text):
                        if guard.looping(parser.shown):  # ends the request: see LoopGuard
                            break
                        await sink.draft(parser.shown)
        finally:
            # Also when cut short (/stop, /new, an error): the engine did that work, and a cap
            # that counted only finished answers would be dodged by stopping each one near its end.
            if out is not None:
                meter.spent(out.prompt_tokens, out.completion_tokens)
        parsed = parser.finish()
        if guard.kept is not None:  # the reply without its repeats; no call follows a loop
            log.info("request %s: the reply repeated itself; ended after %d tokens", request_id,
                     out.completion_tokens if out is not None else 0)
            return guard.kept, [], [], out
        return parsed.content, parsed.tool_calls, parsed.errors, out

    async def _run_calls(self, conversation_id: int, calls: list[ToolCall], pending: dict | None,
                         caller: Caller, untrusted: Untrusted, sink: ReplySink,
                         meter: _TurnMeter, result: TurnResult) -> bool:
        """Run a step's calls in order, each result stored as it ends; False when the caller lost
        access before one. `pending`: the step, not stored yet: stored with the first call's
        result where that call only reads and asks no approval (as the role is now: a reload may
        have changed it), else alone before the call runs, and however the calls end otherwise
        (/stop, an error)."""
        async def store_step() -> None:
            nonlocal pending
            if pending is not None:
                step, pending = pending, None
                result.last_message_id = (await self.context.add(conversation_id, **step)).id

        for call in calls:
            try:
                if not await caller.still_allowed():
                    await store_step()
                    return False
                principal = _principal_now(caller)
                if pending is not None and (principal is None
                                            or not self._only_reads(call, principal)):
                    await store_step()
                await sink.typing()
            except BaseException:  # the call never began: the step without its result
                await store_step()
                raise
            try:
                outcome = await self._call_tool(call, principal, caller, untrusted)
            except asyncio.CancelledError:  # /stop, /new, a drain: it says what is known
                result.last_message_id = (await self.context.add(
                    conversation_id, "tool", STOPPED_CALL, tool_call_id=call.id,
                    before=pending)).id
                raise
            except BaseException:
                await store_step()
                raise
            # Its audit row with it, one transaction: no row without its result.
            result.last_message_id = (await self.context.add(
                conversation_id, "tool", outcome.text, tool_call_id=call.id,
                audit=outcome.audit, before=pending)).id
            pending = None
            meter.tool_ended(ok=outcome.ok)
            await sink.tool_ran(call.name, call.arguments, outcome)
        return True

    async def _call_tool(self, call: ToolCall, principal: Principal | None, caller: Caller,
                         untrusted: Untrusted) -> Outcome:
        """`principal`: the caller's as the config says now; None where its workspace could not
        be made (_principal_now)."""
        if principal is None:
            return Outcome(f"error: {call.name} did not run: the user's workspace is not usable "
                           "right now (the owner has been told)", False, "denied")
        skill = self.executor.registry.get(call.name)
        args = call.arguments if isinstance(call.arguments, dict) else {}
        approver = caller.approver
        if skill is not None and skill.acts(args) and (why := untrusted.reason()) is not None:
            if principal.role.approve_after_untrusted:
                principal = requiring_approval(principal, call.name)
            approver = explained(approver, why)  # also where the role asks anyway
        outcome = await self.executor.call(call.name, call.arguments, principal,
                                           chat_id=caller.chat_id, approver=approver,
                                           in_group=caller.in_group, keep_audit=True)
        if (outcome.decision == "allowed" and skill is not None
                and (source := skill.untrusted_source(args)) is not None):
            untrusted.note(source)
        return outcome


@dataclass
class _TurnMeter:
    """A turn's model calls (its steps, and the summaries its history needs) against the caller's
    daily tokens. The first call is the gateway's to allow (it looked as the turn began); each
    later one asks `has_tokens`, so the cap is passed by at most one call per running turn."""

    result: TurnResult
    has_tokens: Callable[[], Awaitable[bool]] = _always_allowed
    calls: int = 0
    started: float = 0.0  # time.monotonic() as the turn began: its trace's first_token_ms

    def first_token(self) -> None:
        if self.result.first_token_ms is None:
            self.result.first_token_ms = round((time.monotonic() - self.started) * 1000)

    def tool_ended(self, ok: bool) -> None:
        self.result.tool_calls += 1
        self.result.tool_errors += not ok
        self.result.last_tool_failed = not ok

    async def may_call(self) -> bool:
        self.calls += 1
        return self.calls == 1 or await self.has_tokens()

    def spent(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.result.prompt_tokens += prompt_tokens
        self.result.completion_tokens += completion_tokens


def _principal_now(caller: Caller) -> Principal | None:
    """The caller's principal as the config says now (a reload may have changed the role); None,
    said in the log, where its workspace cannot be made."""
    try:
        return caller.principal_now() if caller.principal_now else caller.principal
    except OSError as exc:  # a reload moved the role's workspace where it cannot be made
        log.error("cannot prepare the workspace of %s (see roles.*.workspace): %s",
                  caller.user, exc)
        return None


def _refused(result: TurnResult) -> TurnResult:
    """The turn as it ends for a caller who lost access: no reply, not even an apology."""
    result.text, result.refused = "", True
    return result


def _unreadable_json(call_id: str) -> dict[str, Any]:
    """A malformed call as stored: what it said is in its error, the tool message after it."""
    return {"id": call_id, "type": "function",
            "function": {"name": UNREADABLE_CALL, "arguments": "{}"}}


def _call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}
