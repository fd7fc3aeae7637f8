"""A deterministic stand-in for the engine (the ChatModel interface) for tests that need a specific
model behaviour: a given tool call, a slow stream to /stop, a failure. Each reply is computed by a
function of the prompt messages, so tests can assert on what the model was shown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from engine import SamplingParams
from openclaw.agent.model import ModelOutput

Reply = Callable[[list[dict]], str]


class ScriptedModel:
    fixed_counts = True  # encode_chat is a function of the messages alone
    def __init__(self, reply: Reply, *, max_model_len: int = 4096, chunk: int = 4,
                 delay: float = 0.0) -> None:
        self.reply = reply
        self.max_model_len = max_model_len
        self.chunk, self.delay = chunk, delay
        self.prompts: list[list[dict]] = []  # every prompt it was given, in order
        self.cache_salts: list[str | None] = []  # and the cache_salt of each
        self.tool_instructions: list[str | None] = []  # and the tool_instructions of each
        self.spent: list[tuple[int, int]] = []  # (prompt, output) tokens each call streamed
        self.aborted: list[str] = []
        self.gate: asyncio.Event | None = None  # when set, streams wait for it after one chunk
        self.generated = 0

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """One 'token' per word plus a few per message: deterministic and roughly proportional."""
        words = sum(len(str(m.get("content", "")).split()) + 4 for m in messages)
        return [0] * (words + (20 * len(tools) if tools else 0))

    def prompt_tokens(self, prompt: list[dict], tools: list[dict] | None) -> int:
        """The prompt tokens a call reports (its encode_chat's count)."""
        return len(self.encode_chat(prompt, tools))

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None,
                         tool_instructions: str | None = None) -> int:
        return len(self.encode_chat(messages, tools))

    async def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                       request_id: str | None = None, *, tools: list[dict] | None = None,
                       priority: int = 0, cache_salt: str | None = None,
                       tool_instructions: str | None = None) -> AsyncIterator[ModelOutput]:
        self.prompts.append(prompt)
        self.cache_salts.append(cache_salt)
        self.tool_instructions.append(tool_instructions)
        text = self.reply(prompt)
        prompt_tokens = self.prompt_tokens(prompt, tools)
        sent = ""
        try:
            for start in range(0, max(len(text), 1), self.chunk):
                piece = text[start:start + self.chunk]
                sent += piece
                done = start + self.chunk >= len(text)
                self.generated += 1
                yield ModelOutput(piece, sent, prompt_tokens, len(sent), finished=done,
                                  finish_reason="stop" if done else None)
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.gate is not None:
                    await self.gate.wait()
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id or "r")
            raise
        finally:
            if sent:
                self.spent.append((prompt_tokens, len(sent)))

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> dict[str, Any]:
        return {"model": "scripted", "device": "cpu", "num_running": 0, "num_waiting": 0,
                "kv_usage": 0.0, "generated_tokens": self.generated, "prefix_cache_queries": 0,
                "prefix_cache_hits": 0}

    async def close(self) -> None:  # as a backend the daemon made
        pass


def last_user(messages: list[dict]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def echo(messages: list[dict]) -> str:
    return "re: " + last_user(messages)


def history_echo(messages: list[dict]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return f"you said {len(users)} things: " + " | ".join(users)
