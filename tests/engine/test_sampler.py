"""The sampler's masks, penalties, greedy rows and seeded draws, on hand-made logits."""

from __future__ import annotations

import pytest
import torch

from engine.sampler import (
    Sampler,
    apply_min_p,
    apply_penalties,
    apply_top_k,
    apply_top_k_top_p,
    apply_top_p,
    make_generator,
    token_counts,
)
from engine.sampling_params import SamplingParams

CPU = torch.device("cpu")
PROBS = [0.5, 0.3, 0.15, 0.05]


def logits_of(*rows: list[float]) -> torch.Tensor:
    """Logits whose softmax is each given probability row."""
    return torch.tensor(rows, dtype=torch.float64).log().float()


def kept(masked: torch.Tensor) -> list[list[bool]]:
    return torch.isfinite(masked).tolist()


def run(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams], gens=None):
    batch = len(params)
    gens = gens if gens is not None else [None] * batch
    return sampler(logits, params, gens, [[] for _ in params], [[] for _ in params])


# --- top-k ---------------------------------------------------------------------------------


def test_top_k_keeps_exactly_the_k_largest_and_leaves_their_values():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0, 0.0]])
    masked = apply_top_k(logits, torch.tensor([2]))
    assert kept(masked) == [[False, True, True, False, False]]
    assert masked[0, 1] == 4.0 and masked[0, 2] == 3.0


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0]])
    assert kept(apply_top_k(logits, torch.tensor([1]))) == [[False, True, True, False]]
    assert kept(apply_top_k(logits, torch.tensor([2]))) == [[False, True, True, False]]


def test_top_k_zero_or_larger_than_vocab_keeps_everything():
    logits = logits_of(PROBS, PROBS)
    masked = apply_top_k(logits, torch.tensor([0, 10]))
    assert torch.equal(masked, logits)


def test_top_k_applies_each_rows_own_k():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]] * 3)
    masked = apply_top_k(logits, torch.tensor([1, 3, 0]))
    assert kept(masked) == [
        [True, False, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]


# --- top-p ---------------------------------------------------------------------------------


def test_top_p_keeps_smallest_set_reaching_p_on_an_exact_boundary():
    # 0.5 + 0.3 reaches 0.8 exactly: the nucleus is the first two tokens, not three.
    masked = apply_top_p(logits_of(PROBS), torch.tensor([0.8]))
    assert kept(masked) == [[True, True, False, False]]


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.3, [True, False, False, False]),
        (0.5, [True, False, False, False]),
        (0.51, [True, True, False, False]),
        (0.9, [True, True, True, False]),
        (0.96, [True, True, True, True]),
        (1.0, [True, True, True, True]),
    ],
)
def test_top_p_nucleus_for_each_threshold(top_p, expected):
    assert kept(apply_top_p(logits_of(PROBS), torch.tensor([top_p]))) == [expected]


def test_top_p_always_keeps_the_top_token():
    masked = apply_top_p(logits_of([0.9, 0.1]), torch.tensor([1e-6]))
    assert kept(masked) == [[True, False]]


def test_top_p_does_not_depend_on_token_order():
    order = [2, 0, 3, 1]
    shuffled = logits_of([PROBS[i] for i in order])
    masked = apply_top_p(shuffled, torch.tensor([0.8]))
    assert kept(masked) == [[PROBS[i] >= 0.3 for i in order]]


def test_top_p_keeps_tokens_tied_with_the_last_one_kept():
    # Either 0.25 would complete 0.4 + 0.25 >= 0.6; picking one of equals arbitrarily would make
    # the result depend on the sort, so both stay.
    masked = apply_top_p(logits_of([0.4, 0.25, 0.25, 0.1]), torch.tensor([0.6]))
    assert kept(masked) == [[True, True, True, False]]


def test_top_p_applies_each_rows_own_p():
    masked = apply_top_p(logits_of(PROBS, PROBS, PROBS), torch.tensor([0.5, 0.8, 1.0]))
    assert kept(masked) == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, True],
    ]


def test_top_p_measures_mass_after_top_k_renormalises():
    # After top-k 2 the survivors weigh 0.625 and 0.375: 0.7 needs both, 0.6 only the first
    # (measured before renormalising, 0.5 < 0.6 would have kept both).
    logits = logits_of(PROBS, PROBS)
    masked = apply_top_k_top_p(logits, torch.tensor([2, 2]), torch.tensor([0.7, 0.6]))
    assert kept(masked) == [[True, True, False, False], [True, False, False, False]]


def test_top_k_and_top_p_mixed_per_row_in_one_batch():
    logits = logits_of(PROBS, PROBS, PROBS)
    masked = apply_top_k_top_p(logits, torch.tensor([3, 0, 1]), torch.tensor([1.0, 0.8, 1.0]))
    assert kept(masked) == [
        [True, True, True, False],
        [True, True, False, False],
        [True, False, False, False],
    ]


def reference_top_p_keep(row: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus by a full float64 sort: the most likely tokens until their mass reaches top_p.

    "Reaches" allows the sampler's 1e-6 slack, which settles exact boundaries like 0.5 + 0.3.
    """
    probs, order = row.double().softmax(dim=-1).sort(descending=True)
    size = max(1, int((probs.cumsum(dim=-1) - probs < top_p - 1e-6).sum()))
    size = len(row) if top_p >= 1.0 else size
    keep = torch.zeros_like(row, dtype=torch.bool)
    keep[order[:size]] = True
    return keep


def test_top_p_matches_a_full_sort_when_nuclei_outgrow_the_first_candidates():
    # Flat rows put thousands of tokens in the nucleus, past the first ranked candidates.
    gen = torch.Generator().manual_seed(5)
    scales = torch.tensor([[0.3], [1.0], [8.0], [0.05], [2.0], [1.0]])
    logits = torch.randn(6, 20_000, generator=gen) * scales
    top_p = torch.tensor([0.9, 0.95, 0.9, 0.5, 0.99, 1.0])
    masked = apply_top_p(logits, top_p)
    for row in range(6):
        expected = reference_top_p_keep(logits[row], float(top_p[row]))
        assert torch.equal(torch.isfinite(masked[row]), expected), f"row {row}"
    assert torch.isfinite(masked[3]).sum() > 2048  # the widest case really widened


# --- min-p ---------------------------------------------------------------------------------


def test_min_p_drops_tokens_below_fraction_of_top_probability():
    logits = logits_of(PROBS, PROBS, PROBS)
    masked = apply_min_p(logits, torch.tensor([0.2, 0.5, 0.0]))
    # floors: 0.1 keeps three, 0.25 keeps two, 0 keeps all
    assert kept(masked) == [
        [True, True, True, False],
        [True, True, False, False],
        [True, True, True, True],
    ]
    assert torch.equal(masked[2], logits[2])


def test_min_p_is_measured_on_the_temperature_scaled_distribution():
    # At temperature 0.5 the probabilities become ∝ p², so 0.15 falls below 0.2 * max.
    params = SamplingParams(temperature=0.5, min_p=0.2)
    logits = logits_of(PROBS)
    squared = torch.tensor(PROBS) ** 2 / sum(p * p for p in PROBS)
    assert squared[2] < 0.2 * squared[0] < squared[1]
    torch.manual_seed(0)
    draws = run(Sampler(), logits.expand(4000, -1), [params] * 4000)
    assert set(draws.tolist()) == {0, 1}


# --- penalties -----------------------------------------------------------------------------


def test_token_counts_counts_each_rows_ids_including_repeats_and_empty_rows():
    counts = token_counts([[3, 3, 1], [], [0]], 4, CPU)
    assert counts.tolist() == [[0, 1, 0, 2], [0, 0, 0, 0], [1, 0, 0, 0]]


def test_token_counts_rejects_ids_outside_the_vocab():
    with pytest.raises(ValueError, match="token ids must be in"):
        token_counts([[0, 4]], 4, CPU)


def test_penalties_exact_values():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0]])
    prompt, output = [[0, 1]], [[3, 3, 2]]
    output_counts = token_counts(output, 5, CPU)
    seen = (token_counts(prompt, 5, CPU) + output_counts) > 0
    out = apply_penalties(
        logits,
        seen,
        output_counts,
        repetition_penalty=torch.tensor([2.0]),
        frequency_penalty=torch.tensor([0.5]),
        presence_penalty=torch.tensor([0.25]),
    )
    # 0: prompt, positive -> /2.  1: prompt, negative -> *2.  2: output once -> /2, -0.5, -0.25.
    # 3: output twice -> /2, -1.0, -0.25.  4: never seen -> untouched.
    assert out.tolist() == [[1.0, -2.0, -0.5, 0.25, 1.0]]


def test_frequency_and_presence_penalties_ignore_prompt_tokens():
    params = SamplingParams(temperature=0.0, frequency_penalty=2.0, presence_penalty=2.0)
    logits = torch.tensor([[5.0, 4.0, 0.0]])
    # token 0 fills the prompt but was never generated, so it stays the argmax.
    token = Sampler()(logits, [params], [None], [[0] * 10], [[1]])
    assert token.tolist() == [0]
    # generated once it drops by 2 + 2 and token 1 wins.
    token = Sampler()(logits, [params], [None], [[]], [[0]])
    assert token.tolist() == [1]


def test_repetition_penalty_covers_prompt_and_output_tokens():
    params = SamplingParams(temperature=0.0, repetition_penalty=4.0)
    logits = torch.tensor([[4.0, 3.0, 2.0]])
    assert Sampler()(logits, [params], [None], [[0]], [[]]).tolist() == [1]
    assert Sampler()(logits, [params], [None], [[]], [[0, 1]]).tolist() == [2]


def test_penalties_touch_only_rows_that_ask_for_them():
    logits = torch.tensor([[3.0, 2.0], [3.0, 2.0]])
    plain = SamplingParams(temperature=0.0)
    penalised = SamplingParams(temperature=0.0, frequency_penalty=2.0)
    tokens = Sampler()(logits, [plain, penalised], [None, None], [[], []], [[0], [0]])
    assert tokens.tolist() == [0, 1]
    assert logits.tolist() == [[3.0, 2.0], [3.0, 2.0]]  # the caller's logits are not modified


# --- greedy --------------------------------------------------------------------------------


def test_greedy_rows_are_argmax_while_other_rows_sample():
    torch.manual_seed(0)
    logits = torch.randn(16, 1000)
    greedy = SamplingParams(temperature=0.0, top_k=5, top_p=0.1, min_p=0.9)
    hot = SamplingParams(temperature=5.0)
    params = [greedy if i % 2 == 0 else hot for i in range(16)]
    tokens = run(Sampler(), logits, params)
    assert tokens.dtype == torch.int64 and tokens.shape == (16,)
    assert torch.equal(tokens[0::2], logits[0::2].argmax(dim=-1))
    assert not torch.equal(tokens[1::2], logits[1::2].argmax(dim=-1))


def test_top_k_one_samples_the_argmax():
    torch.manual_seed(0)
    logits = torch.randn(8, 500)
    tokens = run(Sampler(), logits, [SamplingParams(temperature=1.5, top_k=1)] * 8)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_masked_tokens_are_never_sampled():
    torch.manual_seed(0)
    params = SamplingParams(temperature=1.0, top_p=0.8)
    draws = run(Sampler(), logits_of(PROBS).expand(5000, -1), [params] * 5000)
    assert set(draws.tolist()) == {0, 1}


# --- seeded sampling -----------------------------------------------------------------------


def test_make_generator_is_none_without_seed_and_repeatable_with_one():
    assert make_generator(None, CPU) is None
    a, b = make_generator(7, CPU), make_generator(7, CPU)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))


STEPS, VOCAB = 50, 2000
TRACKED = SamplingParams(temperature=0.8, top_p=0.9, top_k=100, seed=1234, presence_penalty=0.5)


def logits_stream(batch: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(99)
    return [torch.randn(batch, VOCAB, generator=gen) * 3 for _ in range(STEPS)]


def decode(
    params: list[SamplingParams], stream: list[torch.Tensor], device: torch.device = CPU
) -> list[list[int]]:
    """Feed each step's tokens back as output_ids, as the engine does."""
    sampler = Sampler()
    gens = [make_generator(p.seed, device) for p in params]
    outputs: list[list[int]] = [[] for _ in params]
    for logits in stream:
        tokens = sampler(logits.to(device), params, gens, [[1, 2, 3] for _ in params], outputs)
        assert tokens.device == logits.to(device).device
        for row, token in zip(outputs, tokens.tolist(), strict=True):
            row.append(token)
    return outputs


def test_seeded_request_repeats_its_tokens_across_runs():
    stream = logits_stream(1)
    assert decode([TRACKED], stream) == decode([TRACKED], stream)


@pytest.mark.parametrize("position", [0, 5, 7])
def test_seeded_request_is_independent_of_batch_mates_and_row_position(position):
    alone = decode([TRACKED], [step[:1] for step in logits_stream(8)])[0]
    others = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, seed=1234),  # same seed, different params
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.2, top_k=5, seed=5),
        SamplingParams(temperature=1.0, min_p=0.1, frequency_penalty=1.0),
        SamplingParams(temperature=0.9, top_p=0.5, seed=77),
        SamplingParams(temperature=1.0, repetition_penalty=1.3),
    ]
    params = others[:position] + [TRACKED] + others[position:]
    # The tracked row sees the same logits at every step wherever it sits in the batch.
    stream = logits_stream(8)
    stream = [torch.cat([s[1 : position + 1], s[:1], s[position + 1 :]]) for s in stream]
    # The unseeded rows' draws differ from case to case; the tracked row's must not.
    torch.manual_seed(position)
    assert decode(params, stream)[position] == alone
    assert len(set(alone)) > 10  # it really sampled rather than collapsing to argmax


def test_seeded_rows_leave_the_default_rng_alone():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    decode([TRACKED, SamplingParams(seed=1)], logits_stream(2)[:5])
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_request_on_cuda_is_independent_of_batch_mates():
    cuda = torch.device("cuda")
    alone = decode([TRACKED], [step[:1] for step in logits_stream(3)], cuda)[0]
    others = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.9, seed=8)]
    stream = [torch.cat([s[1:], s[:1]]) for s in logits_stream(3)]
    assert decode([*others, TRACKED], stream, cuda)[2] == alone


# --- distribution --------------------------------------------------------------------------


def chi_square(draws: torch.Tensor, probs: list[float]) -> float:
    counts = torch.bincount(draws, minlength=len(probs)).double()
    expected = torch.tensor(probs, dtype=torch.float64) * len(draws)
    return float(((counts - expected) ** 2 / expected).sum())


# 99.9th percentile of chi-square with 3 degrees of freedom.
CHI2_3DF_999 = 16.27
N = 40_000


def test_unseeded_temperature_one_matches_the_distribution():
    torch.manual_seed(0)
    draws = run(Sampler(), logits_of(PROBS).expand(N, -1), [SamplingParams()] * N)
    assert chi_square(draws, PROBS) < CHI2_3DF_999


def test_seeded_draws_match_the_distribution():
    sampler, gen = Sampler(), make_generator(2024, CPU)
    params, logits = [SamplingParams(seed=2024)], logits_of(PROBS)
    draws = torch.cat([sampler(logits, params, [gen], [[]], [[]]) for _ in range(4000)])
    assert chi_square(draws, PROBS) < CHI2_3DF_999


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_reshapes_the_distribution_to_p_to_the_one_over_t(temperature):
    tempered = [p ** (1 / temperature) for p in PROBS]
    tempered = [p / sum(tempered) for p in tempered]
    torch.manual_seed(1)
    params = [SamplingParams(temperature=temperature)] * N
    draws = run(Sampler(), logits_of(PROBS).expand(N, -1), params)
    assert chi_square(draws, tempered) < CHI2_3DF_999
    # and it is measurably not the untempered distribution
    assert chi_square(draws, PROBS) > 100


def test_low_temperature_concentrates_on_the_top_token():
    torch.manual_seed(2)
    params = [SamplingParams(temperature=0.05)] * 2000
    draws = run(Sampler(), logits_of(PROBS).expand(2000, -1), params)
    # p ** 20 puts 1 - 4e-5 of the mass on token 0.
    assert draws.eq(0).all()
