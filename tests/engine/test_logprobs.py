"""SamplingParams.logprobs: the sampled token's logprob and the top k, from the model's raw
distribution, against transformers' log_softmax of the same logits; aligned with the tokens when
streamed, batched, preempted; and computed only for the rows that ask."""

from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams, StructuredOutputs, TokenLogprob
from engine import model_runner as runner_module
from engine.logprobs import StepLogprobs
from tests.helpers.hf_reference import build_tiny_checkpoint, load_reference, prefill_logits

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FAMILIES = ["llama", "qwen3"]
STEPS = 16
TOP = 5
# float32 rounding: the two log-softmaxes differed by at most 5e-6 on these models.
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    folder = build_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    return str(folder), load_reference(folder)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 384) for _ in range(rng.randrange(5, 50))] for _ in range(n)]


def reference_logprobs(ref_model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), vocab]: transformers' log_softmax of the logits each output token was drawn
    from (the same prefix, teacher-forced)."""
    logits = prefill_logits(ref_model, prompt + output)
    return logits[len(prompt) - 1 : len(prompt) + len(output) - 1].log_softmax(dim=-1)


def check_against(ref_model, prompt: list[int], out_ids: list[int], lps: list[TokenLogprob],
                  k: int) -> None:
    theirs = reference_logprobs(ref_model, prompt, out_ids)
    assert len(lps) == len(out_ids)
    for step, (token, lp) in enumerate(zip(out_ids, lps, strict=True)):
        assert lp.token_id == token
        assert abs(lp.logprob - theirs[step, token].item()) < TOLERANCE, step
        assert len(lp.top) == k
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        for token_id, value in lp.top:
            assert abs(value - theirs[step, token_id].item()) < TOLERANCE
        # The top k are the k most likely: nothing outside them beats the least of them.
        if k:
            outside = theirs[step].clone()
            outside[[t for t, _ in lp.top]] = -torch.inf
            assert outside.max().item() <= values[-1] + TOLERANCE


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_logprobs_equal_transformers_log_softmax(tiny, device):
    folder, ref = tiny
    llm = LLM(folder, device=device, kv_cache_gib=0.01)
    batch = prompts(4)
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True,
                                              logprobs=TOP))
    for prompt, out in zip(batch, outs, strict=True):
        check_against(ref, prompt, out.token_ids, out.logprobs, TOP)
        # Greedy: the sampled token is the most likely one.
        assert all(lp.top[0][0] == lp.token_id for lp in out.logprobs)


def test_logprobs_equal_our_own_logits_to_float32_rounding(tiny):
    folder, _ = tiny
    llm = LLM(folder, kv_cache_gib=0.01)
    prompt = prompts(1, seed=3)[0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                                logprobs=3))[0]
    logits = llm.engine.runner.prefill_logits(prompt + out.token_ids)
    ours = logits[len(prompt) - 1 : -1].log_softmax(dim=-1)
    for step, lp in enumerate(out.logprobs):
        assert lp.logprob == pytest.approx(ours[step, lp.token_id].item(), abs=1e-5)
        assert [t for t, _ in lp.top] == ours[step].topk(3).indices.tolist()


def test_logprobs_are_the_raw_distribution_whatever_the_sampler_does(tiny):
    """Temperature, penalties and top-k reshape what is drawn from, not the logprobs reported."""
    folder, ref = tiny
    llm = LLM(folder, kv_cache_gib=0.01)
    prompt = prompts(1, seed=5)[0]
    params = SamplingParams(temperature=1.7, top_k=7, top_p=0.9, repetition_penalty=1.3,
                            frequency_penalty=0.5, seed=11, max_tokens=STEPS, ignore_eos=True,
                            logprobs=2)
    out = llm.generate([prompt], params)[0]
    check_against(ref, prompt, out.token_ids, out.logprobs, 2)


def test_preempted_requests_keep_their_logprobs_aligned(tiny):
    folder, ref = tiny
    # 12 blocks of 16 for eight requests of 40 + 16 tokens: preemption is certain.
    llm = LLM(folder, kv_cache_gib=12 * 16 * 2 * 2 * 2 * 16 * 4 / 2**30, max_num_batched_tokens=64)
    rng = random.Random(2)
    batch = [[rng.randrange(1, 384) for _ in range(40)] for _ in range(8)]
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True,
                                              logprobs=1))
    assert llm.engine.stats()["num_preemptions"] > 0
    for prompt, out in zip(batch, outs, strict=True):
        check_against(ref, prompt, out.token_ids, out.logprobs, 1)


def test_streamed_deltas_align_with_tokens_and_only_askers_get_logprobs(tiny):
    folder, _ = tiny
    engine = LLM(folder, kv_cache_gib=0.01).engine
    batch = prompts(3, seed=9)
    asks = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0),
            SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
            SamplingParams(temperature=0.8, seed=1, max_tokens=6, ignore_eos=True, logprobs=4)]
    for i, (prompt, params) in enumerate(zip(batch, asks, strict=True)):
        engine.add_request(f"r{i}", prompt, params)
    seen: dict[str, list[TokenLogprob]] = {"r0": [], "r1": [], "r2": []}
    last = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert len(out.delta_logprobs) == (len(out.delta_token_ids)
                                               if out.request_id != "r1" else 0)
            assert [lp.token_id for lp in out.delta_logprobs] == (
                out.delta_token_ids if out.request_id != "r1" else [])
            seen[out.request_id] += out.delta_logprobs
            last[out.request_id] = out
    assert last["r1"].logprobs is None and seen["r1"] == []
    assert last["r0"].logprobs == seen["r0"] and all(lp.top == [] for lp in seen["r0"])
    assert last["r2"].logprobs == seen["r2"] and all(len(lp.top) == 4 for lp in seen["r2"])
    assert [lp.token_id for lp in seen["r2"]] == last["r2"].token_ids


def test_rows_that_do_not_ask_pay_nothing(tiny, monkeypatch):
    folder, _ = tiny
    llm = LLM(folder, kv_cache_gib=0.01)
    made: list[StepLogprobs] = []

    class Spy(StepLogprobs):
        def __init__(self, logits, ks):
            super().__init__(logits, ks)
            made.append(self)

    monkeypatch.setattr(runner_module, "StepLogprobs", Spy)
    batch = prompts(3, seed=4)
    llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert made == []  # no log-softmax at all without a request that asks
    params = [SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=None),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=None)]
    llm.generate(batch, params)
    assert made and all(step.logprobs.shape[0] == 1 for step in made)  # the one row that asks


def test_logprobs_ignore_the_constraint_masks(random_folder):
    """A JSON constraint decides what may be drawn; the reported logprobs are still the model's."""
    llm = LLM(random_folder, kv_cache_gib=0.05, max_model_len=1024)
    prompt = llm.engine.encode_chat([{"role": "user", "content": "JSON please"}])
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=2,
                            structured_outputs=StructuredOutputs(json_object=True))
    out = llm.generate([prompt], params)[0]
    logits = llm.engine.runner.prefill_logits(prompt + out.token_ids)
    raw = logits[len(prompt) - 1 : len(prompt) - 1 + len(out.token_ids)].log_softmax(dim=-1)
    assert out.text.startswith("{")
    for step, lp in enumerate(out.logprobs):
        assert lp.logprob == pytest.approx(raw[step, lp.token_id].item(), abs=1e-5)
        assert [t for t, _ in lp.top] == raw[step].topk(2).indices.tolist()
    # The model's own favourite is not '{' at the first step: the mask, not the model, chose it.
    assert out.logprobs[0].top[0][0] != out.token_ids[0]


@pytest.mark.parametrize("bad", [-1, 21, 2.0, True])
def test_logprobs_out_of_range_are_refused(bad):
    with pytest.raises(ValueError, match="SamplingParams.logprobs"):
        SamplingParams(logprobs=bad)


def test_logprobs_k_above_the_vocabulary_gives_the_whole_vocabulary():
    logits = torch.randn(2, 7)
    step = StepLogprobs(logits, [20, None])
    (lp, none) = step.finish(logits.argmax(dim=-1))
    assert none is None and len(lp.top) == 7
    assert lp.logprob == pytest.approx(logits[0].log_softmax(-1).max().item())
