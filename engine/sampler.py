"""The batched sampler: turns one row of logits per request into that request's next token."""

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
    offsets = offsets.to(device)
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
