"""The step loop's core: requests in, one scheduled model step at a time, outputs out.

Single-threaded by design: LLM drives it directly and AsyncLLM from one worker thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from engine.block_manager import BlockManager, salt_key
from engine.chat import ChatFormatter
from engine.chat_count import MessageCounter
from engine.config import EngineConfig
from engine.constrained.json_schema import JsonConstraints, JsonMatcher
from engine.constrained.masks import ToolCallMatcher, ToolConstraints, constrains
from engine.detokenizer import IncrementalDetokenizer
from engine.loader import Checkpoint, open_checkpoint
from engine.logprobs import TokenLogprob
from engine.model_runner import ModelRunner
from engine.outputs import RequestMetrics, RequestOutput
from engine.sampler import make_generator
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.stats import TPOT_BUCKETS, TTFT_BUCKETS, Histogram

Prompt = str | list[int]


@dataclass(eq=False)
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer | None
    eos_ids: frozenset[int]
    metrics: RequestMetrics
    logprobs: list[TokenLogprob] | None = field(default=None)  # when the params ask


class LLMEngine:
    def __init__(self, config: EngineConfig, checkpoint: Checkpoint | None = None) -> None:
        """`checkpoint`: one already open (benchmarks build random-weight models in memory);
        otherwise config.model is opened."""
        self.config = config
        ckpt = checkpoint if checkpoint is not None else open_checkpoint(config.model)
        self._in_memory = checkpoint is not None
        self.model_config = ckpt.config
        self.tokenizer = ckpt.tokenizer
        self.max_model_len = (config.max_model_len or ckpt.context_length
                              or ckpt.config.max_position_embeddings)
        self.runner = ModelRunner(ckpt, config, self.max_model_len)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs,
                                   config.max_num_batched_tokens)
        self.chat_formatter = ChatFormatter(self.tokenizer) if self.tokenizer else None
        self.message_counter = MessageCounter(self.chat_formatter) if self.chat_formatter else None
        self._requests: dict[str, _Request] = {}
        # Tool-call constraints: the vocabulary's bytes are read on the first constrained request.
        self.tool_constraints = (ToolConstraints(self.tokenizer, self.model_config.vocab_size)
                                 if self.tokenizer else None)
        # JSON output: llguidance is imported by the first request that asks.
        self.json_constraints = (JsonConstraints(self.tokenizer, self.model_config.vocab_size)
                                 if self.tokenizer else None)
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0
        self.num_requests_finished = 0  # for any reason: stop, length or abort
        self.ttft = Histogram(TTFT_BUCKETS)  # arrival to the first output token
        self.tpot = Histogram(TPOT_BUCKETS)  # per output token after the first, at the finish
        torch.manual_seed(config.seed)  # the shared RNG of requests without a seed

    @property
    def device(self) -> torch.device:
        return self.runner.device

    # ---- requests ------------------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model folder has no tokenizer.json: pass token ids")
            ids = self.tokenizer.encode_prompt(prompt)
        else:
            ids = [int(t) for t in prompt]
        vocab = self.model_config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty")
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"the prompt has token ids outside the vocabulary [0, {vocab})")
        return ids

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None,
                    tool_instructions: str | None = None) -> list[int]:
        if self.chat_formatter is None:
            raise ValueError("this model has no tokenizer, so it cannot take chat messages")
        return self.chat_formatter.encode(messages, tools=tools,
                                          tool_instructions=tool_instructions)

    def count_message(self, message: dict, after: dict) -> int:
        """The tokens `message` adds to a prompt of `after` alone, as encode_chat counts them
        (engine.chat_count: without the template where it allows)."""
        if self.message_counter is None:
            raise ValueError("this model has no tokenizer, so it cannot take chat messages")
        return self.message_counter.count(message, after)

    def bound_message(self, message: dict, after: dict) -> int | None:
        """At least count_message(message, after), without encoding (MessageCounter.bound); None
        where no such bound is had."""
        return None if self.message_counter is None else self.message_counter.bound(message, after)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    priority: int = 0, tools: list[dict] | None = None,
                    cache_salt: str | None = None, arrival_time: float | None = None) -> None:
        """`tools`: the tools offered to this request (OpenAI shape); `params.tool_choice` says
        how the request's tool calls are constrained ("auto" when tools are given).
        `cache_salt`: prefix-cache hits only among requests with the same salt (say, one user's).
        `arrival_time`: when the request came (time.monotonic()), if before this call."""
        arrival = time.monotonic() if arrival_time is None else arrival_time
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        ids = self.encode_prompt(prompt)
        limit = min(self.max_model_len, self.block_manager.num_blocks * self.config.block_size)
        if len(ids) >= limit:
            raise ValueError(f"request {request_id}: the prompt has {len(ids)} tokens; at most "
                             f"{limit - 1} fit (max_model_len {self.max_model_len}, KV pool)")
        # The chat template's end-of-turn tokens end a request too (a Llama 3.1 GGUF lists
        # <|eot_id|> as its eos, but a tool call's turn ends on <|eom_id|>).
        eos = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos or self.chat_formatter is None
            else frozenset(self.chat_formatter.stop_token_ids))
        seq = Sequence(request_id, ids, params, priority=priority, max_total_tokens=limit,
                       cache_root=salt_key(cache_salt))
        seq.generator = make_generator(params.seed, self.device)
        seq.constraint = self._constraint(params, tools, eos)  # the runner masks its logits
        detok = IncrementalDetokenizer(self.tokenizer, ids, params) if self.tokenizer else None
        self.scheduler.add(seq)
        self._requests[request_id] = _Request(seq, detok, eos, RequestMetrics(arrival),
                                              [] if params.logprobs is not None else None)
        self.num_prompt_tokens += len(ids)

    def _constraint(self, params: SamplingParams, tools: list[dict] | None,
                    eos: frozenset[int]) -> ToolCallMatcher | JsonMatcher | None:
        if params.structured_outputs is None:
            return self._tool_matcher(params, tools, eos)
        if constrains(tools, params.tool_choice):
            raise ValueError(f"SamplingParams.structured_outputs cannot be combined with tool "
                             f"calls: tools with tool_choice={params.tool_choice!r} constrain the "
                             f"output to calls; pass tool_choice='none' or no tools")
        if self.json_constraints is None:
            raise ValueError("SamplingParams.structured_outputs needs the model's tokenizer, and "
                             "this model has none")
        return self.json_constraints.matcher(params.structured_outputs, eos)

    def _tool_matcher(self, params: SamplingParams, tools: list[dict] | None,
                      eos: frozenset[int]) -> ToolCallMatcher | None:
        if not constrains(tools, params.tool_choice):
            return None
        if self.tool_constraints is None:
            raise ValueError(f"SamplingParams.tool_choice={params.tool_choice!r}: constrained "
                             "tool calls need the model's tokenizer, and this model has none")
        return self.tool_constraints.matcher(tools, params.tool_choice, eos,
                                             params.tool_call_threshold,
                                             single=not params.parallel_tool_calls)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req.seq)
        self._finished(req)
        rest = req.detokenizer.flush() if req.detokenizer else ""
        return self._output(req, [], [], rest, "abort", None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        sampled, logprobs = self.runner.execute(batch)
        self.scheduler.update(batch)
        outputs = []
        for seq, token, logprob in zip(batch.seqs, sampled, logprobs, strict=True):
            if token is not None:
                outputs.append(self._append_token(self._requests[seq.request_id], token, logprob))
        return outputs

    def _append_token(self, req: _Request, token: int, logprob: TokenLogprob | None) -> RequestOutput:
        seq, params = req.seq, req.seq.params
        seq.token_ids.append(token)
        self.num_generated_tokens += 1
        metrics = req.metrics
        metrics.num_generation_tokens += 1
        if metrics.first_token_time is None:
            metrics.first_token_time = time.monotonic()
            self.ttft.observe(metrics.first_token_time - metrics.arrival_time)
        delta_logprobs = []
        if req.logprobs is not None and logprob is not None:
            req.logprobs.append(logprob)
            delta_logprobs = [logprob]
        if seq.constraint is not None:
            seq.constraint.advance(token)
        finish, stop_reason = None, None
        if token in req.eos_ids:
            finish, stop_reason = "stop", token
        elif req.detokenizer is not None:
            stop_reason = req.detokenizer.add([token])
            finish = "stop" if stop_reason is not None else None
        if finish is None and (seq.num_output_tokens >= (params.max_tokens or 1 << 30)
                               or seq.num_tokens >= seq.max_total_tokens):
            finish = "length"
        delta = ""
        if req.detokenizer is not None:
            delta = req.detokenizer.take_delta()
            if finish:
                delta += req.detokenizer.flush()
        if finish:
            self.scheduler.finish(seq)
            del self._requests[seq.request_id]
            self._finished(req)
        return self._output(req, [token], delta_logprobs, delta, finish, stop_reason)

    def _finished(self, req: _Request) -> None:
        """Count a request that ended (any reason) and observe its time per output token."""
        metrics = req.metrics
        metrics.finished_time = time.monotonic()
        self.num_requests_finished += 1
        if metrics.num_generation_tokens >= 2 and metrics.first_token_time is not None:
            self.tpot.observe((metrics.finished_time - metrics.first_token_time)
                              / (metrics.num_generation_tokens - 1))

    def _output(self, req: _Request, delta_ids: list[int], delta_logprobs: list[TokenLogprob],
                delta_text: str, finish: str | None, stop_reason: str | int | None) -> RequestOutput:
        seq = req.seq
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            token_ids=seq.output_token_ids,
            text=req.detokenizer.text if req.detokenizer else "",
            delta_token_ids=delta_ids,
            delta_text=delta_text,
            finished=finish is not None,
            finish_reason=finish,
            stop_reason=stop_reason,
            num_cached_tokens=seq.num_cached_tokens,
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            delta_logprobs=delta_logprobs,
            metrics=replace(req.metrics),  # a copy: later outputs move on, this one stays
        )

    # ---- introspection -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The engine's counters now. Token and request counts are cumulative; `ttft_seconds` and
        `tpot_seconds` are histograms ({"buckets", "counts" per bucket with +Inf last, "sum",
        "count"}), TTFT observed at a request's first token, TPOT when it finishes with >= 2."""
        bm = self.block_manager
        return {
            "model": self.config.model or ("(in-memory checkpoint)" if self._in_memory
                                           else "SmolLM2-135M-Instruct (embedded)"),
            "device": str(self.device),
            "num_running": len(self.scheduler.running),
            "num_waiting": self.scheduler.num_waiting,
            "kv_blocks": bm.num_blocks,
            "kv_usage": round(bm.usage, 4),
            "kv_blocks_used": bm.num_blocks - bm.num_free_blocks,
            "kv_blocks_cached": bm.num_cached_free_blocks,
            **self.runner.kv_budget.stats(),  # bytes per token, pool tokens
            "prefix_cache_queries": bm.stats.queries,
            "prefix_cache_hits": bm.stats.hits,
            "prefix_cache_query_tokens": bm.stats.queries,
            "prefix_cache_hit_tokens": bm.stats.hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_requests_finished": self.num_requests_finished,
            "prompt_tokens": self.num_prompt_tokens,
            "generated_tokens": self.num_generated_tokens,
            "ttft_seconds": self.ttft.snapshot(),
            "tpot_seconds": self.tpot.snapshot(),
        }
