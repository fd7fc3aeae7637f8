"""A prompt pair (system prompt, tool-instruction template) run over the evaluation set through the
real daemon in this process: a daemon of its own on a scratch data_dir, the four evaluation skills
enabled, one model step per prompt (`[agent] max_steps = 1`), each prompt the owner's message in
a fresh conversation. The model is the caller's, opened once and shared by every run."""

from __future__ import annotations

import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import SamplingParams
from openclaw.agent.model import ChatModel, ModelOutput
from openclaw.config import Config, load_config
from openclaw.daemon import Daemon
from openclaw.gateway.contract import Connector, InboundMessage
from openclaw.prompts.evalset import SKILLS, Case, Measures, Result, measure, score

DEFAULT_MAX_TOKENS = 96  # a reply's cap in the evaluation: the first step is what is scored


@dataclass(frozen=True)
class PromptPair:
    """What one run is answered with, and what the report calls it."""

    label: str  # "system=v4;tools=builtin"
    system: str
    tools: str | None  # None: the engine's built-in tool instructions


class EvalConnector(Connector):
    """The console as the evaluation's only channel (by default): what the daemon sends is kept,
    as (chat, text)."""

    max_message_len = 4096

    def __init__(self, name: str = "terminal") -> None:
        self.name = name
        self.sent: list[tuple[str, str]] = []
        self.handler = None

    async def start(self, handler) -> None:
        self.handler = handler

    async def stop(self) -> None:
        pass

    async def send_text(self, chat_id: str, text: str) -> str:
        self.sent.append((chat_id, text))
        return str(len(self.sent))

    async def typing(self, chat_id: str) -> None:
        pass

    async def edit_text(self, chat_id: str, message_id: str, text: str) -> None:
        pass


class RecordingModel:
    """The caller's model, with each call's last output kept for scoring, and every call made
    with the run's tool instructions (what the library's version would give the agent)."""

    def __init__(self, inner: ChatModel, tool_instructions: str | None = None) -> None:
        self.inner = inner
        self.tool_instructions = tool_instructions
        self.outputs: list[ModelOutput | None] = []

    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def fixed_counts(self) -> bool:
        return getattr(self.inner, "fixed_counts", False)

    def _extra(self) -> dict[str, Any]:
        # Passed on only when set: a model need not take what it is never given.
        return {} if self.tool_instructions is None else {"tool_instructions": self.tool_instructions}

    async def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                       request_id: str | None = None, *, tools: list[dict] | None = None,
                       priority: int = 0, cache_salt: str | None = None,
                       tool_instructions: str | None = None) -> AsyncIterator[ModelOutput]:
        last = None
        try:
            async with aclosing(self.inner.generate(prompt, params, request_id, tools=tools,
                                                    priority=priority, cache_salt=cache_salt,
                                                    **self._extra())) as stream:
                async for last in stream:
                    yield last
        finally:  # also when the agent stops reading (the loop guard ends a reply)
            self.outputs.append(last)

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None,
                         tool_instructions: str | None = None) -> int:
        return await self.inner.count_chat(messages, tools, **self._extra())

    def count_message(self, message: dict, after: dict) -> int | None:
        count = getattr(self.inner, "count_message", None)  # no tools: no instructions to pass
        return count(message, after) if count is not None else None

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()


def eval_config(base: Config, data_dir: Path, system_prompt: str,
                max_tokens: int = DEFAULT_MAX_TOKENS, **agent: Any) -> Config:
    """A daemon's config for the evaluation: a scratch data_dir, no admin port, no channel but
    the console, the evaluation's skills; `base`'s model, agent settings (with `system_prompt`,
    one step, replies capped at `max_tokens`, and `agent`'s overrides) and sandbox."""
    path = data_dir / "eval.toml"
    path.write_text(f'data_dir = "{data_dir}"\n[admin]\nenabled = false\n'
                    f"[skills]\nenabled = [{', '.join(f'{s!r}' for s in SKILLS)}]\n")
    config = load_config(path)
    settings = base.agent.model_copy(update={"system_prompt": system_prompt, "max_steps": 1,
                                             "reply_max_tokens": max_tokens, **agent})
    return config.model_copy(update={"engine": base.engine, "agent": settings,
                                     "sandbox": base.sandbox})


async def run_cases(base: Config, model: ChatModel, pair: PromptPair, cases: list[Case], *,
                    max_tokens: int = DEFAULT_MAX_TOKENS,
                    shown: Callable[[Result, str], None] | None = None,
                    **agent: Any) -> tuple[list[Result], dict[str, dict]]:
    """Each case's first model step under `pair`, scored, and the skills' argument schemas.
    `shown(result, reply)`: called after each case (for --show)."""
    with tempfile.TemporaryDirectory(prefix="openclaw-eval-") as tmp:
        config = eval_config(base, Path(tmp), pair.system, max_tokens, **agent)
        recording = RecordingModel(model, pair.tools)
        conn = EvalConnector()
        daemon = Daemon(config, model=recording, connectors=[conn])
        await daemon.start()
        try:
            schemas = {s["function"]["name"]: s["function"]["parameters"]
                       for s in daemon.gateway.agent.executor.registry.tool_specs()}
            results = []
            for n, case in enumerate(cases):
                for text in ("/new", case.prompt):
                    before, start = len(recording.outputs), time.perf_counter()
                    await conn.handler(InboundMessage("terminal", "local", "local",
                                                      f"eval{n}-{text[:4]}", text))
                    await daemon.gateway.wait_idle()
                out = recording.outputs[before] if len(recording.outputs) > before else None
                result = score(case, out.text if out is not None else None,
                               out.completion_tokens if out is not None else 0,
                               time.perf_counter() - start)
                results.append(result)
                if shown is not None:
                    shown(result, conn.sent[-1][1] if conn.sent else "")
        finally:
            await daemon.stop()
        return results, schemas


async def evaluate(base: Config, model: ChatModel, pairs: list[PromptPair], cases: list[Case],
                   *, max_tokens: int = DEFAULT_MAX_TOKENS,
                   shown: Callable[[Result, str], None] | None = None) -> list[Measures]:
    """The measures of each pair over the same cases on the same model, in order."""
    measured = []
    for pair in pairs:
        results, schemas = await run_cases(base, model, pair, cases, max_tokens=max_tokens,
                                           shown=shown)
        measured.append(measure(results, schemas))
    return measured
