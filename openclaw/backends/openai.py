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
from openclaw.agent.model import ModelOutput, ModelUnavailable
from openclaw.backends import server_stats
from openclaw.backends.counting import LocalCount, ServerCount, UsageEstimate
from openclaw.backends.http import Client, ServerRefused, describe
from openclaw.backends.stream import Completion, Deadline, events
from openclaw.config import OpenAIEngineConfig

log = logging.getLogger(__name__)

START_RETRY_MAX_S = 30.0  # between looks at a server not up yet when the daemon starts
START_LOG_EVERY_S = 60.0


class OpenAIBackend:
    """One server, one model. Build it with `await OpenAIBackend.open(config)`."""

    def __init__(self, config: OpenAIEngineConfig) -> None:
        self.config = config
        self.model = config.model  # the server's name for it; found at open when unset
        self.max_model_len = config.context_length or 0  # known at open
        self.client = Client(config.url, config.api_key.get() if config.api_key else None,
                             connect_timeout=config.connect_timeout, retries=config.retries)
        self.server_count = ServerCount(self.client, self.model, config.first_token_timeout)
        self.local_count: LocalCount | None = None
        self.estimate = UsageEstimate()
        self._ids = itertools.count()
        self._running: dict[str, aiohttp.ClientResponse] = {}
        self._aborted: set[str] = set()
        self._counters = {"generated_tokens": 0, "prompt_tokens": 0, "prefix_cache_hits": 0,
                          "requests": 0, "requests_unavailable": 0}
        self.server_load: dict[str, float] = {}  # what the server's /metrics states
        self._following: asyncio.Task | None = None

    @classmethod
    async def open(cls, config: OpenAIEngineConfig,
                   stopping: asyncio.Event | None = None) -> OpenAIBackend:
        """The backend, with the model and its context length known: from the config, else from
        the server's /v1/models, waited for (with backoff) while it is not up, until `stopping`
        is set (then ModelUnavailable). ValueError for what the config must fix: a model the
        server does not serve, a context length no one states, a tokenizer folder that is not
        one."""
        backend = cls(config)
        try:
            if config.tokenizer is not None:
                backend.local_count = await asyncio.to_thread(LocalCount, config.tokenizer)
            await backend._discover(stopping)
        except BaseException:
            await backend.close()
            raise
        backend._following = asyncio.create_task(
            server_stats.follow(backend.client, backend.server_load), name="model server's load")
        return backend

    async def _discover(self, stopping: asyncio.Event | None) -> None:
        cfg = self.config
        waited, said = 0, -START_LOG_EVERY_S
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            try:
                listing = await self.client.get_json("/models", wait=cfg.first_token_timeout,
                                                     retries=0)
                break
            except ServerRefused as exc:  # a wrong URL or key: waiting would not help
                raise ValueError(f"{cfg.url}/models answered {exc}: check url and api_key") from None
            except ModelUnavailable as exc:
                if self.model and cfg.context_length:  # all it needs is known: turns wait instead
                    log.warning("the model's server is not reachable now (%s); each message "
                                "waits for it", exc)
                    return
                if loop.time() - said >= START_LOG_EVERY_S:
                    said = loop.time()
                    log.warning("waiting for the model's server (%s); it must say the model's "
                                "context length, or set engine.context_length and engine.model",
                                exc)
            delay = min(2.0 ** waited, START_RETRY_MAX_S)
            waited += 1
            if stopping is None:
                await asyncio.sleep(delay)
            else:
                try:
                    await asyncio.wait_for(stopping.wait(), delay)
                    raise ModelUnavailable(f"stopped after waiting {loop.time() - started:.0f} s "
                                           f"for {cfg.url}")
                except TimeoutError:
                    pass
        self.choose_model(listing)

    def choose_model(self, listing: Any) -> None:
        """The model and its context length from a /v1/models answer."""
        cfg = self.config
        entries = [e for e in (listing.get("data") if isinstance(listing, dict) else None) or []
                   if isinstance(e, dict) and isinstance(e.get("id"), str)]
        names = [e["id"] for e in entries]
        if self.model is None:
            if len(names) != 1:
                raise ValueError(f"model is unset and {cfg.url} serves "
                                 f"{', '.join(names) if names else 'no model'}: set model to "
                                 "the one to use")
            self.model = self.server_count.model = names[0]
        entry = next((e for e in entries if e["id"] in (self.model, f"{self.model}:latest")), None)
        if entry is None:
            raise ValueError(f'model "{self.model}" is not served by {cfg.url}, which serves '
                             f"{', '.join(names) if names else 'no model'}")
        stated = entry.get("max_model_len")
        stated = stated if isinstance(stated, int) and stated > 0 else None
        if cfg.context_length is None and stated is None:
            raise ValueError(f"{cfg.url} does not state the context length of {self.model} (no "
                             "max_model_len in /v1/models): set context_length")
        if cfg.context_length and stated and cfg.context_length > stated:
            log.warning("engine.context_length is %d, but %s serves %s with %d", cfg.context_length,
                        cfg.url, self.model, stated)
        self.max_model_len = cfg.context_length or stated
        log.info("the model is %s on %s (context %d tokens)", self.model, cfg.url,
                 self.max_model_len)

    async def close(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        await self.client.close()

    # ---- ChatModel ------------------------------------------------------------------------

    async def count_chat(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        count = await self.server_count.count(messages, tools)
        if count is not None:
            return count
        if self.local_count is not None:
            return self.local_count.count(messages, tools)
        return self.estimate.count(messages, tools)

    async def generate(self, prompt: list[dict], params: SamplingParams | None = None,
                       request_id: str | None = None, *, tools: list[dict] | None = None,
                       priority: int = 0, cache_salt: str | None = None
                       ) -> AsyncIterator[ModelOutput]:
        """Stream the answer. `priority` is the local engine's alone: not sent. Cancelling (or
        leaving the loop) closes the connection, which is how a server hears of an abort."""
        cfg = self.config
        rid = request_id or f"req-{next(self._ids)}"
        body = self.chat_body(prompt, params or SamplingParams(), tools, cache_salt)
        self._counters["requests"] += 1
        completion = Completion()
        prompt_tokens = self.estimate.count(prompt, tools)  # until the usage says
        answer = deadline = None
        try:
            answer = await self.client.request(
                "POST", f"{self.client.url}/chat/completions", body, headers={"X-Request-Id": rid},
                wait=cfg.first_token_timeout)
            self._running[rid] = answer
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
                f"{cfg.url} sent nothing for {cfg.idle_timeout:g} s in the middle of an answer"
                if deadline is not None and deadline.started else
                f"{cfg.url} sent no first token in {cfg.first_token_timeout:g} s") from None
        except aiohttp.ClientError as exc:
            if rid in self._aborted:
                completion.finish_reason = "abort"
            else:
                self._counters["requests_unavailable"] += 1
                raise ModelUnavailable(f"{cfg.url}: the answer broke off: {describe(exc)}") from None
        except ModelUnavailable:
            self._counters["requests_unavailable"] += 1
            raise
        finally:
            self._running.pop(rid, None)
            self._aborted.discard(rid)
            if answer is not None:
                answer.close()  # not back to the pool: a cut stream's connection is spent
        if not completion.ended:
            raise ModelUnavailable(f"{cfg.url}: the answer ended before it was complete")
        prompt_tokens, completion_tokens = self._account(prompt, tools, completion, prompt_tokens)
        calls = completion.calls_text()
        completion.text += calls
        yield ModelOutput(calls, completion.text, prompt_tokens, completion_tokens, finished=True,
                          finish_reason="abort" if completion.finish_reason == "abort"
                          else completion.reason)

    def chat_body(self, prompt: list[dict], params: SamplingParams, tools: list[dict] | None,
                  cache_salt: str | None) -> dict[str, Any]:
        """The request: the agent's sampling settings in OpenAI's names (vLLM's for the rest,
        sent only when set), and the user's id as `user` and vLLM's `cache_salt`, so a shared
        server keeps each user's cached prefixes apart."""
        body: dict[str, Any] = {
            "model": self.model, "messages": prompt, "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature, "top_p": params.top_p}
        if params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if tools and params.tool_choice != "none":
            body["tools"], body["tool_choice"] = tools, params.tool_choice
        extras = {"stop": params.stop, "seed": params.seed, "top_k": params.top_k or None,
                  "min_p": params.min_p or None, "presence_penalty": params.presence_penalty or None,
                  "frequency_penalty": params.frequency_penalty or None,
                  "repetition_penalty": None if params.repetition_penalty == 1.0
                  else params.repetition_penalty}
        body.update({key: value for key, value in extras.items() if value not in (None, [])})
        if cache_salt:
            body["user"] = body["cache_salt"] = cache_salt
        return body

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
        answer = self._running.get(request_id)
        if answer is not None:
            self._aborted.add(request_id)
            answer.close()

    def stats(self) -> dict[str, Any]:
        """The server's load as its /metrics states it (else this daemon's requests running, and
        no KV share known), and the tokens its usage reports (with the prompt tokens it served
        from its prefix cache, where it says)."""
        c, load = self._counters, self.server_load
        return {"model": self.model, "device": self.config.url, "backend": "openai",
                "num_running": int(load.get("num_running", len(self._running))),
                "num_waiting": int(load.get("num_waiting", 0)),
                "kv_usage": load.get("kv_usage", 0.0),
                "generated_tokens": c["generated_tokens"],
                "prefix_cache_queries": c["prompt_tokens"], "prefix_cache_hits": c["prefix_cache_hits"],
                "requests": c["requests"], "requests_unavailable": c["requests_unavailable"]}
