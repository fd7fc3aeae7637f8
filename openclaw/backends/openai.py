"""The agent's model on any OpenAI-compatible server (vLLM, SGLang, Ollama, llama-server,
`openclaw serve`): streamed chat completions with the agent's tools, token counts as exact as the
server allows (counting.py), the context length the server states, and failures that say whether
the turn should wait for the server (ModelUnavailable) or give up (http.ServerRefused)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from engine import SamplingParams
from openclaw import systemd
from openclaw.agent.model import ModelOutput, ModelUnavailable
from openclaw.backends import optional_fields, server_stats
from openclaw.backends.counting import LocalCount, ServerCount, UsageEstimate
from openclaw.backends.http import Client, ServerRefused, describe
from openclaw.backends.remembered import Learnt, ServerMemory
from openclaw.backends.stream import Completion, Deadline, events
from openclaw.config import OpenAIEngineConfig

log = logging.getLogger(__name__)

START_RETRY_FIRST_S = 1.0  # between looks at a server not up yet when the daemon starts,
START_RETRY_MAX_S = 30.0  # doubling up to this
START_LOG_EVERY_S = 60.0
START_EXTENSION_MARGIN_S = 30.0  # asked of systemd beyond the next look's longest wait


class OpenAIBackend:
    """One server, one model. Build it with `await OpenAIBackend.open(config)`."""

    def __init__(self, config: OpenAIEngineConfig, stopping: asyncio.Event | None = None,
                 memory: ServerMemory | None = None) -> None:
        self.config = config
        self.memory = memory  # what this server said before, kept across starts
        self.model = config.model  # the server's name for it; found at open when unset
        self.max_model_len = config.context_length or 0  # known at open
        self.client = Client(config.url, config.api_key.get() if config.api_key else None,
                             connect_timeout=config.connect_timeout, retries=config.retries,
                             stopping=stopping)
        self.server_count = ServerCount(self.client, self.model, config.first_token_timeout)
        self.local_count: LocalCount | None = None
        self.estimate = UsageEstimate()
        self._ids = itertools.count()
        self._running: dict[str, aiohttp.ClientResponse | None] = {}  # None: not answered yet
        self._aborted: set[str] = set()
        self.refused_fields: set[str] = set()  # what this server does not take (optional_fields)
        self._counters = {"generated_tokens": 0, "prompt_tokens": 0, "prefix_cache_hits": 0,
                          "requests": 0, "requests_unavailable": 0}
        self.server_load: dict[str, float] = {}  # what the server's /metrics states
        self._following: asyncio.Task | None = None

    @classmethod
    async def open(cls, config: OpenAIEngineConfig, stopping: asyncio.Event | None = None,
                   memory: ServerMemory | None = None) -> OpenAIBackend:
        """The backend, with the model and its context length known: from the server's
        /v1/models (then kept in `memory`); while the server is down, from the config or else
        from `memory`; with neither, the server is waited for (with backoff, telling systemd the
        start goes on) until `stopping` is set (then ModelUnavailable). ValueError for what the
        config must fix: a model the server does not serve, a context length no one states, a
        tokenizer folder that is not one."""
        backend = cls(config, stopping, memory)
        try:
            if config.tokenizer is not None:
                backend.local_count = await asyncio.to_thread(LocalCount, config.tokenizer)
            await backend._discover()
        except BaseException:
            await backend.close()
            raise
        backend._following = asyncio.create_task(
            server_stats.follow(backend.client, backend.server_load), name="model server's load")
        return backend

    async def _discover(self) -> None:
        cfg, where = self.config, self.client.shown
        waited, said = 0, -START_LOG_EVERY_S
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            try:
                listing = await self.client.get_json("/models", wait=cfg.first_token_timeout,
                                                     retries=0)
                break
            except ServerRefused as exc:  # a wrong URL or key: waiting would not help
                raise ValueError(f"{where}/models answered {exc}: check url and "
                                 "api_key") from None
            except ModelUnavailable as exc:
                if known := self._known_without_server():  # all it needs: turns wait instead
                    self.model = self.server_count.model = known.model
                    self.max_model_len = known.context_length
                    log.warning("the model's server is not reachable now (%s); starting with %s "
                                "(context %d tokens) as %s, and each message waits for the "
                                "server", exc, known.model, known.context_length,
                                "configured" if cfg.model and cfg.context_length else
                                "it said last time")
                    return
                delay = min(START_RETRY_FIRST_S * 2.0 ** waited, START_RETRY_MAX_S)
                waiting = f"waiting for the model's server {where} ({exc})"
                # Type=notify: the start's timeout is pushed past the next look's end.
                systemd.extend_timeout(delay + cfg.connect_timeout + cfg.first_token_timeout
                                       + START_EXTENSION_MARGIN_S)
                systemd.status(waiting)
                if loop.time() - said >= START_LOG_EVERY_S:
                    said = loop.time()
                    log.warning("%s; it must say the model's context length once, or set "
                                "engine.context_length and engine.model", waiting)
            waited += 1
            if await self.client.stopped_within(delay):
                raise ModelUnavailable(f"stopped after waiting {loop.time() - started:.0f} s "
                                       f"for {where}")
        self.choose_model(listing)
        if waited:
            systemd.status(f"the model's server {where} answers")
        if self.memory is not None:
            self.memory.remember(cfg.url, self.model, self.max_model_len)

    def _known_without_server(self) -> Learnt | None:
        """The model and its context length as the config sets them, else as the server said
        them before (for the model the config names, if it names one)."""
        cfg = self.config
        if cfg.model and cfg.context_length:
            return Learnt(cfg.model, cfg.context_length)
        learnt = self.memory.recall(cfg.url, cfg.model) if self.memory is not None else None
        if learnt is None:
            return None
        return Learnt(learnt.model, cfg.context_length or learnt.context_length)

    def choose_model(self, listing: Any) -> None:
        """The model and its context length from a /v1/models answer."""
        cfg, where = self.config, self.client.shown
        entries = [e for e in (listing.get("data") if isinstance(listing, dict) else None) or []
                   if isinstance(e, dict) and isinstance(e.get("id"), str)]
        names = [e["id"] for e in entries]
        if self.model is None:
            if len(names) != 1:
                raise ValueError(f"model is unset and {where} serves "
                                 f"{', '.join(names) if names else 'no model'}: set model to "
                                 "the one to use")
            self.model = self.server_count.model = names[0]
        entry = next((e for e in entries if e["id"] in (self.model, f"{self.model}:latest")), None)
        if entry is None:
            raise ValueError(f'model "{self.model}" is not served by {where}, which serves '
                             f"{', '.join(names) if names else 'no model'}")
        stated = entry.get("max_model_len")
        stated = stated if isinstance(stated, int) and stated > 0 else None
        if cfg.context_length is None and stated is None:
            raise ValueError(f"{where} does not state the context length of {self.model} (no "
                             "max_model_len in /v1/models): set context_length")
        if cfg.context_length and stated and cfg.context_length > stated:
            log.warning("engine.context_length is %d, but %s serves %s with %d", cfg.context_length,
                        where, self.model, stated)
        self.max_model_len = cfg.context_length or stated
        log.info("the model is %s on %s (context %d tokens)", self.model, where,
                 self.max_model_len)

    async def close(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        await self.client.close()

    # ---- ChatModel ------------------------------------------------------------------------

    @property
    def fixed_counts(self) -> bool:
        """Counted by a tokenizer (the server's /tokenize, else a local one), not estimated from
        usage reports (which change the estimate as they come): see ChatModel.fixed_counts."""
        available = self.server_count.available
        return available is True or (available is False and self.local_count is not None)

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None,
                         tool_instructions: str | None = None) -> int:
        """As the server counts (`openclaw serve` with the tool instructions, where set), else
        as the local tokenizer does, else estimated (a server's own tool prompt, not ours)."""
        if "tool_instructions" in self.refused_fields:
            tool_instructions = None  # this server renders its own tool prompt
        count = await self.server_count.count(messages, tools, tool_instructions)
        if count is not None:
            return count
        if self.local_count is not None:
            return self.local_count.count(messages, tools, tool_instructions)
        return self.estimate.count(messages, tools)

    def count_message(self, message: dict, after: dict) -> int | None:
        """The tokens `message` adds after `after`, by the local tokenizer when it is what counts
        (the server has no /tokenize); None otherwise: the agent asks count_chat."""
        if self.server_count.available is False and self.local_count is not None:
            return self.local_count.count_message(message, after)
        return None

    async def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                       request_id: str | None = None, *, tools: list[dict] | None = None,
                       priority: int = 0, cache_salt: str | None = None,
                       tool_instructions: str | None = None) -> AsyncIterator[ModelOutput]:
        """Stream the answer. `priority` is the local engine's alone: not sent. Cancelling (or
        leaving the loop) closes the connection, which is how a server hears of an abort."""
        cfg, where = self.config, self.client.shown
        rid = request_id or f"req-{next(self._ids)}"
        body = self.chat_body(prompt, params or SamplingParams(), tools, cache_salt,
                              tool_instructions)
        self._counters["requests"] += 1
        completion = Completion()
        prompt_tokens = self.estimate.count(prompt, tools)  # until the usage says
        answer = deadline = None
        self._running[rid] = None  # from now on, an abort() is heard
        try:
            answer = await self._post_chat(body, rid)
            self._running[rid] = answer
            if rid in self._aborted:  # aborted while the request waited for its answer
                answer.close()
            # From the answer's start (most servers start it at once, then stream the tokens).
            deadline = Deadline(cfg.first_token_timeout, cfg.idle_timeout)
            async for chunk in events(answer, deadline):
                delta, token = completion.add(chunk)
                if token:
                    deadline.token()
                if delta:
                    yield ModelOutput(delta, completion.text, prompt_tokens, completion.tokens)
        except TimeoutError:
            self._counters["requests_unavailable"] += 1
            raise ModelUnavailable(
                f"{where} sent nothing for {cfg.idle_timeout:g} s in the middle of an answer"
                if deadline is not None and deadline.started else
                f"{where} sent no first token in {cfg.first_token_timeout:g} s") from None
        except aiohttp.ClientError as exc:
            if rid not in self._aborted:
                self._counters["requests_unavailable"] += 1
                raise ModelUnavailable(f"{where}: the answer broke off: "
                                       f"{self.client.scrub(describe(exc))}") from None
        except ModelUnavailable:
            self._counters["requests_unavailable"] += 1
            raise
        finally:
            self._running.pop(rid, None)
            aborted = rid in self._aborted
            self._aborted.discard(rid)
            if answer is not None:
                answer.close()  # not back to the pool: a cut stream's connection is spent
        if aborted:  # however the closed stream ended: an error, or an end read first
            completion.finish_reason = "abort"
        elif not completion.ended:
            raise ModelUnavailable(f"{where}: the answer ended before it was complete")
        prompt_tokens, completion_tokens = self._account(prompt, tools, completion, prompt_tokens)
        calls = completion.calls_text()
        completion.text += calls
        yield ModelOutput(calls, completion.text, prompt_tokens, completion_tokens, finished=True,
                          finish_reason="abort" if aborted else completion.reason)

    async def _post_chat(self, body: dict[str, Any], rid: str) -> aiohttp.ClientResponse:
        """The streamed answer's start. A refusal naming fields a request can do without
        (optional_fields) has the request sent again without them, once per field; those the
        server then took it without are not sent to this server again (said once)."""
        dropped: dict[str, ServerRefused] = {}
        while True:
            try:
                answer = await self.client.request(
                    "POST", f"{self.client.url}/chat/completions", body,
                    headers={"X-Request-Id": rid}, wait=self.config.first_token_timeout)
            except ServerRefused as exc:
                fields = [f for f in optional_fields.named(exc, body) if f not in dropped]
                if not fields:
                    raise
                dropped.update(dict.fromkeys(fields, exc))
                body = optional_fields.without(body, fields)
                continue
            for field, exc in dropped.items():
                if field not in self.refused_fields:
                    self.refused_fields.add(field)
                    log.warning("%s refuses the request field %s (%s): not sent to it again%s",
                                self.client.shown, field, exc,
                                f"; {optional_fields.COST[field]}" if field in optional_fields.COST
                                else "")
            return answer

    def chat_body(self, prompt: list[dict], params: SamplingParams, tools: list[dict] | None,
                  cache_salt: str | None, tool_instructions: str | None = None) -> dict[str, Any]:
        """The request: the agent's sampling settings in OpenAI's names (vLLM's for the rest,
        sent only when set), and the user's id as `user` and vLLM's `cache_salt`, so a shared
        server keeps each user's cached prefixes apart. `tool_instructions` (with tools only):
        an extra field `openclaw serve` renders the tools' section with; others ignore it."""
        body: dict[str, Any] = {
            "model": self.model, "messages": prompt, "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature, "top_p": params.top_p}
        if params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if tools and params.tool_choice != "none":
            body["tools"], body["tool_choice"] = tools, params.tool_choice
            if tool_instructions is not None:
                body["tool_instructions"] = tool_instructions
        extras = {"stop": params.stop, "seed": params.seed, "top_k": params.top_k or None,
                  "min_p": params.min_p or None, "presence_penalty": params.presence_penalty or None,
                  "frequency_penalty": params.frequency_penalty or None,
                  "repetition_penalty": None if params.repetition_penalty == 1.0
                  else params.repetition_penalty}
        body.update({key: value for key, value in extras.items() if value not in (None, [])})
        if cache_salt:
            body["user"] = body["cache_salt"] = cache_salt
        return optional_fields.without(body, self.refused_fields)

    def _account(self, prompt: list[dict], tools: list[dict] | None, completion: Completion,
                 estimated: int) -> tuple[int, int]:
        """(prompt, completion) tokens of a finished answer: the server's usage when it sent it,
        which also sets the rate of the estimate; else the estimate and the chunks counted."""
        usage = completion.usage or {}
        prompt_tokens, completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt_tokens, int):
            self.estimate.observe(prompt, tools, prompt_tokens)
        else:
            prompt_tokens = estimated
        if not isinstance(completion_tokens, int):
            completion_tokens = completion.tokens
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        self._counters["prompt_tokens"] += prompt_tokens
        self._counters["generated_tokens"] += completion_tokens
        self._counters["prefix_cache_hits"] += cached if isinstance(cached, int) else 0
        return prompt_tokens, completion_tokens

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)
            answer = self._running[request_id]
            if answer is not None:  # else closed as soon as it comes
                answer.close()

    def stats(self) -> dict[str, Any]:
        """The server's load as its /metrics states it (else this daemon's requests running, and
        no KV share known), and the tokens its usage reports (with the prompt tokens it served
        from its prefix cache, where it says)."""
        c, load = self._counters, self.server_load
        return {"model": self.model, "device": self.client.shown, "backend": "openai",
                "num_running": int(load.get("num_running", len(self._running))),
                "num_waiting": int(load.get("num_waiting", 0)),
                "kv_usage": load.get("kv_usage", 0.0),
                "generated_tokens": c["generated_tokens"],
                "prefix_cache_queries": c["prompt_tokens"], "prefix_cache_hits": c["prefix_cache_hits"],
                "requests": c["requests"], "requests_unavailable": c["requests_unavailable"],
                # The KV pool, where the server states it (`openclaw serve` does): not ours to guess.
                **{k: load[k] for k in ("kv_bytes_per_token", "kv_pool_tokens", "kv_blocks") if k in load}}
