"""Tensors in, sampled tokens out: lays a scheduled batch out flat, runs the model, samples.

Owns the model, the paged KV pool (one [2, blocks, block_size, kv_heads, head_dim] tensor per
layer) and the attention backend. Knows nothing of requests beyond their token ids and block tables.
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, get_backend
from engine.config import EngineConfig, ModelConfig
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq
from engine.loader import Checkpoint
from engine.models import MODEL_CLASSES
from engine.sampler import Sampler
from engine.scheduler import ScheduledBatch

_DEFAULT_CPU_KV_GIB = 1.0


class ModelRunner:
    def __init__(self, ckpt: Checkpoint, config: EngineConfig, max_model_len: int) -> None:
        self.config = config
        self.model_config: ModelConfig = ckpt.config
        self.device = config.resolve_device()
        self.dtype = config.resolve_dtype(self.device)
        self.block_size = config.block_size
        cfg = ckpt.config
        inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, ckpt.rope_freq_factors)
        rotary = RotaryEmbedding(max_model_len, inv_freq, self.device)
        # Build on the meta device and materialise in the target dtype: no throwaway random init,
        # no float32 copy of a large model on the GPU. load_weights casts as it copies.
        with torch.device("meta"):
            model = MODEL_CLASSES[cfg.family](cfg, rotary)
        self.model = model.to_empty(device=self.device).to(self.dtype).eval()
        self.model.tie_weights()
        self.model.load_weights(ckpt.weights)
        self.backend = get_backend(self.device)
        self.sampler = Sampler()
        self.num_blocks = self._pool_blocks()
        shape = (2, self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(cfg.num_layers)]

    def _pool_blocks(self) -> int:
        block_bytes = self.model_config.kv_bytes_per_token(self.dtype) * self.block_size
        if self.device.type == "cpu":
            gib = self.config.kv_cache_gib or _DEFAULT_CPU_KV_GIB
            return max(1, int(gib * 2**30) // block_bytes)
        if self.config.kv_cache_gib is not None:
            return max(1, int(self.config.kv_cache_gib * 2**30) // block_bytes)
        free, total = torch.cuda.mem_get_info(self.device)
        # Leave (1 - utilization) of the card plus room for one step's activations and logits.
        cfg = self.model_config
        activations = self.config.max_num_batched_tokens * (
            12 * cfg.hidden_size + 4 * cfg.intermediate_size) * self.dtype.itemsize
        logits = self.config.max_num_seqs * cfg.vocab_size * 4 * 3
        budget = free - (1 - self.config.gpu_memory_utilization) * total - activations - logits
        return max(1, int(budget) // block_bytes)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        """Run one step. Returns, per sequence of the batch, its next token, or None when its
        prompt chunk did not reach the end (nothing to sample yet)."""
        hidden, sample_rows, sample_of = self._forward(batch)
        result: list[int | None] = [None] * len(batch)
        if not sample_rows:
            return result
        logits = self.model.compute_logits(hidden[sample_rows])
        seqs = [batch.seqs[i] for i in sample_of]
        tokens = self.sampler(
            logits,
            [s.params for s in seqs],
            [s.generator for s in seqs],
            [s.prompt_token_ids if s.params.repetition_penalty != 1.0 else [] for s in seqs],
            [s.output_token_ids if s.params.has_penalties else [] for s in seqs],
        ).tolist()
        for i, tok in zip(sample_of, tokens, strict=True):
            result[i] = tok
        return result

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
        width = max(len(t) for t in tables)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables],
                                      dtype=torch.int64, device=dev),
            context_lens=torch.tensor(context_lens, dtype=torch.int64, device=dev),
            query_start=query_start,
            context_lens_host=context_lens,
            num_decodes=num_decodes,
            num_shared_decode_blocks=_shared_prefix_blocks(
                tables[:num_decodes], context_lens[:num_decodes], bs),
        )
        hidden = self.model(
            torch.tensor(input_ids, dtype=torch.int64, device=dev),
            torch.tensor(positions, dtype=torch.int64, device=dev),
            self.kv_caches, meta, self.backend,
        )
        return hidden, sample_rows, sample_of


def _shared_prefix_blocks(tables: list[list[int]], context_lens: list[int], block_size: int) -> int:
    """How many leading blocks all these sequences share and hold full (0 for fewer than two)."""
    if len(tables) < 2:
        return 0
    limit = min(context_lens) // block_size
    first = tables[0]
    n = 0
    while n < limit and all(t[n] == first[n] for t in tables):
        n += 1
    return n
