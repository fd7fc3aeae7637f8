"""The first token of an "auto" turn chooses, under constraint, between a call and an answer
(SamplingParams.tool_call_threshold), and call_params sample inside the calls."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.constrained.choice import opener_ids
from engine.constrained.grammar import OPEN_TAG
from engine.constrained.masks import ToolConstraints
from engine.engine_core import LLMEngine
from engine.tool_parser import parse_tool_calls
from tests.helpers.engine_steps import run_requests
from tests.helpers.tools import TOOLS

CHAT = [{"role": "user", "content": "What is the weather like?"}]


@pytest.fixture(scope="module")
def random_engine(random_folder) -> LLMEngine:
    return LLM(random_folder, kv_cache_gib=0.05, max_model_len=1024).engine


def run(engine: LLMEngine, params: list[SamplingParams]):
    return run_requests(engine, engine.encode_chat(CHAT, TOOLS), params, TOOLS)


def test_openers_are_the_tokens_that_start_the_tag(smollm_tokenizer):
    constraints = ToolConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    openers = opener_ids(constraints.vocab.bytes)
    spelled = [constraints.vocab.bytes[i] for i in openers]
    assert b"<" in spelled and all(OPEN_TAG.startswith(b) or b.startswith(OPEN_TAG)
                                   for b in spelled)
    assert smollm_tokenizer.encode("<tool_call>", allow_special=False)[0] in openers


@pytest.mark.parametrize("opening_logit, chooses_call", [(12.0, True), (-12.0, False)])
def test_the_first_token_chooses_by_the_chance_of_the_tag(smollm_tokenizer, opening_logit,
                                                          chooses_call):
    constraints = ToolConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    matcher = constraints.matcher(TOOLS, "auto", [2], call_threshold=0.1)
    lt = smollm_tokenizer.encode("<", allow_special=False)[0]
    word = smollm_tokenizer.encode("Hello", allow_special=False)[0]
    row = torch.zeros(constraints.vocab.size)
    row[lt] = opening_logit
    matcher.mask_logits(row)
    assert matcher.chose_call is chooses_call
    if chooses_call:  # only the way into a call is left
        assert row[lt] > -torch.inf and row[word] == -torch.inf and matcher.in_call
    else:  # an answer: every opener is refused here, ordinary words are not
        assert torch.isinf(row[torch.from_numpy(constraints.openers)]).all()
        assert row[word] == 0.0 and not matcher.in_call


def test_without_a_threshold_auto_is_as_before(smollm_tokenizer):
    constraints = ToolConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    matcher = constraints.matcher(TOOLS, "auto", [2])
    assert not hasattr(matcher, "chose_call")


def test_a_low_threshold_makes_every_reply_one_valid_call(random_engine):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, tool_call_threshold=1e-9)
              for s in range(8)]
    for out in run(random_engine, params):
        parsed = parse_tool_calls(out.text)
        assert out.text.lstrip().startswith("<tool_call>"), out.text
        assert parsed.errors == [] and len(parsed.tool_calls) == 1, out.text


def test_a_threshold_of_one_never_opens_a_call_at_the_start(random_engine):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=3, tool_call_threshold=1.0)
              for s in range(8)]
    for out in run(random_engine, params):
        assert not out.text.startswith("<"), out.text


def test_call_params_sample_inside_the_call(random_engine):
    # Garbage logits at temperature 1: each seed writes other arguments; greedy inside the call
    # writes the same ones whatever the seed.
    def texts(call_params):
        params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, tool_choice="required",
                                 call_params=call_params) for s in range(4)]
        return {out.text for out in run(random_engine, params)}

    assert len(texts(None)) > 1
    assert len(texts(SamplingParams(temperature=0.0))) == 1


def test_bad_values_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="tool_call_threshold"):
        SamplingParams(tool_call_threshold=0.0)
    with pytest.raises(ValueError, match="call_params"):
        SamplingParams(call_params={"temperature": 0})
