"""The prompt for the next model call: system prompt, the stored summary, and the conversation
since it, within the token budget counted as the model counts (ChatModel.count_chat).

When the history outgrows the budget, the oldest turns are summarised by the model itself and the
summary is stored with the id of the last message it covers. Nothing is deleted: the store keeps
every message; the prompt just starts from the summary.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from engine import SamplingParams
from openclaw.agent.counting import PromptCounter
from openclaw.agent.memory import with_memory
from openclaw.agent.model import ChatModel
from openclaw.store.records import Message, MessageRole, Summary


class HistoryStore(Protocol):
    """What the agent needs of the store: one conversation's messages and summaries.
    openclaw.store.Store has it; a Protocol rather than the Store, so the agent can reach nothing
    else (users, deliveries, the audit) and runs over any history that has these four."""

    async def add_message(self, conversation_id: int, role: str, content: str, *,
                          tool_calls: Any | None = None, tool_call_id: str | None = None,
                          token_count: int | None = None,
                          prompt_version: str | None = None,
                          audit: dict[str, Any] | None = None) -> Message: ...

    async def add_messages(self, conversation_id: int, messages: list[dict[str, Any]],
                           audit: dict[str, Any] | None = None) -> list[Message]: ...

    async def list_messages(self, conversation_id: int, after_id: int | None = None) -> list[Message]: ...

    async def add_summary(self, conversation_id: int, up_to_message_id: int, content: str,
                          token_count: int) -> Summary: ...

    async def latest_summary(self, conversation_id: int) -> Summary | None: ...

    async def set_token_count(self, message_id: int, tokens: int) -> None: ...


class Meter(Protocol):
    """A turn's model calls against the user's daily tokens (agent.loop's _TurnMeter)."""

    async def may_call(self) -> bool:
        """Whether another model call may start (and count it)."""

    def spent(self, prompt_tokens: int, completion_tokens: int) -> None:
        """What a model call used."""


Remember = Callable[[str, str], Awaitable[None]]


class TokensSpent(Exception):
    """The user's daily tokens ran out before a summarising call the prompt needed."""


log = logging.getLogger(__name__)

SUMMARY_INSTRUCTIONS = (
    "You write the memory of an assistant. Summarise the conversation below in a few sentences: "
    "keep names, facts, numbers, decisions, the user's preferences and any open tasks. "
    "Write only the summary."
)
SUMMARY_HEADER = "\n\nSummary of the earlier conversation:\n"
SUMMARY_MESSAGE_CHARS = 2000  # of each message, in the transcript the model summarises
SUM_MARGIN = 64  # tokens: a message alone is counted whole when its sum comes this near the budget
SHORTENED_RESULT_CHARS = 300  # of a tool result left out of a turn that outgrew the context


class PromptTooLong(Exception):
    """Even the newest message alone does not fit the context budget."""


@dataclass
class _Counted:
    """A cached history's tokens: those of its first `messages` messages, and whether a sum was
    checked against the model's count of the whole prompt yet (once per conversation read). The
    `bounded` messages after those are not counted yet: `bound` is at least their tokens."""

    messages: int
    tokens: int
    checked: bool = False
    bounded: int = 0
    bound: int = 0


@dataclass
class Held:
    """A message a conversation holds (ContextBuilder.hold): `fields` as add_message takes them,
    `message` as its prompts show it until it is stored, `stored` as stored (with its id)."""

    fields: dict[str, Any]
    message: Message
    stored: Message | None = None
    # The messages of a write that held this one and was cut short (cancelled, failed): it may
    # have been stored; the next read of the history settles it (_settle_tried).
    tried: list[dict[str, Any]] | None = None


_NOT_STORED = datetime.min.replace(tzinfo=UTC)  # a held message's created_at until it is stored


@dataclass
class Budget:
    prompt_tokens: int  # the model's context minus what is reserved for the reply
    keep_messages: int  # the newest messages are never compacted
    summary_tokens: int = 256


class ContextBuilder:
    """Keeps, per conversation, the latest summary and the messages after it in memory (the daemon
    is the only writer, and every message it stores passes through `add`), so building a prompt
    does not re-read the history from the store at every model call."""

    MAX_CACHED = 256  # conversations; the least recently used are dropped and re-read on demand

    def __init__(self, model: ChatModel, store: HistoryStore, system_prompt: str,
                 budget: Budget) -> None:
        self.model, self.store, self.system_prompt, self.budget = model, store, system_prompt, budget
        # The summaries' sampling ([agent.sampling] summary, set by the agent); max_tokens is the
        # budget's summary_tokens.
        self.summary_params = SamplingParams(temperature=0.0, max_tokens=budget.summary_tokens)
        self._cache: OrderedDict[int, tuple[Summary | None, list[Message]]] = OrderedDict()
        self._counted: dict[int, _Counted] = {}  # beside _cache, for the same conversations
        self._answered: dict[int, _Answered] = {}  # likewise
        # Messages held back per conversation (`hold`): in its prompts, stored with its next
        # `add`. Apart from _cache: a history re-read from the store gets them back at its end.
        self._held: dict[int, list[Held]] = {}
        self.counter = PromptCounter(self.count, getattr(model, "count_message", None),
                                     getattr(model, "bound_message", None))

    async def count(self, messages: list[dict], tools: list[dict] | None = None,
                    instructions: str | None = None) -> int:
        """`messages` with `tools` counted as the model counts them; `instructions`: the tool
        section's template (openclaw.prompts "tools"), None for the model's built-in one."""
        if instructions is None:  # a model without the prompt library's templates takes none
            return await self.model.count_chat(messages, tools)
        return await self.model.count_chat(messages, tools, tool_instructions=instructions)

    async def fits_alone(self, text: str, tools: list[dict] | None, system: str | None = None,
                         instructions: str | None = None) -> bool:
        """Whether the system prompt (`system`, else `system_prompt`) and the user's `text` alone
        fit the prompt budget: summed from cached counts where that says so, else counted whole."""
        system = {"role": "system", "content": self.system_prompt if system is None else system}
        user = {"role": "user", "content": text}
        budget = self.budget.prompt_tokens
        # Summed only once a sum held against a whole count (this check has none of its own),
        # and only well within the budget: scaffolding a template adds to a prompt as a whole
        # (a date line, say) is in no message's count.
        if self._summing() and self.counter.checked:
            head = await self.counter.head(system, tools, instructions) + SUM_MARGIN
            bound = self.counter.bound(user)  # no encoding: the message is counted after the reply
            if bound is not None and head + bound <= budget:
                return True
            if head + await self.counter.message(user) <= budget:
                return True
        return await self.count([system, user], tools, instructions) <= budget

    def sums_hold(self) -> bool:
        """Whether counts are taken as sums here, and a sum held against a whole count."""
        return self._summing() and self.counter.checked

    def _summing(self) -> bool:
        """Whether prompts may be counted as sums of cached counts: only for a model whose count
        of the same messages never changes (an estimate that learns from usage reports would
        leave every cached count stale), and while no sum was found short (agent.counting)."""
        return self.counter.summing and getattr(self.model, "fixed_counts", False)

    def _forget(self, conversation_id: int) -> None:
        self._cache.pop(conversation_id, None)
        self._counted.pop(conversation_id, None)
        self._answered.pop(conversation_id, None)

    def hold(self, conversation_id: int, role: str, content: str) -> Held:
        """A message in the conversation's prompts from now on, not stored yet: it is stored with
        the conversation's next `add`, before that message and in its transaction, or by
        `flush`. A turn holds its user's message so (one commit fewer a turn): until its first
        step or answer is stored, a crash leaves the message only as received, and it is answered
        afresh after the restart."""
        held = Held({"role": role, "content": content}, Message(
            id=0, conversation_id=conversation_id, role=MessageRole(role), content=content,
            tool_calls=None, tool_call_id=None, token_count=None, created_at=_NOT_STORED))
        self._held.setdefault(conversation_id, []).append(held)
        cached = self._cache.get(conversation_id)
        if cached is not None:
            cached[1].append(held.message)
        return held

    async def flush(self, conversation_id: int) -> None:
        """Store the messages the conversation holds (`hold`), if any."""
        held = self._held.get(conversation_id)
        if held and held[0].tried is not None:  # a write cut short may have stored them
            await self.history(conversation_id)  # read again, which tells
        if self._held.get(conversation_id):
            await self._store(conversation_id, [], None)

    async def add(self, conversation_id: int, role: str, content: str, *,
                  before: dict[str, Any] | None = None, **fields: Any) -> Message:
        """Store a message, and keep the cached history in step with the store. `before`: a
        message (add_message's fields) stored just before it, in the same transaction; so are
        the messages the conversation holds (`hold`), before both."""
        audit = fields.pop("audit", None)
        new = [*([before] if before is not None else []), dict(role=role, content=content, **fields)]
        return (await self._store(conversation_id, new, audit))[-1]

    async def _store(self, conversation_id: int, new: list[dict[str, Any]],
                     audit: dict[str, Any] | None) -> list[Message]:
        """The held messages, then `new`, in one transaction (with `audit`, a call's audit row)."""
        held = self._held.pop(conversation_id, [])
        messages = [h.fields for h in held] + new
        try:
            if len(messages) == 1:
                extra = {} if audit is None else {"audit": audit}
                added = [await self.store.add_message(conversation_id, **messages[0], **extra)]
            else:
                added = await self.store.add_messages(conversation_id, messages, audit)
        except BaseException:
            # Cancelled mid-commit, or refused: the rows may be stored or not; re-read next time.
            # The held ones are held again until that read says whether they were stored.
            self._forget(conversation_id)
            if held:
                for h in held:
                    h.tried = messages
                self._held[conversation_id] = held + self._held.get(conversation_id, [])
            raise
        for h, message in zip(held, added, strict=False):
            h.stored = message
        cached = self._cache.get(conversation_id)
        if cached is not None:
            history = cached[1]
            # The held ones are at the end, in this order (hold): the stored rows take their place.
            history[len(history) - len(held):] = added
        return added

    def _settle_tried(self, conversation_id: int, stored: list[Message]) -> None:
        """Held messages whose write was cut short (`tried`): stored if the conversation, as read
        now, ends with that write's messages (nothing else writes to it meanwhile), else held."""
        held = self._held.get(conversation_id, [])
        if not held or held[0].tried is None:
            return
        tried = held[0].tried
        tail = stored[len(stored) - len(tried):] if len(stored) >= len(tried) else []
        written = len(tail) == len(tried) and all(
            (str(m.role), m.content, m.tool_call_id) ==
            (str(f["role"]), f["content"], f.get("tool_call_id"))
            for m, f in zip(tail, tried, strict=True))
        ours = [h for h in held if h.tried is tried]
        for i, h in enumerate(ours):
            h.tried = None
            if written:
                h.stored = tail[i]
        if written:
            self._held[conversation_id] = held[len(ours):]
            if not self._held[conversation_id]:
                del self._held[conversation_id]

    async def history(self, conversation_id: int) -> tuple[Summary | None, list[Message]]:
        """(latest summary or None, the messages after it), from memory when possible."""
        cached = self._cache.get(conversation_id)
        if cached is None:
            summary = await self.store.latest_summary(conversation_id)
            after = summary.up_to_message_id if summary else None
            cached = (summary, await self.store.list_messages(conversation_id, after_id=after))
            self._settle_tried(conversation_id, cached[1])
            cached[1].extend(h.message for h in self._held.get(conversation_id, ()))
            self._cache[conversation_id] = cached
            self._counted.pop(conversation_id, None)
            if len(self._cache) > self.MAX_CACHED:
                self._forget(next(iter(self._cache)))
        self._cache.move_to_end(conversation_id)
        return cached

    async def build(self, conversation_id: int, tools: list[dict] | None,
                    cache_salt: str | None = None, meter: Meter | None = None,
                    memory: dict | None = None, remember: Remember | None = None,
                    system: str | None = None, instructions: str | None = None) -> list[dict]:
        """The prompt for the conversation's next model call, older turns compacted into a summary
        where they no longer fit. `cache_salt`: the user's, for the summarising calls too;
        `meter`: each summarising call is asked of it first (TokensSpent when refused) and told to
        it after. `memory`: the user's memory message (agent.memory); `remember`: given each
        summary stored (its text, "summary:ID"), to keep it in the user's memory. `system`: the
        turn's system prompt (its user's version: openclaw.prompts), else `system_prompt`;
        `instructions`: the turn's tool-instruction template (None: the model's own)."""
        while True:
            summary, history = await self.history(conversation_id)
            prompt = with_memory(self._prompt(conversation_id, summary.content if summary else None,
                                              history, system), memory)
            if await self._fits(conversation_id, prompt, history, memory, tools, instructions):
                return prompt
            cut = _compaction_cut(history, self.budget.keep_messages)
            if cut == 0 and memory is not None:  # the turn itself comes before the user's memory
                memory = None
                continue
            if cut == 0:  # only the current turn is left: its own tool results outgrew it
                shortened = await self._shorten_tool_results(prompt, tools, instructions)
                if shortened is not None:
                    return shortened
                raise PromptTooLong(
                    f"the newest message and the results of its tools do not fit the model's "
                    f"context ({self.budget.prompt_tokens} tokens for the prompt)")
            await self._compact(conversation_id, summary.content if summary else None, history[:cut],
                                cache_salt, meter, remember)
            self._forget(conversation_id)  # re-read from the new summary on

    async def _fits(self, conversation_id: int, prompt: list[dict], history: list[Message],
                    memory: dict | None, tools: list[dict] | None,
                    instructions: str | None = None) -> bool:
        """Whether `prompt` fits the budget. Its count is summed from cached counts (the messages
        stored since the last call counted, each alone, or taken at their bounds while those fit:
        _within_bounds) where that is known to work for this model (agent.counting); the whole
        prompt is counted once per conversation read from the store, to know its history's
        tokens and check a sum, and whenever a sum says no."""
        budget, counter = self.budget.prompt_tokens, self.counter
        counted = self._counted.get(conversation_id) if self._summing() else None
        if counted is not None:
            if counted.checked and await self._within_bounds(counted, prompt, history, memory,
                                                             tools, instructions):
                return True
            for message in history[counted.messages:]:
                counted.tokens += await counter.message(message.as_chat())
            counted.messages, counted.bounded, counted.bound = len(history), 0, 0
            summed = await self._summed(prompt, history, memory, tools, instructions,
                                        counted.tokens)
            if counted.checked and summed <= budget:
                return True
        exact = await self.count(prompt, tools, instructions)
        if counted is not None:
            counter.check(summed, exact)
            # Anchored to the whole count: a sum a little over it (a template that joins
            # messages) does not drift further with each message.
            counted.tokens += exact - summed
            counted.checked = True
        elif self._summing() and conversation_id in self._cache:
            # The history's share of this count, for the sums of the next calls.
            tokens = exact - await self._summed(prompt, history, memory, tools, instructions, 0)
            self._counted[conversation_id] = _Counted(len(history), tokens)
        return exact <= budget

    async def _within_bounds(self, counted: _Counted, prompt: list[dict], history: list[Message],
                             memory: dict | None, tools: list[dict] | None,
                             instructions: str | None) -> bool:
        """Whether the prompt fits with each message not counted yet at its bound (the model's
        bound_message: no encoding), so that none need be counted now: far from the budget, a
        turn's new messages are counted only once the bounds of all not counted no longer fit,
        then all at once. The same answer as counting them (a bound is at least the count)."""
        for message in history[counted.messages + counted.bounded:]:
            bound = self.counter.bound(message.as_chat())
            if bound is None:
                return False
            counted.bounded += 1
            counted.bound += bound
        summed = await self._summed(prompt, history, memory, tools, instructions,
                                    counted.tokens + counted.bound, bounded=True)
        return summed <= self.budget.prompt_tokens

    async def _summed(self, prompt: list[dict], history: list[Message], memory: dict | None,
                      tools: list[dict] | None, instructions: str | None,
                      history_tokens: int, bounded: bool = False) -> int:
        """The prompt's count as the sum of its system message's (with the tools), the history's
        (given), the memory message's and those of the results that say a call was not run.
        `bounded`: the memory message at its bound where it has one (at least its count)."""
        total = await self.counter.head(prompt[0], tools, instructions) + history_tokens
        if memory is not None:
            bound = self.counter.bound(memory) if bounded else None
            total += bound if bound is not None else await self.counter.message(memory)
        if len(prompt) > 1 + len(history) + (memory is not None):
            for chat in prompt[1:]:
                if chat.get("content") == NOT_RUN and chat["role"] == "tool":
                    total += await self.counter.message(chat)
        return total

    async def _shorten_tool_results(self, prompt: list[dict], tools: list[dict] | None,
                                    instructions: str | None) -> list[dict] | None:
        """The prompt with the turn's older tool results cut to their start, oldest first, until
        it fits (None if it never does). Only the prompt: the store keeps them whole, and every
        call keeps a result. The newest result is left whole: it is what the model reads now."""
        prompt = [dict(m) for m in prompt]
        older = [m for m in prompt if m["role"] == "tool"][:-1]
        for message in older:
            text = message.get("content") or ""
            if len(text) > SHORTENED_RESULT_CHARS:
                message["content"] = (
                    text[:SHORTENED_RESULT_CHARS] + f" [... the rest of this result ({len(text)} "
                    "characters in all) was left out to fit the context; call the tool again for "
                    "a part of it if needed]")
                if await self.count(prompt, tools, instructions) <= self.budget.prompt_tokens:
                    return prompt
        return None

    def _prompt(self, conversation_id: int, summary: str | None, history: list[Message],
                system: str | None = None) -> list[dict]:
        system = (system if system is not None else self.system_prompt) + (
            SUMMARY_HEADER + summary if summary else "")
        answered = self._answered.get(conversation_id)
        if answered is None or answered.history is not history:
            answered = self._answered[conversation_id] = _Answered(history)
        return [{"role": "system", "content": system}, *answered.chats_now()]

    async def _compact(self, conversation_id: int, previous: str | None, old: list[Message],
                       cache_salt: str | None, meter: Meter | None,
                       remember: Remember | None = None) -> None:
        """Summarise `old` (with the previous summary) into one stored summary. A transcript too
        long for one call is summarised in front-to-back pieces, each stored as it completes."""
        while old:
            take = len(old)
            while take > 1 and await self.count(self._summary_prompt(previous, old[:take])) > (
                    self.budget.prompt_tokens - self.budget.summary_tokens):
                take = max(1, take // 2)
            text = await self._summarise(self._summary_prompt(previous, old[:take]), cache_salt,
                                         meter)
            last = old[take - 1]
            tokens = await self.count([{"role": "system", "content": text}])
            stored = await self.store.add_summary(conversation_id, last.id, text, tokens)
            if remember is not None:  # so /new no longer forgets what was compacted
                await remember(text, f"summary:{stored.id}")
            log.info("conversation %s: compacted %d messages (up to id %s) into a %d-token summary",
                     conversation_id, take, last.id, tokens)
            previous, old = text, old[take:]

    def _summary_prompt(self, previous: str | None, messages: list[Message]) -> list[dict]:
        lines = [f"Earlier summary: {previous}"] if previous else []
        for m in messages:
            text = m.content or ""
            if len(text) > SUMMARY_MESSAGE_CHARS:  # one huge message must not block compaction
                text = text[:SUMMARY_MESSAGE_CHARS] + f" [... {len(text)} characters in all]"
            if m.tool_calls:
                calls = ", ".join(f"{c['function']['name']}({_args(c)})" for c in m.tool_calls)
                text = f"{text} [called {calls}]".strip()
            lines.append(f"{m.role}: {text}")
        transcript = "\n".join(lines)
        return [{"role": "system", "content": SUMMARY_INSTRUCTIONS},
                {"role": "user", "content": transcript}]

    async def _summarise(self, prompt: list[dict], cache_salt: str | None,
                         meter: Meter | None) -> str:
        params = replace(self.summary_params, max_tokens=self.budget.summary_tokens)
        if meter is not None and not await meter.may_call():
            raise TokensSpent
        last = None
        try:
            async with aclosing(self.model.generate(prompt, params, cache_salt=cache_salt)) as stream:
                async for out in stream:
                    last = out
        finally:  # also when cut short: the engine did that work for this user
            if last is not None and meter is not None:
                meter.spent(last.prompt_tokens, last.completion_tokens)
        return (last.text.strip() if last is not None else "") or "(no summary)"


def _args(call: dict) -> str:
    args = call["function"].get("arguments", {})
    return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class _Answered:
    """A history as chat messages, every tool call followed by a result. A turn stopped between
    a call and its result (/stop, access withdrawn, a crash before the result was stored) left
    none; a model shown a call without one may take it as done, or make a result up.
    Kept per cached history, in step with it: a model call turns only the messages added since
    the last into chat messages, not the whole conversation again."""

    def __init__(self, history: list[Message]) -> None:
        self.history = history  # the cached list this follows (a new one is read afresh)
        self.read = 0
        self.chats: list[dict] = []
        self.unanswered: list[str] = []  # ids of the latest assistant message's calls with no result yet

    def chats_now(self) -> list[dict]:
        for message in self.history[self.read:]:
            if message.role != "tool":
                self.chats.extend(_not_run(call_id) for call_id in self.unanswered)
                self.unanswered = []
            self.chats.append(message.as_chat())
            if message.role == "assistant" and message.tool_calls:
                self.unanswered = [call["id"] for call in message.tool_calls if call.get("id")]
            elif message.role == "tool" and message.tool_call_id in self.unanswered:
                self.unanswered.remove(message.tool_call_id)
        self.read = len(self.history)
        return [*self.chats, *(_not_run(call_id) for call_id in self.unanswered)]


NOT_RUN = "error: not run: the turn was stopped before this call ran"


def _not_run(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": NOT_RUN}


def _compaction_cut(history: list[Message], keep: int) -> int:
    """How many of the oldest messages to compact: everything before the start of a user turn,
    keeping at least the newest `keep` messages when possible (a tool call never parts from its
    result). 0 when only the newest turn is left."""
    user_starts = [i for i, m in enumerate(history) if m.role == "user"]
    if not user_starts:
        return 0
    limit = max(0, len(history) - keep)
    eligible = [i for i in user_starts if 0 < i <= limit]
    if eligible:
        return eligible[-1]
    earlier = [i for i in user_starts if i > 0]
    return earlier[-1] if earlier else 0
