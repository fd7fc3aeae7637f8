"""The step loop's core: requests in, one scheduled model step at a time, outputs out.

Single-threaded by design: LLM drives it directly and AsyncLLM from one worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.block_manager import BlockManager, salt_key
from engine.chat import ChatFormatter
from engine.config import EngineConfig
from engine.constrained import ToolCallMatcher, ToolConstraints, constrains
from engine.detokenizer import IncrementalDetokenizer
from engine.loader import Checkpoint, open_checkpoint
from engine.model_runner import ModelRunner
from engine.outputs import RequestOutput
from engine.sampler import make_generator
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

Prompt = str | list[int]


@dataclass(eq=False)
class _Request:
    seq: Sequence
    detokenizer: IncrementalDetokenizer | None
    eos_ids: frozenset[int]


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
        self._requests: dict[str, _Request] = {}
        # Tool-call constraints: the vocabulary's bytes are read on the first constrained request.
        self.tool_constraints = (ToolConstraints(self.tokenizer, self.model_config.vocab_size)
                                 if self.tokenizer else None)
        self.num_generated_tokens = 0
        self.num_prompt_tokens = 0
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

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        if self.chat_formatter is None:
            raise ValueError("this model has no tokenizer, so it cannot take chat messages")
        return self.chat_formatter.encode(messages, tools=tools)

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    priority: int = 0, tools: list[dict] | None = None,
                    cache_salt: str | None = None) -> None:
        """`tools`: the tools offered to this request (OpenAI shape); `params.tool_choice` says
        how the request's tool calls are constrained ("auto" when tools are given).
        `cache_salt`: prefix-cache hits only among requests with the same salt (say, one user's)."""
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
        seq.constraint = self._tool_matcher(params, tools, eos)  # the runner masks its logits
        detok = IncrementalDetokenizer(self.tokenizer, ids, params) if self.tokenizer else None
        self.scheduler.add(seq)
        self._requests[request_id] = _Request(seq, detok, eos)
        self.num_prompt_tokens += len(ids)

    def _tool_matcher(self, params: SamplingParams, tools: list[dict] | None,
                      eos: frozenset[int]) -> ToolCallMatcher | None:
        if not constrains(tools, params.tool_choice):
            return None
        if self.tool_constraints is None:
            raise ValueError(f"SamplingParams.tool_choice={params.tool_choice!r}: constrained "
                             "tool calls need the model's tokenizer, and this model has none")
        return self.tool_constraints.matcher(tools, params.tool_choice, eos)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return None
        self.scheduler.finish(req.seq)
        rest = req.detokenizer.flush() if req.detokenizer else ""
        return self._output(req, [], rest, "abort", None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step ------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        sampled = self.runner.execute(batch)
        self.scheduler.update(batch)
        outputs = []
        for seq, token in zip(batch.seqs, sampled, strict=True):
            if token is not None:
                outputs.append(self._append_token(self._requests[seq.request_id], token))
        return outputs

    def _append_token(self, req: _Request, token: int) -> RequestOutput:
        seq, params = req.seq, req.seq.params
        seq.token_ids.append(token)
        self.num_generated_tokens += 1
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
        return self._output(req, [token], delta, finish, stop_reason)

    def _output(self, req: _Request, delta_ids: list[int], delta_text: str,
                finish: str | None, stop_reason: str | int | None) -> RequestOutput:
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
        )

    # ---- introspection -------------------------------------------------------------------

    def stats(self) -> dict[str, float | int | str]:
        bm = self.block_manager
        return {
            "model": self.config.model or ("(in-memory checkpoint)" if self._in_memory
                                           else "SmolLM2-135M-Instruct (embedded)"),
            "device": str(self.device),
            "num_running": len(self.scheduler.running),
            "num_waiting": self.scheduler.num_waiting,
            "kv_blocks": bm.num_blocks,
            "kv_usage": round(bm.usage, 4),
            "prefix_cache_queries": bm.stats.queries,
            "prefix_cache_hits": bm.stats.hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "prompt_tokens": self.num_prompt_tokens,
            "generated_tokens": self.num_generated_tokens,
        }
