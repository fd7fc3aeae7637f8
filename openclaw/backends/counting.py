"""Counting a prompt's tokens for a model on a server, best first: the server's own count
(`POST /tokenize` with the messages, vLLM's shape, which SGLang and `openclaw serve` share), else
a local copy of the model's tokenizer (`[engine] tokenizer`), else an estimate from the prompt's
size at the rate the server's reported usage shows."""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from pathlib import Path

from openclaw.backends.http import Client, ServerRefused

log = logging.getLogger(__name__)


class ServerCount:
    """The server's /tokenize. Whether it has one is learnt at the first count: a server without
    it (404, 405, 501, or an answer without a "count") is not asked again."""

    def __init__(self, client: Client, model: str | None, wait: float) -> None:
        self.client, self.model, self.wait = client, model, wait
        self.available: bool | None = None  # not known until asked

    async def count(self, messages: list[dict], tools: list[dict] | None,
                    tool_instructions: str | None = None) -> int | None:
        """The count, or None when the server cannot count. ModelUnavailable when it is down.
        `tool_instructions` is sent as the chat request sends it (`openclaw serve` reads it)."""
        if self.available is False:
            return None
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
            if tool_instructions is not None:
                body["tool_instructions"] = tool_instructions
        try:
            answer = await self.client.post_json(f"{self.client.root}/tokenize", body, wait=self.wait)
        except ServerRefused as exc:
            if self.available:  # it counted before: this prompt is the problem, not the server
                raise
            return self._unavailable(f"it answered {exc}")
        count = answer.get("count") if isinstance(answer, dict) else None
        if not isinstance(count, int) or isinstance(count, bool):
            return self._unavailable('its answer has no "count"')
        if self.available is None:
            log.info("token counts come from %s/tokenize", self.client.shown_root)
        self.available = True
        return count

    def _unavailable(self, why: str) -> None:
        log.info("%s/tokenize does not count chat messages (%s): counting otherwise",
                 self.client.shown_root, why)
        self.available = False
        return None


class LocalCount:
    """The model's tokenizer and chat template from a local Hugging Face folder, read with the
    engine's own (the same safe encoding the local engine counts with)."""

    def __init__(self, folder: Path) -> None:
        from engine.chat import ChatFormatter
        from engine.chat_count import MessageCounter
        from engine.tokenizer import Tokenizer

        self.formatter = ChatFormatter(Tokenizer.from_hf_folder(folder))
        self.messages = MessageCounter(self.formatter)

    def count(self, messages: list[dict], tools: list[dict] | None,
              tool_instructions: str | None = None) -> int:
        return len(self.formatter.encode(messages, tools, tool_instructions=tool_instructions))

    def count_message(self, message: dict, after: dict) -> int:
        return self.messages.count(message, after)


class UsageEstimate:
    """Tokens from the prompt's size (its JSON, in characters) at the rate the server's usage
    reports showed lately, the highest of them: an estimate on the high side compacts a little
    early, one on the low side would send a prompt over the context. Before any report, 1 token
    per 2 characters (English runs near 1 per 4; other scripts can come near 1 per 1)."""

    START_RATE = 0.5
    MARGIN = 1.1
    KEPT = 8  # reports the rate is taken from

    def __init__(self) -> None:
        self.rates: deque[float] = deque(maxlen=self.KEPT)

    def count(self, messages: list[dict], tools: list[dict] | None) -> int:
        rate = max(self.rates) * self.MARGIN if self.rates else self.START_RATE
        return math.ceil(_size(messages, tools) * rate)

    def observe(self, messages: list[dict], tools: list[dict] | None, prompt_tokens: int) -> None:
        """What the server said a prompt cost."""
        if prompt_tokens > 0:
            self.rates.append(prompt_tokens / max(_size(messages, tools), 1))


def _size(messages: list[dict], tools: list[dict] | None) -> int:
    return len(json.dumps(messages, ensure_ascii=False)) + (
        len(json.dumps(tools, ensure_ascii=False)) if tools else 0)
