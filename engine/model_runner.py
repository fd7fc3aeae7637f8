"""Tensors in, sampled tokens out: lays a scheduled batch out flat, runs the model, samples.

Owns the model, the paged KV pool (one [2, blocks, block_size, kv_heads, head_dim] tensor per
layer) and the attention backend. Knows nothing of requests beyond their token ids and block tables.

On CUDA, decode-only steps replay CUDA graphs captured at a ladder of batch sizes (DecodeGraphs);
prefill and mixed steps run eagerly. Host inputs go up through pinned memory without waiting, so
the one host read per step is that of the sampled tokens.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable

import torch

from engine.attention import AttentionBackend, AttentionMetadata, TritonAttentionBackend, get_backend
from engine.config import EngineConfig, ModelConfig
from engine.kv_budget import KVBudget, configured_pool_blocks
from engine.layers.linear import pack_linears
from engine.layers.quant_linear import quantize_linears
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq
from engine.loader import Checkpoint
from engine.logprobs import StepLogprobs, TokenLogprob
from engine.models import MODEL_CLASSES
from engine.models.meta_build import build_on_meta
from engine.sampler import Sampler, to_device
from engine.sampling_params import SamplingParams
from engine.scheduler import ScheduledBatch

# Graph ladder: 1, 2, 4, 8, then every 8 up to max_num_seqs (capped: past a few hundred rows a
# decode step is long enough that launch overhead no longer matters, and capture takes time).
_GRAPH_BATCH_STEP = 8
_MAX_GRAPH_BATCH = 512
# Kept back from the KV pool for the decode graphs' private memory pool (their activations at the
# largest captured batch, and the attention kernels' split-decode partials).
_GRAPH_MEMORY_MARGIN = 512 * 2**20


class ModelRunner:
    def __init__(self, ckpt: Checkpoint, config: EngineConfig, max_model_len: int) -> None:
        self.config = config
        self.model_config: ModelConfig = ckpt.config
        self.device = config.resolve_device()
        self._use_device()
        self.dtype = config.resolve_dtype(self.device)
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        cfg = ckpt.config
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, ckpt.rope_freq_factors)
        rotary = RotaryEmbedding(max_model_len, inv_freq, self.device)
        # Build on the meta device, cast there, then materialise: no throwaway random init, and no
        # float32 copy of a large model on the GPU (to_empty keeps the dtype it is given, so casting
        # after it would first allocate float32). load_weights casts as it copies.
        model = build_on_meta(lambda: MODEL_CLASSES[cfg.family](cfg, rotary))
        self.model = model.to(self.dtype).to_empty(device=self.device).eval()
        self.model.tie_weights()
        self.model.load_weights(ckpt.weights)
        self.quantization = config.resolve_quantization(self.device, ckpt.quantized, ckpt.quantized_bits)
        if self.quantization and not quantize_linears(self.model, self.quantization):
            self.quantization = None  # no kernel for it here: the float path stays
        if self.device.type == "cpu":
            pack_linears(self.model)  # oneDNN, not MKL (engine/layers/linear.py): 1.7x here
        self.backend = get_backend(self.device)
        self.sampler = Sampler()
        self.num_blocks = self._pool_blocks()
        shape = (2, self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(cfg.num_layers)]
        self.graphs: DecodeGraphs | None = None
        if self._graphs_wanted():
            self.graphs = DecodeGraphs(self.model, self.kv_caches, self.backend,
                                       graph_batch_sizes(config.max_num_seqs),
                                       math.ceil(max_model_len / self.block_size), self.device)

    @property
    def kv_budget(self) -> KVBudget:
        """The pool as allocated: what `engine.kv_budget.plan` computes from the config."""
        return KVBudget(self.model_config.kv_bytes_per_token(self.dtype.itemsize), self.block_size,
                        self.num_blocks)

    def _graphs_wanted(self) -> bool:
        # The torch reference backend sizes its work from host lists, which a graph would freeze;
        # the Triton backend's decode path reads only device tensors and shapes.
        return (self.device.type == "cuda" and not self.config.enforce_eager
                and isinstance(self.backend, TritonAttentionBackend))

    def _pool_blocks(self) -> int:
        block_bytes = self.model_config.kv_bytes_per_token(self.dtype.itemsize) * self.block_size
        configured = configured_pool_blocks(self.config, self.device.type, block_bytes)
        if configured is not None:
            return configured
        peak_activations = self._profile_peak_step()
        free, total = torch.cuda.mem_get_info(self.device)
        margin = 0 if not self._graphs_wanted() else _GRAPH_MEMORY_MARGIN
        # What the card may hold, less what is in use now (weights, CUDA context, other processes),
        # less the largest step's transient memory and the graphs' share.
        budget = total * self.config.gpu_memory_utilization - (total - free) - peak_activations - margin
        if budget < block_bytes:
            raise RuntimeError(
                f"no GPU memory left for the KV cache: {free / 2**30:.1f} of {total / 2**30:.1f} GiB "
                f"free after the weights, {peak_activations / 2**30:.2f} GiB needed by the largest "
                f"step; raise gpu_memory_utilization ({self.config.gpu_memory_utilization}) or lower "
                f"max_num_batched_tokens ({self.config.max_num_batched_tokens}) or max_num_seqs")
        return int(budget) // block_bytes

    def _profile_peak_step(self) -> int:
        """The bytes the largest step needs beyond what stays allocated (the weights)."""
        dev = self.device
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        self.run_largest_step()
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()  # what the step freed must not count as in use
        return torch.cuda.max_memory_allocated(dev) - torch.cuda.memory_allocated(dev)

    @torch.inference_mode()
    def run_largest_step(self) -> torch.Tensor:
        """The largest step the scheduler can make, on a throwaway one-layer pool: a prefill of
        max_num_batched_tokens (sequences of up to max_model_len), then logits and a draw with
        penalties, top-k, top-p and min-p for max_num_seqs rows. Returns the drawn tokens; the point
        is its memory peak."""
        dev, cfg, mc = self.device, self.config, self.model_config
        tokens = cfg.max_num_batched_tokens
        seq_len = min(tokens, self.max_model_len)
        lens = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
        tables, start = [], 0
        for n in lens:
            blocks = -(-n // self.block_size)
            tables.append(list(range(start, start + blocks)))
            start += blocks
        pool = torch.empty((2, start, self.block_size, mc.num_kv_heads, mc.head_dim), dtype=self.dtype,
                           device=dev)
        width = max(len(t) for t in tables)
        bs = self.block_size
        slots = [t[p // bs] * bs + p % bs for t, n in zip(tables, lens, strict=True) for p in range(n)]
        meta = AttentionMetadata(
            slot_mapping=to_device(torch.tensor(slots), dev),
            block_tables=to_device(torch.tensor([t + [0] * (width - len(t)) for t in tables]), dev),
            context_lens=to_device(torch.tensor(lens), dev),
            query_start=[0, *itertools.accumulate(lens)],
            context_lens_host=lens,
            num_decodes=0,
        )
        positions = to_device(torch.tensor([p for n in lens for p in range(n)]), dev)
        hidden = self.model(torch.zeros(tokens, dtype=torch.int64, device=dev), positions,
                            [pool] * mc.num_layers, meta, self.backend)
        rows = cfg.max_num_seqs
        logits = self.model.compute_logits(hidden[-1:].expand(rows, -1).contiguous())
        del hidden, pool
        # Every knob that allocates [rows, vocab] working tensors: penalties (token counts), the
        # top-p sort, min-p.
        params = [SamplingParams(temperature=1.0, top_k=50, top_p=0.9, min_p=0.01, repetition_penalty=1.1,
                                 frequency_penalty=0.1)] * rows
        return self.sampler(logits, params, [None] * rows, [[1]] * rows, [[2]] * rows)

    def _use_device(self) -> None:
        """Make our GPU the calling thread's current one. Triton launches, graph capture and
        events go to the current device, which is per thread (AsyncLLM steps in its own), so
        with "cuda:1" they would otherwise land on device 0 while the tensors live on 1."""
        if self.device.type == "cuda" and torch.cuda.current_device() != self.device.index:
            torch.cuda.set_device(self.device)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[list[int | None], list[TokenLogprob | None]]:
        """Run one step. Returns, per sequence of the batch, its next token, or None when its
        prompt chunk did not reach the end (nothing to sample yet); and that token's logprobs,
        for the sequences whose params ask for them (None otherwise)."""
        self._use_device()
        hidden, sample_rows, sample_of = self._forward(batch)
        result: list[int | None] = [None] * len(batch)
        logprobs: list[TokenLogprob | None] = [None] * len(batch)
        if not sample_rows:
            return result, logprobs
        logits = self.model.compute_logits(self._rows(hidden, sample_rows))
        seqs = [batch.seqs[i] for i in sample_of]
        ks = [s.params.logprobs for s in seqs]
        # Before the masks: logprobs describe the model's own distribution.
        step_logprobs = StepLogprobs(logits, ks) if any(k is not None for k in ks) else None
        for row, seq in enumerate(seqs):
            if seq.constraint is not None:  # constrained decoding: disallowed tokens to -inf
                seq.constraint.mask_logits(logits[row])
        params = [_step_params(s) for s in seqs]
        sampled = self.sampler(
            logits,
            params,
            [s.generator for s in seqs],
            [s.prompt_token_ids if p.repetition_penalty != 1.0 else []
             for s, p in zip(seqs, params, strict=True)],
            [s.output_token_ids if p.has_penalties else [] for s, p in zip(seqs, params, strict=True)],
        )
        tokens = sampled.tolist()  # the step's one wait for the device
        for i, tok in zip(sample_of, tokens, strict=True):
            result[i] = tok
        if step_logprobs is not None:  # computed by now: its reads wait for nothing more
            for i, lp in zip(sample_of, step_logprobs.finish(sampled), strict=True):
                logprobs[i] = lp
        return result, logprobs

    @torch.inference_mode()
    def prefill_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Logits at every position of one prompt, through the paged path (tests, debugging)."""
        from engine.block_manager import BlockManager
        from engine.sequence import Sequence

        seq = Sequence("logits", list(token_ids))
        bm = BlockManager(self.num_blocks, self.block_size, enable_prefix_caching=False)
        if not bm.allocate(seq, len(token_ids)):
            raise ValueError("prompt does not fit the KV pool")
        hidden, _, _ = self._forward(ScheduledBatch([seq], [len(token_ids)]))
        return self.model.compute_logits(hidden)

    def _rows(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """hidden[rows] (rows ascending) without a synchronising copy of the index on CUDA."""
        if rows[-1] == len(rows) - 1:  # ascending and ending at len - 1: exactly 0..len-1
            return hidden[: len(rows)]
        if self.device.type == "cpu":
            return hidden[rows]
        return hidden.index_select(0, to_device(torch.tensor(rows), self.device))

    def _forward(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[int], list[int]]:
        """Lay the batch out flat and run the model. Returns the hidden states, the flat rows to
        sample from (each sequence's last token, when its chunk reaches the end), and the batch
        index of each of those sequences."""
        # Decodes first: the attention backend handles them as one batched call.
        order = sorted(range(len(batch)), key=lambda i: batch.num_new_tokens[i] > 1)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start = [0]
        context_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        sample_of: list[int] = []
        bs = self.block_size
        for i in order:
            seq, n = batch.seqs[i], batch.num_new_tokens[i]
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in range(start, end)]
            query_start.append(query_start[-1] + n)
            context_lens.append(end)
            tables.append(table)
            if end == seq.num_tokens:
                sample_rows.append(query_start[-1] - 1)
                sample_of.append(i)
        num_decodes = sum(1 for i in order if batch.num_new_tokens[i] == 1)
        if self.graphs is not None and num_decodes == len(batch) <= self.graphs.max_batch:
            hidden = self.graphs.run(input_ids, positions, slots, context_lens, tables)
            return hidden, sample_rows, sample_of
        width = max(len(t) for t in tables)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=to_device(torch.tensor(slots, dtype=torch.int64), dev),
            block_tables=to_device(torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                                dtype=torch.int64), dev),
            context_lens=to_device(torch.tensor(context_lens, dtype=torch.int64), dev),
            query_start=query_start,
            context_lens_host=context_lens,
            num_decodes=num_decodes,
            num_shared_decode_blocks=shared_prefix_blocks(
                tables[:num_decodes], context_lens[:num_decodes], bs),
            block_run_starts=(block_run_starts(tables, context_lens, query_start, num_decodes, bs)
                              if self.backend.reads_block_runs else []),
        )
        hidden = self.model(
            to_device(torch.tensor(input_ids, dtype=torch.int64), dev),
            to_device(torch.tensor(positions, dtype=torch.int64), dev),
            self.kv_caches, meta, self.backend,
        )
        return hidden, sample_rows, sample_of


def shared_prefix_blocks(tables: list[list[int]], context_lens: list[int], block_size: int) -> int:
    """How many leading blocks all these sequences share and hold full (0 for fewer than two):
    AttentionMetadata.num_shared_decode_blocks, which the backends attend once for the batch."""
    if len(tables) < 2:
        return 0
    limit = min(context_lens) // block_size
    first = tables[0]
    n = 0
    while n < limit and all(t[n] == first[n] for t in tables):
        n += 1
    return n


def block_run_starts(tables: list[list[int]], context_lens: list[int], query_start: list[int],
                     num_decodes: int, block_size: int) -> list[int]:
    """AttentionMetadata.block_run_starts, for the sequences whose K/V the torch backend would
    otherwise gather from the pool: a lone decode (a batch of decodes is attended as one tensor)
    and prefill chunks after earlier context. -1 for the others and where the blocks are not
    consecutive. A fresh sequence takes consecutive free blocks, so a single chat usually has one
    run: a view then replaces a copy of its whole context per layer and step."""
    starts = [-1] * len(tables)
    for s, (table, ctx) in enumerate(zip(tables, context_lens, strict=True)):
        new = query_start[s + 1] - query_start[s]
        if (num_decodes > 1 and s < num_decodes) or (s >= num_decodes and ctx == new):
            continue
        n = -(-ctx // block_size)
        first = table[0]
        if table[n - 1] - first == n - 1 and table[:n] == list(range(first, first + n)):
            starts[s] = first
    return starts


# ---- CUDA graphs of decode steps -----------------------------------------------------------------


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes decode graphs are captured at: 1, 2, 4, 8, 16, 24, ... and max_num_seqs
    itself (capped at _MAX_GRAPH_BATCH). A step of n decodes replays the smallest size >= n."""
    top = min(max_num_seqs, _MAX_GRAPH_BATCH)
    sizes = [s for s in (1, 2, 4, 8) if s <= top]
    sizes += range(2 * _GRAPH_BATCH_STEP, top + 1, _GRAPH_BATCH_STEP)
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def padded_batch_size(n: int, sizes: list[int]) -> int:
    """The captured size a step of n decodes runs at (sizes ascending, n <= sizes[-1])."""
    return sizes[bisect.bisect_left(sizes, n)]


def fill_decode_inputs(
    vector_buf: torch.Tensor,
    table_buf: torch.Tensor,
    input_ids: list[int],
    positions: list[int],
    slots: list[int],
    context_lens: list[int],
    tables: list[list[int]],
    padded: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lay one decode step out in flat int64 host buffers, padded to `padded` rows. Returns
    contiguous views: [4, padded] (input ids, positions, slots, context lens) and the block tables
    [padded, width], width the longest table. Padding rows are token 0 at position 0 with slot -1
    and context 0, which the Triton attention kernels skip (no KV write) and answer with zeros;
    their table rows are zeros."""
    n = len(input_ids)
    width = max(len(t) for t in tables)
    vectors = vector_buf[: 4 * padded].view(4, padded)
    rows = table_buf[: padded * width].view(padded, width)
    v, t = vectors.numpy(), rows.numpy()  # numpy fills from lists far faster than torch indexing
    v[0, :n], v[1, :n], v[2, :n], v[3, :n] = input_ids, positions, slots, context_lens
    v[0:2, n:], v[2, n:], v[3, n:] = 0, -1, 0
    t[n:] = 0
    for i, table in enumerate(tables):
        t[i, : len(table)] = table
        t[i, len(table) :] = 0
    return vectors, rows


class DecodeGraphs:
    """One CUDA graph per ladder size, replayed for decode-only steps over static input buffers.

    The graphs share one memory pool and are captured largest first, so the smaller ones fit in
    what the largest allocated. Their attention metadata is fixed at capture: views of the static
    buffers, and host fields that a decode-only Triton step never reads.
    """

    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], backend: AttentionBackend,
                 sizes: list[int], max_blocks: int, device: torch.device) -> None:
        self.sizes = sizes
        self.max_batch = sizes[-1]
        self.max_blocks = max_blocks
        pin = device.type == "cuda"
        # Host staging (pinned) and the device buffers the graphs read; the latter start as pure
        # padding, so the eager warm-up and the capture runs write no KV and read none.
        self._host_vectors = torch.zeros(4 * self.max_batch, dtype=torch.int64, pin_memory=pin)
        self._host_tables = torch.zeros(self.max_batch * max_blocks, dtype=torch.int64, pin_memory=pin)
        self._vectors = torch.zeros(4, self.max_batch, dtype=torch.int64, device=device)
        self._vectors[2] = -1
        self._tables = torch.zeros(self.max_batch, max_blocks, dtype=torch.int64, device=device)
        self._replays: dict[int, Callable[[], object]] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        # Marks the last step's copies out of the pinned staging buffers (see run()).
        self._copied = torch.cuda.Event() if device.type == "cuda" else None
        self._capture(model, kv_caches, backend, device)

    def _step_args(self, bs: int, kv_caches: list[torch.Tensor], backend: AttentionBackend) -> tuple:
        """The model's arguments for a decode step of bs rows, all views of the static buffers."""
        ids, positions, slots, lens = self._vectors
        block_size = kv_caches[0].shape[2]
        meta = AttentionMetadata(
            slot_mapping=slots[:bs], block_tables=self._tables[:bs], context_lens=lens[:bs],
            query_start=list(range(bs + 1)),
            context_lens_host=[self.max_blocks * block_size] * bs,  # capacity: never read
            num_decodes=bs,
        )
        return ids[:bs], positions[:bs], kv_caches, meta, backend

    @torch.inference_mode()
    def _capture(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], backend: AttentionBackend,
                 device: torch.device) -> None:
        pool = None
        for bs in reversed(self.sizes):
            args = self._step_args(bs, kv_caches, backend)
            model(*args)  # compiles the Triton kernels for this shape before the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[bs] = model(*args)
            pool = graph.pool()
            self._replays[bs] = graph.replay
        torch.cuda.synchronize(device)

    def run(self, input_ids: list[int], positions: list[int], slots: list[int], context_lens: list[int],
            tables: list[list[int]]) -> torch.Tensor:
        """Fill the static buffers (async copies from pinned memory) and replay the graph of the
        smallest captured size that fits; returns the hidden states of the real rows, a view of the
        graph's output, valid until the next replay (the graphs share one memory pool, so a larger
        graph's intermediates may overlay a smaller one's output): read or copy it before then.

        The pinned buffers are reused every step, and a non-blocking copy out of them runs only when
        the GPU reaches it. execute()'s read of the sampled tokens normally waits for it, but a step
        that samples nothing (or a caller of _forward) would not: so before overwriting them, wait
        for the previous step's copies alone (already done in the usual case: no wait at all)."""
        n = len(input_ids)
        bs = padded_batch_size(n, self.sizes)
        if self._copied is not None:
            self._copied.synchronize()
        vectors, rows = fill_decode_inputs(self._host_vectors, self._host_tables, input_ids, positions,
                                           slots, context_lens, tables, bs)
        self._vectors[:, :bs].copy_(vectors, non_blocking=True)
        self._tables[:bs, : rows.shape[1]].copy_(rows, non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self._replays[bs]()
        return self._outputs[bs][:n]


def _step_params(seq) -> SamplingParams:
    """The request's sampling for this token: its call_params inside a constrained tool call."""
    inner = seq.params.call_params
    if inner is not None and getattr(seq.constraint, "in_call", False):
        return inner
    return seq.params
