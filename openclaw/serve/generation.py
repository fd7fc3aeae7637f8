"""Running a request's choices on the engine: the context check, the choices' outputs merged into
one stream, n choices sharing their prompt's cached blocks, and what their outputs say in
OpenAI's terms (usage, finish_reason, stop_reason)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openclaw.serve.errors import SERVER_ERROR, APIError, bad_request
from openclaw.serve.state import ServeState

if TYPE_CHECKING:
    from engine import RequestOutput, SamplingParams

@dataclass
class Job:
    """One engine request: a choice of one prompt."""

    prompt_ids: list[int]
    params: SamplingParams


def check_context(state: ServeState, prompt_len: int, max_tokens: int | None, param: str,
                  field: str = "max_tokens") -> None:
    """A 400 when the prompt and the tokens asked for do not fit the context, saying both;
    `field`: the request's name for the tokens asked for."""
    limit = state.max_model_len
    if max_tokens is None and prompt_len >= limit:
        raise bad_request(f"the prompt has {prompt_len} tokens and this model's context is {limit} "
                          "tokens: no room is left for an answer; shorten the prompt", param,
                          code="context_length_exceeded")
    if max_tokens is not None and prompt_len + max_tokens > limit:
        raise bad_request(f"the prompt has {prompt_len} tokens and {field} asks for {max_tokens} "
                          f"more: {prompt_len + max_tokens} tokens, over this model's context of "
                          f"{limit}; shorten the prompt or lower {field}", param,
                          code="context_length_exceeded")


# How the engine's refusals of a JSON constraint begin, and what the API calls those things.
STRUCTURED_NAMES = {"StructuredOutputs.json": "the schema",
                    "SamplingParams.structured_outputs": "a JSON response_format"}


def engine_error(exc: Exception) -> APIError:
    """What the engine raised for a request, as the client's error: a ValueError is a request it
    refused (400; one about the JSON constraint names response_format), anything else the
    engine's own failure (503)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):
        message = str(exc)
        if message.startswith(tuple(STRUCTURED_NAMES)):
            for engine_name, api_name in STRUCTURED_NAMES.items():
                message = message.replace(engine_name, api_name)
            return bad_request(f"response_format: {message}", "response_format")
        return bad_request(message)
    return APIError(503, f"the engine failed: {exc}", type=SERVER_ERROR, code="engine_error")


def aborted() -> APIError:
    return APIError(503, "the request was aborted in the engine (is the server shutting down?)",
                    type=SERVER_ERROR, code="aborted")


async def run_jobs(state: ServeState, jobs: list[Job], request_id: str, *,
                   tools: list[dict] | None = None,
                   cache_salt: str | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Every job's outputs as they come, with the job's index; an engine error is raised as an
    APIError. A job whose prompt an earlier job has starts once that one's first output came: the
    prompt's blocks are in the prefix cache by then, so it is served from there rather than
    computed again. Closing the iterator (a client gone), or the server's stop (ServeState.stop),
aborts the jobs still running."""
    queue: asyncio.Queue = asyncio.Queue()
    state.outputs.add(queue)
    first_output: dict[tuple[int, ...], asyncio.Event] = {}
    tasks = []
    for i, job in enumerate(jobs):
        key = tuple(job.prompt_ids)
        leader = first_output.get(key)
        started = None if leader is not None else first_output.setdefault(key, asyncio.Event())
        tasks.append(asyncio.create_task(_pump(
            state, i, job, f"{request_id}-{i}", queue, leader, started, tools, cache_salt)))
    try:
        running = len(jobs)
        while running:
            i, item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, Exception):
                raise engine_error(item)
            else:
                yield i, item
    finally:
        state.outputs.discard(queue)
        for task in tasks:  # a cancelled job's generate() aborts its engine request
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(state: ServeState, index: int, job: Job, request_id: str, queue: asyncio.Queue,
                leader: asyncio.Event | None, started: asyncio.Event | None,
                tools: list[dict] | None, cache_salt: str | None) -> None:
    try:
        if leader is not None:
            await leader.wait()
        async for out in state.llm.generate(job.prompt_ids, job.params, request_id, tools=tools,
                                            cache_salt=cache_salt):
            if started is not None:
                started.set()
            queue.put_nowait((index, out))
    except Exception as exc:
        queue.put_nowait((index, exc))
    finally:
        if started is not None:  # followers go on, and meet the same error if there was one
            started.set()
        queue.put_nowait((index, None))


def usage(prompt_tokens: int, finals: list[RequestOutput]) -> dict[str, Any]:
    """OpenAI's usage: the prompt counted once however many choices; cached_tokens is the most any
    choice had served by the prefix cache (with n > 1, the choices after the first)."""
    completion = sum(len(out.token_ids) for out in finals)
    cached = max((out.num_cached_tokens for out in finals), default=0)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def stop_reason(out: RequestOutput, stop_token_ids: list[int] | None) -> str | int | None:
    """vLLM's stop_reason: the stop string, or the request's own stop token, that ended the
    output; None for the model's end of turn."""
    reason = out.stop_reason
    return reason if isinstance(reason, str) or reason in (stop_token_ids or ()) else None


def finish_reason(out: RequestOutput, called: bool = False) -> str:
    if out.finish_reason == "abort":
        raise aborted()
    if called and out.finish_reason == "stop":
        return "tool_calls"
    return out.finish_reason or "stop"
