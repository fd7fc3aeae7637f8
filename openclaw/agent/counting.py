"""A prompt's token count as the sum of its pieces' counts, each piece counted once.

Counting a prompt as the model does (ChatModel.count_chat) renders and encodes all of it: with the
engine's tokenizer that is milliseconds for a short conversation and tens of them for a long one,
several times a turn. Here each message is counted once, as the tokens it adds after a fixed
system message (by the model's count_message where it has one: the engine's encodes the message
alone, without rendering the template), and the system prompt with the tools once per (text,
tools); a prompt's count is then the sum. That sum equals the model's count for templates that
render each message on its own (ChatML, Llama 3); where a template joins messages (grouped tool
results) it is more. It is checked against the model's count whenever that is taken, and if it
was ever less, sums are no longer used: every prompt is counted whole again, as before.
"""

from __future__ import annotations

import logging
import pickle
from collections import OrderedDict
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

# (messages, tools, the tool section's template or None): ContextBuilder.count
CountChat = Callable[[list[dict], list[dict] | None, str | None], Awaitable[int]]
# (message, after): the tokens `message` adds to a prompt of `after` alone, or None where the
# model has no such count (ChatModel.count_message; the engine's takes no template rendering)
CountMessage = Callable[[dict, dict], "int | None"]

# What each message is counted after: a system message, so that a template which adds a default
# one when the prompt has none does not add it to every message's count.
ANCHOR = {"role": "system", "content": "."}


class PromptCounter:
    MAX_HEADS = 64  # (system text, tools) pairs kept: prompts and role tool sets change rarely

    MAX_MESSAGES = 16  # the latest messages' counts: a turn's are asked for again (alone, sums)

    def __init__(self, count: CountChat, count_message: CountMessage | None = None,
                 bound_message: CountMessage | None = None) -> None:
        self._count = count
        self._count_message = count_message
        self._bound_message = bound_message
        self._anchor: int | None = None
        self._messages: OrderedDict[tuple, int] = OrderedDict()
        self._heads: OrderedDict[tuple[str, bytes, str | None], int] = OrderedDict()
        self.summing = True  # False once a sum was found below the model's count
        self.checked = False  # a sum was checked against the model's count, and held
        # Per role: a prompt of one message counts this many tokens more than the message adds
        # after a system message (a default system prompt, the generation prompt).
        self._alone: dict[str, int] = {}

    async def message(self, chat: dict) -> int:
        """The tokens `chat` adds to a prompt (after a system message)."""
        key = _chat_key(chat)
        found = self._messages.get(key)
        if found is None and self._count_message is not None:
            found = self._count_message(chat, ANCHOR)
            if found is not None:
                self._keep(key, found)
        if found is None:
            if self._anchor is None:
                self._anchor = await self._count([ANCHOR], None, None)
            found = await self._count([ANCHOR, chat], None, None) - self._anchor
            self._keep(key, found)
        return found

    def bound(self, chat: dict) -> int | None:
        """At least message(chat), without counting it: its count where one is kept, else the
        model's bound_message; None where the model gives none."""
        found = self._messages.get(_chat_key(chat))
        if found is not None:
            return found
        return None if self._bound_message is None else self._bound_message(chat, ANCHOR)

    def bound_alone(self, chat: dict) -> int | None:
        """At least alone(chat), without counting it: its bound and what a prompt of it alone
        adds, once sums held against the model's counts and that was learnt for its role; None
        where not known so."""
        role = chat["role"]
        if not (self.summing and self.checked and role in self._alone):
            return None
        bound = self.bound(chat)
        return None if bound is None else bound + self._alone[role]

    def _keep(self, key: tuple, found: int) -> None:
        self._messages[key] = found
        if len(self._messages) > self.MAX_MESSAGES:
            self._messages.popitem(last=False)

    async def alone(self, chat: dict) -> int:
        """The count of a prompt of `chat` alone (as the model counts [chat]: a user message's
        stored token_count), from its `message` count (one encode, or none where the prompt's
        sums took it), once sums held against the model's counts; else counted. Exact for
        templates that render each message on its own, as the sums are."""
        role = chat["role"]
        if self.summing and self.checked and role in self._alone:
            return await self.message(chat) + self._alone[role]
        exact = await self._count([chat], None, None)
        if self.summing:
            self._alone[role] = exact - await self.message(chat)
        return exact

    async def head(self, system: dict, tools: list[dict] | None,
                   instructions: str | None = None) -> int:
        """The count of a prompt of `system` alone, with `tools` (under `instructions`)."""
        key = (system["content"], _key(tools) if tools else b"", instructions)
        found = self._heads.get(key)
        if found is None:
            found = self._heads[key] = await self._count([system], tools, instructions)
            if len(self._heads) > self.MAX_HEADS:
                self._heads.popitem(last=False)
        self._heads.move_to_end(key)
        return found

    def check(self, summed: int, exact: int) -> None:
        """A sum against the model's count of the same prompt: sums stop if it was less."""
        if self.summing and summed >= exact:
            self.checked = True
        elif self.summing:
            self.summing = False
            log.warning("this model's chat template does not count a prompt as the sum of its "
                        "messages (%d summed, %d counted): prompts are counted whole from now on",
                        summed, exact)


def _chat_key(chat: dict) -> tuple:
    return (chat["role"], chat.get("content"), chat.get("tool_call_id"),
            _key(chat["tool_calls"]) if chat.get("tool_calls") else None)


def _key(value: object) -> bytes:
    """A cache key for JSON-like data (tool schemas, calls): its pickle, a tenth of the cost of
    serialising it to JSON each turn. Equal data pickled apart (keys in another order, a string
    shared) only misses the cache; 1, 1.0 and True, which compare equal, stay apart."""
    return pickle.dumps(value, protocol=5)
