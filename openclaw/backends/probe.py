"""`openclaw doctor`'s look at a model server: reachable, the model listed, its context length,
how prompts will be counted, and tool calls (one call constrained with tool_choice "required").
Each check is (mark, what, how to fix): True ✓, False ✗, "warn" ⚠."""

from __future__ import annotations

from contextlib import aclosing
from typing import Literal

from engine import SamplingParams
from engine.tool_parser import parse_tool_calls
from openclaw.agent.model import ModelUnavailable
from openclaw.backends.http import ServerRefused
from openclaw.backends.openai import OpenAIBackend
from openclaw.backends.stream import StreamError
from openclaw.config import OpenAIEngineConfig

Check = tuple[bool | Literal["warn"], str, str]

PROBE_WAIT_S = 10.0  # for each answer; a first token may take longer on a busy server
PROBE_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "The current time in a timezone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
TOOLS_FIX = ("serve the model with tool calls on (vLLM: --enable-auto-tool-choice "
             "--tool-call-parser hermes; llama-server: --jinja), or use a model that makes them")


async def check_server(config: OpenAIEngineConfig, tool_probe: bool = True) -> list[Check]:
    """The checks, stopping at the first that fails (the next ones need it)."""
    try:
        backend = OpenAIBackend(config)
    except ValueError as exc:
        return [(False, f"model server: {exc}", "fix engine.url or engine.api_key")]
    try:
        return await _checks(backend, config, tool_probe)
    finally:
        await backend.close()


async def _checks(backend: OpenAIBackend, config: OpenAIEngineConfig, tool_probe: bool) -> list[Check]:
    url = backend.client.shown
    try:
        listing = await backend.client.get_json("/models", wait=PROBE_WAIT_S, retries=0)
    except ModelUnavailable as exc:
        return [(False, f"model server: not reachable: {exc}",
                 "start the server, or fix engine.url (the API's base, e.g. http://HOST:8000/v1)")]
    except ServerRefused as exc:
        fix = ("check engine.api_key" if exc.status in (401, 403) else
               "check engine.url (the API's base, e.g. http://HOST:8000/v1)")
        return [(False, f"model server: {url}/models answered {exc}", fix)]
    checks: list[Check] = [(True, f"model server: {url} answers", "")]
    try:
        backend.choose_model(listing)
    except ValueError as exc:
        return [*checks, (False, f"model: {exc}", "set engine.model (and engine.context_length "
                                                  "where the server does not state it)")]
    source = "engine.context_length" if config.context_length else "the server's max_model_len"
    checks.append((True, f"model: {backend.model}, context {backend.max_model_len} tokens "
                         f"({source})", ""))
    checks.append(await _counting(backend, config))
    if tool_probe:
        checks.append(await _tool_call(backend))
    return checks


async def _counting(backend: OpenAIBackend, config: OpenAIEngineConfig) -> Check:
    try:
        await backend.count_chat([{"role": "user", "content": "hello"}])
    except (ModelUnavailable, ServerRefused) as exc:
        return False, f"token counts: {backend.client.shown} failed to count: {exc}", "check the server"
    except (OSError, ValueError) as exc:  # the tokenizer folder
        return False, f"token counts: {exc}", "fix engine.tokenizer (a Hugging Face folder)"
    if backend.server_count.available:
        return True, "token counts: exact, from the server's /tokenize", ""
    if backend.local_count is not None:
        return True, f"token counts: exact, from the tokenizer in {config.tokenizer}", ""
    return ("warn", "token counts: estimated from the server's usage reports (it has no /tokenize)",
            "set engine.tokenizer to a local copy of the model's folder (tokenizer.json) for "
            "exact counts")


async def _tool_call(backend: OpenAIBackend) -> Check:
    params = SamplingParams(temperature=0.0, max_tokens=128, tool_choice="required")
    prompt = [{"role": "user", "content": "What time is it in UTC? Use the tool."}]
    text = ""
    try:
        async with aclosing(backend.generate(prompt, params, tools=[PROBE_TOOL])) as stream:
            async for out in stream:
                text = out.text
    except ServerRefused as exc:
        return False, f"tool calls: the server refused a call with tool_choice required: {exc}", \
            TOOLS_FIX
    except (ModelUnavailable, StreamError) as exc:
        return False, f"tool calls: the probe failed: {exc}", "check the server's log"
    calls = parse_tool_calls(text).tool_calls
    if calls and calls[0].name == PROBE_TOOL["function"]["name"]:
        return True, "tool calls: the server answered a constrained probe with a call", ""
    return ("warn", f"tool calls: asked for a call (tool_choice required), the server answered "
            f"{text[:80]!r}", TOOLS_FIX)
