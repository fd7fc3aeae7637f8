"""The batched sampler: turns one row of logits per request into that request's next token.

Two paths with the same semantics. The CPU path (the reference, tested exactly) selects rows and
sizes its work from device values freely, since on the CPU that costs nothing. The device path
(CUDA) never waits for the GPU: every per-row knob goes up in one pinned, non-blocking copy, the
work done is chosen from the host-side params only, and the result stays on the device, so the
runner's read of the sampled tokens is the step's only synchronisation.
"""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams

# Probabilities from float32 logits carry rounding, so a nucleus that reaches top_p exactly
# (0.5 + 0.3 against 0.8) would keep one token more or less by the last bit; this slack settles it.
_TOP_P_EPS = 1e-6
# How many top tokens top-p ranks first (see _top_p_threshold).
_TOP_P_CANDIDATES = 256


def make_generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A per-request generator seeded with `seed`, or None (use the default RNG) without one."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the GPU: through pinned memory, copied
    asynchronously. (A copy from pageable memory would synchronise with every queued kernel.)
    Torch's pinned-memory cache keeps the staging buffer alive until the copy has run."""
    if device.type == "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def token_counts(ids: list[list[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, V] float32: how often each token id occurs in each row's list."""
    batch = len(ids)
    counts = torch.zeros(batch, vocab_size, dtype=torch.float32, device=device)
    flat = torch.tensor([token for row in ids for token in row], dtype=torch.int64)
    if flat.numel() == 0:
        return counts
    if int(flat.min()) < 0 or int(flat.max()) >= vocab_size:
        raise ValueError(
            f"token ids must be in [0, {vocab_size}) for a vocab of {vocab_size}; got "
            f"{int(flat.min())}..{int(flat.max())} (do the tokenizer and the model disagree?)"
        )
    # Each id becomes an offset into the flattened [B, V] counts, so one scatter_add does all rows.
    lengths = torch.tensor([len(row) for row in ids])
    offsets = torch.repeat_interleave(torch.arange(batch) * vocab_size, lengths) + flat
    offsets = to_device(offsets, device)
    counts.view(-1).scatter_add_(0, offsets, torch.ones(offsets.shape, device=device))
    return counts


def apply_penalties(
    logits: torch.Tensor,
    seen: torch.Tensor,
    output_counts: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties on [B, V] logits.

    `seen` ([B, V] bool) marks tokens in the prompt or the output: their logits are divided by
    the repetition penalty when positive and multiplied by it otherwise. `output_counts` ([B, V])
    counts generated tokens only: frequency_penalty * count and presence_penalty * (count > 0)
    are subtracted. The three penalties are [B] tensors.
    """
    rep = repetition_penalty.unsqueeze(1)
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    logits = logits - frequency_penalty.unsqueeze(1) * output_counts
    return logits - presence_penalty.unsqueeze(1) * (output_counts > 0).to(logits.dtype)


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask to -inf what top-k ([B] int, 0 = off) and then top-p ([B] float, 1 = off) drop.

    Both become a per-row logit threshold, so tokens tied with the last one kept are kept too.
    """
    if top_k is None and top_p is None:
        return logits
    batch, vocab = logits.shape
    threshold = torch.full((batch, 1), -torch.inf, dtype=logits.dtype, device=logits.device)
    if top_k is not None:
        active = (top_k > 0).unsqueeze(1)
        k = top_k.clamp(min=1, max=vocab).to(torch.int64).unsqueeze(1)
        # topk over the largest k asked is much cheaper than a full sort of the vocab.
        largest = logits.topk(int(k.max()), dim=-1).values
        threshold = torch.where(active, largest.gather(1, k - 1), threshold)
        logits = logits.masked_fill(logits < threshold, -torch.inf)
    if top_p is None:
        return logits
    return logits.masked_fill(logits < _top_p_threshold(logits, top_p), -torch.inf)


def _top_p_threshold(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[B, 1] logit of the least likely token in each row's nucleus; -inf where top_p is 1."""
    batch, vocab = logits.shape
    threshold = torch.full((batch, 1), -torch.inf, dtype=logits.dtype, device=logits.device)
    rows = torch.nonzero(top_p < 1.0).squeeze(1)
    # A nucleus is usually a few hundred tokens at most, so rank only that many candidates and
    # widen (up to a full sort) for the rows whose nucleus has not closed within them: sorting a
    # 49k vocab costs several times the rest of the sampler on CPU.
    width = min(vocab, _TOP_P_CANDIDATES)
    while rows.numel():
        sub = logits[rows]
        ranked = sub.topk(width, dim=-1).values if width < vocab else sub.sort(-1, True).values
        # float64 because a float32 running sum over thousands of tokens drifts by more than a
        # tail token's probability, which would move the cut by a token or two.
        log_total = sub.logsumexp(dim=-1, keepdim=True).double()
        probs = (ranked.double() - log_total).exp()
        # Mass of the tokens ranked above each one; a token is kept while that is short of top_p.
        mass_before = torch.nn.functional.pad(probs.cumsum(dim=-1)[:, :-1], (1, 0))
        keep = mass_before < top_p[rows].unsqueeze(1) - _TOP_P_EPS
        keep[:, 0] = True
        closed = ~keep[:, -1] if width < vocab else torch.ones_like(keep[:, -1])
        # mass_before never decreases, so `keep` is a prefix and its length names the last kept.
        last_kept = keep.sum(dim=-1, keepdim=True) - 1
        threshold[rows[closed]] = ranked.gather(1, last_kept)[closed]
        rows = rows[~closed]
        width = min(vocab, width * 8)
    return threshold


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep each row's top_k largest logits (ties with the k-th included); 0 = off."""
    return apply_top_k_top_p(logits, top_k, None)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest most-probable set whose mass reaches top_p; 1 = off."""
    return apply_top_k_top_p(logits, None, top_p)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p ([B]) times the row's top probability."""
    # p_i < min_p * p_max is l_i - l_max < log(min_p): no softmax needed, and min_p 0 is -inf.
    floor = logits.amax(dim=-1, keepdim=True) + min_p.unsqueeze(1).log()
    return logits.masked_fill(logits < floor, -torch.inf)


def sample_from_logits(
    logits: torch.Tensor, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token per row, drawn from softmax([B, V] logits) by an exponential race.

    argmax(p / q) with q ~ Exp(1) per token picks token i with probability p_i. Each seeded row
    draws its q from its own generator alone, so its tokens do not depend on its batch mates.
    """
    u = torch.empty_like(logits)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        u.uniform_()
    elif unseeded:
        rows = torch.tensor(unseeded, device=logits.device)
        u[rows] = torch.empty(len(unseeded), logits.shape[1], device=logits.device).uniform_()
    for i, generator in enumerate(generators):
        if generator is not None:
            u[i].uniform_(generator=generator)
    # q = -log(u) is Exp(1) at a sixth of the cost of exponential_(); the floor keeps a u of
    # exactly 1 from giving q = 0. argmax(p / q) = argmax(logit - log q) needs no softmax.
    q = u.log_().neg_().clamp_min_(torch.finfo(u.dtype).tiny)
    return (logits - q.log_()).argmax(dim=-1)


class Sampler:
    """Penalties, temperature, top-k, top-p, min-p and the draw, for a batch of requests."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
        prompt_ids: list[list[int]],
        output_ids: list[list[int]],
    ) -> torch.Tensor:
        batch = logits.shape[0]
        sizes = (len(params), len(generators), len(prompt_ids), len(output_ids))
        if any(size != batch for size in sizes):
            raise ValueError(
                f"Sampler got logits for {batch} rows but params/generators/prompt_ids/"
                f"output_ids of lengths {sizes}; pass one entry per row"
            )
        if logits.is_cuda:
            return sample_on_device(logits.float(), params, generators, prompt_ids, output_ids)
        logits = _penalise(logits.float(), params, prompt_ids, output_ids)
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if len(rows) == batch:
            return _sample(logits, params, generators)
        # Greedy rows skip temperature and the masks: none of them can move the argmax.
        tokens = logits.argmax(dim=-1)
        if rows:
            index = torch.tensor(rows, device=logits.device)
            sub_params, sub_generators = [params[i] for i in rows], [generators[i] for i in rows]
            tokens[index] = _sample(logits[index], sub_params, sub_generators)
        return tokens


def _penalise(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
) -> torch.Tensor:
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return logits
    device, vocab = logits.device, logits.shape[1]
    output_counts = token_counts([output_ids[i] for i in rows], vocab, device)
    seen = output_counts > 0
    if any(params[i].repetition_penalty != 1.0 for i in rows):
        seen |= token_counts([prompt_ids[i] for i in rows], vocab, device) > 0
    index = torch.tensor(rows, device=device)

    def per_row(name: str) -> torch.Tensor:
        return torch.tensor([getattr(params[i], name) for i in rows], device=device)

    penalised = apply_penalties(
        logits[index],
        seen,
        output_counts,
        per_row("repetition_penalty"),
        per_row("frequency_penalty"),
        per_row("presence_penalty"),
    )
    return logits.index_copy(0, index, penalised)


def _sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    logits = logits / temperature.unsqueeze(1)
    top_k = top_p = None
    if any(p.top_k > 0 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=device)
    if any(p.top_p < 1.0 for p in params):
        top_p = torch.tensor([p.top_p for p in params], device=device)
    logits = apply_top_k_top_p(logits, top_k, top_p)
    if any(p.min_p > 0.0 for p in params):
        logits = apply_min_p(logits, torch.tensor([p.min_p for p in params], device=device))
    return sample_from_logits(logits, generators)


# ---- the device path -------------------------------------------------------------------------


def sample_on_device(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
) -> torch.Tensor:
    """The CPU path's semantics without a host sync: no row selection by index lists (masks and
    torch.where instead), top-k by topk() over the largest k asked, a sort only when some row asks
    for top-p. Seeded rows draw from their own CUDA generator (one small launch per seeded row);
    their tokens are independent of batch mates, as on the CPU, but not equal to the CPU's."""
    if any(p.has_penalties for p in params):
        logits = _penalise_on_device(logits, params, prompt_ids, output_ids)
    if all(p.greedy for p in params):
        return logits.argmax(dim=-1)
    vocab = logits.shape[1]
    # One host row per knob, one copy. Greedy rows get temperature 1 (their draw is discarded).
    knobs = torch.tensor([
        [p.temperature if not p.greedy else 1.0 for p in params],
        [float(p.top_k) for p in params],
        [p.top_p for p in params],
        [p.min_p for p in params],
        [float(p.greedy) for p in params],
    ], dtype=torch.float32)
    temperature, top_k, top_p, min_p, greedy = to_device(knobs, logits.device).unbind(0)
    scaled = logits / temperature.unsqueeze(1)
    max_k = max(p.top_k for p in params)
    if any(p.top_p < 1.0 for p in params):
        scaled = top_k_top_p_by_sort(scaled, top_k if max_k else None, top_p)
    elif max_k:
        largest = scaled.topk(min(max_k, vocab), dim=-1).values
        kth = largest.gather(1, (top_k.long().clamp(1, largest.shape[1]) - 1).unsqueeze(1))
        threshold = torch.where((top_k > 0).unsqueeze(1), kth, -torch.inf)
        scaled = scaled.masked_fill(scaled < threshold, -torch.inf)
    if any(p.min_p > 0.0 for p in params):
        scaled = apply_min_p(scaled, min_p)
    # The exponential race of sample_from_logits: argmax(logit - log q), q ~ Exp(1). The floor
    # keeps a q of 0 from turning a masked -inf logit into NaN (which argmax would pick).
    q = torch.empty_like(scaled).exponential_()
    for i, generator in enumerate(generators):
        if generator is not None and not params[i].greedy:
            q[i].exponential_(generator=generator)
    sampled = (scaled - q.clamp_min_(torch.finfo(q.dtype).tiny).log_()).argmax(dim=-1)
    if not any(p.greedy for p in params):
        return sampled
    return torch.where(greedy.bool(), logits.argmax(dim=-1), sampled)


def top_k_top_p_by_sort(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor
) -> torch.Tensor:
    """apply_top_k_top_p with one full sort per row instead of widening candidate sets (whose
    sizes the CPU path reads from the device). Same thresholds: top-k's k-th value (ties kept),
    then the nucleus of the renormalised top-k distribution, float64 mass as on the CPU."""
    vocab = logits.shape[1]
    ranked = logits.sort(dim=-1, descending=True).values
    threshold = torch.full_like(ranked[:, :1], -torch.inf)
    if top_k is not None:
        kth = ranked.gather(1, (top_k.long().clamp(1, vocab) - 1).unsqueeze(1))
        threshold = torch.where((top_k > 0).unsqueeze(1), kth, threshold)
        ranked = ranked.masked_fill(ranked < threshold, -torch.inf)
    log_total = ranked.logsumexp(dim=-1, keepdim=True).double()
    probs = (ranked.double() - log_total).exp()
    mass_before = torch.nn.functional.pad(probs.cumsum(dim=-1)[:, :-1], (1, 0))
    keep = mass_before < top_p.double().unsqueeze(1) - _TOP_P_EPS
    keep[:, 0] = True
    last_kept = keep.sum(dim=-1, keepdim=True) - 1
    nucleus = torch.where((top_p < 1.0).unsqueeze(1), ranked.gather(1, last_kept), -torch.inf)
    threshold = torch.maximum(threshold, nucleus)
    return logits.masked_fill(logits < threshold, -torch.inf)


def _penalise_on_device(
    logits: torch.Tensor,
    params: list[SamplingParams],
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
) -> torch.Tensor:
    """_penalise over every row: rows without penalties get the neutral values (1, 0, 0), which
    leave their logits unchanged, so no row index has to go to the device."""
    device, vocab = logits.device, logits.shape[1]
    output_counts = token_counts(
        [ids if p.has_penalties else [] for p, ids in zip(params, output_ids, strict=True)], vocab, device)
    seen = output_counts > 0
    if any(p.repetition_penalty != 1.0 for p in params):
        seen |= token_counts([ids if p.repetition_penalty != 1.0 else []
                              for p, ids in zip(params, prompt_ids, strict=True)], vocab, device) > 0
    knobs = torch.tensor([[p.repetition_penalty for p in params], [p.frequency_penalty for p in params],
                          [p.presence_penalty for p in params]], dtype=torch.float32)
    repetition, frequency, presence = to_device(knobs, device).unbind(0)
    return apply_penalties(logits, seen, output_counts, repetition, frequency, presence)
