"""Driving an LLMEngine by hand in tests: requests in, steps until they finish."""

from __future__ import annotations

from engine.engine_core import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams


def run_requests(engine: LLMEngine, prompt: list[int], params: list[SamplingParams],
                 tools: list[dict] | None = None) -> list[RequestOutput]:
    """One request per params (ids r0, r1, ...) on the same prompt, stepped until every request
    of the engine has finished; the final outputs of these, in order."""
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", prompt, p, tools=tools)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return [final[f"r{i}"] for i in range(len(params))]
