"""Structured outputs (SamplingParams.structured_outputs): on a random-weight model over SmolLM2's
vocabulary, every constrained output is JSON that validates against its schema, greedy and
sampled; EOS comes only where the JSON is complete; schema errors and misuse are refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams, StructuredOutputs
from engine.constrained.json_schema import JSON_MAX_WS, JsonConstraints
from engine.engine_core import LLMEngine
from tests.helpers.engine_steps import run_requests
from tests.helpers.json_schema_check import schema_errors
from tests.helpers.tools import TOOLS

EOS = 2  # SmolLM2's <|im_end|>
CHAT = [{"role": "user", "content": "Answer in JSON."}]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Bounded strings and no extra properties: a random model's free strings would run to max_tokens.
SCHEMAS = {
    "required fields": {
        "type": "object", "additionalProperties": False, "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 12},
                       "age": {"type": "integer", "minimum": 0, "maximum": 150}}},
    "enums": {
        "type": "object", "additionalProperties": False, "required": ["unit", "ok"],
        "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}, "ok": {"type": "boolean"}}},
    "array": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    "nested": {
        "type": "object", "additionalProperties": False, "required": ["user"],
        "properties": {"user": {
            "type": "object", "additionalProperties": False, "required": ["id", "tags"],
            "properties": {"id": {"type": "integer"},
                           "tags": {"type": "array", "maxItems": 3,
                                    "items": {"type": "string", "maxLength": 5}}}}}},
    "numbers": {
        "type": "object", "additionalProperties": False, "required": ["x", "n", "k"],
        "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10},
                       "n": {"type": "null"}, "k": {"type": "integer", "exclusiveMinimum": 0,
                                                    "maximum": 99}}},
}


@pytest.fixture(scope="module")
def engine(random_folder) -> LLMEngine:
    return LLM(random_folder, kv_cache_gib=0.05, max_model_len=1024, max_num_seqs=16).engine


def run(engine: LLMEngine, params: list[SamplingParams], tools=None):
    return run_requests(engine, engine.encode_chat(CHAT), params, tools)


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_output_is_json_that_validates(engine, name):
    schema = SCHEMAS[name]
    so = StructuredOutputs(json=schema)
    params = [SamplingParams(temperature=0.0, max_tokens=300, structured_outputs=so)]
    params += [SamplingParams(temperature=1.0, seed=s, max_tokens=300, structured_outputs=so)
               for s in range(8)]
    for out in run(engine, params):
        assert out.finish_reason == "stop" and out.stop_reason == EOS, out.text
        assert schema_errors(json.loads(out.text), schema) == [], out.text
    assert engine.stats()["num_running"] == 0


def test_a_schema_given_as_text_works_the_same(engine):
    schema = SCHEMAS["enums"]
    as_dict = SamplingParams(temperature=1.0, seed=4, max_tokens=300,
                             structured_outputs=StructuredOutputs(json=schema))
    as_text = SamplingParams(temperature=1.0, seed=4, max_tokens=300,
                             structured_outputs=StructuredOutputs(json=json.dumps(schema)))
    a, b = run(engine, [as_dict, as_text])
    assert a.text == b.text and schema_errors(json.loads(a.text), schema) == []


def test_json_object_gives_objects_or_is_cut_by_max_tokens(engine):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=120,
                             structured_outputs=StructuredOutputs(json_object=True))
              for s in range(12)]
    outs = run(engine, params)
    for out in outs:
        assert out.text.lstrip().startswith("{"), out.text
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict), out.text
        else:  # the random model's strings run on: max_tokens cuts the JSON, and says so
            assert out.finish_reason == "length" and len(out.token_ids) == 120
    assert {o.finish_reason for o in outs} == {"stop", "length"}


def test_max_tokens_cutting_a_json_reports_length(engine):
    so = StructuredOutputs(json=SCHEMAS["nested"])
    out = run(engine, [SamplingParams(temperature=0.0, max_tokens=5, structured_outputs=so)])[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    with pytest.raises(ValueError):
        json.loads(out.text)


def test_without_end_ids_the_json_comes_first_then_free_text(engine):
    """ignore_eos: no end of turn to allow once the JSON is complete, so the constraint steps
    aside instead of masking every token."""
    schema = SCHEMAS["enums"]
    out = run(engine, [SamplingParams(temperature=1.0, seed=1, max_tokens=80, ignore_eos=True,
                                      structured_outputs=StructuredOutputs(json=schema))])[0]
    assert out.finish_reason == "length"
    value, end = json.JSONDecoder().raw_decode(out.text)
    assert schema_errors(value, schema) == [] and end < len(out.text)


@pytest.mark.parametrize("name", ["required fields", "array", "numbers"])
def test_eos_is_allowed_exactly_where_the_json_is_complete(smollm_tokenizer, name):
    schema = SCHEMAS[name]
    examples = {"required fields": {"name": "Ann", "age": 42},
                "array": [3, 1, 4],
                "numbers": {"x": -2.5, "n": None, "k": 17}}
    constraints = JsonConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    for text in (json.dumps(examples[name]), json.dumps(examples[name], indent=2)):
        matcher = constraints.matcher(StructuredOutputs(json=schema), [EOS])
        ids = smollm_tokenizer.encode(text, allow_special=False)
        for i, token in enumerate([*ids, EOS]):
            mask = matcher.disallowed()
            prefix = smollm_tokenizer.decode(ids[:i])
            try:
                complete = schema_errors(json.loads(prefix), schema) == []
            except ValueError:
                complete = False
            assert mask is not None and bool(mask[EOS]) == (not complete), (prefix, token)
            assert not mask[token], (prefix, token)  # the example itself always fits
            matcher.advance(token)


def test_whitespace_runs_are_bounded(smollm_tokenizer):
    constraints = JsonConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    matcher = constraints.matcher(StructuredOutputs(json_object=True), [EOS])
    space = smollm_tokenizer.encode(" ", allow_special=False)
    assert len(space) == 1
    matcher.advance(smollm_tokenizer.encode("{", allow_special=False)[0])
    for _ in range(JSON_MAX_WS):
        assert not matcher.disallowed()[space[0]]
        matcher.advance(space[0])
    assert matcher.disallowed()[space[0]]


def test_masks_reach_a_row_on_every_device(smollm_tokenizer):
    constraints = JsonConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    for device in DEVICES:
        matcher = constraints.matcher(StructuredOutputs(json_object=True), [EOS])
        row = torch.zeros(smollm_tokenizer.vocab_size, device=device, dtype=torch.bfloat16)
        matcher.mask_logits(row)
        allowed = torch.isfinite(row).nonzero().flatten().cpu().tolist()
        texts = {smollm_tokenizer.decode([t]).lstrip(" \t\r\n") for t in allowed}
        # An object's start, possibly after whitespace: '{', '{"', '{}', or whitespace alone.
        assert "{" in texts and all(t == "" or t.startswith("{") for t in texts), texts


@pytest.mark.parametrize("schema, named", [
    ({"type": "objekt"}, "objekt"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "minimum"),
    ('{"type": "object",', "not valid JSON"),
    ("[1, 2]", "JSON Schema object"),
])
def test_a_bad_schema_is_a_value_error_naming_it(engine, schema, named):
    params = SamplingParams(structured_outputs=StructuredOutputs(json=schema))
    with pytest.raises(ValueError, match=named) as info:
        engine.add_request("bad", [1, 2, 3], params)
    assert "StructuredOutputs.json" in str(info.value)
    assert "bad" not in engine._requests and engine.stats()["num_waiting"] == 0


def test_structured_outputs_take_exactly_one_form():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputs()
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputs(json={"type": "object"}, json_object=True)
    with pytest.raises(ValueError, match="StructuredOutputs.json must be"):
        StructuredOutputs(json=3)
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"json_object": True})


def test_structured_output_with_a_tool_constraint_is_refused(engine):
    so = StructuredOutputs(json_object=True)
    for choice in ("auto", "required"):
        with pytest.raises(ValueError, match="cannot be combined with tool calls"):
            engine.add_request("both", [1, 2, 3], SamplingParams(structured_outputs=so,
                                                                 tool_choice=choice), tools=TOOLS)
        assert "both" not in engine._requests
    # Tools that constrain nothing ("none") leave the JSON constraint alone.
    out = run(engine, [SamplingParams(temperature=0.0, max_tokens=300, tool_choice="none",
                                      structured_outputs=StructuredOutputs(json=SCHEMAS["array"]))],
              tools=TOOLS)[0]
    assert schema_errors(json.loads(out.text), SCHEMAS["array"]) == []


def test_without_llguidance_only_structured_requests_fail(random_folder, monkeypatch):
    engine = LLM(random_folder, kv_cache_gib=0.05, max_model_len=1024).engine
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance raises ImportError
    params = SamplingParams(structured_outputs=StructuredOutputs(json_object=True))
    with pytest.raises(ValueError, match="needs the llguidance package"):
        engine.add_request("json", [1, 2, 3], params)
    out = run(engine, [SamplingParams(temperature=0.0, max_tokens=4)])[0]
    assert out.finish_reason == "length"


def test_importing_the_engine_does_not_import_llguidance():
    code = ("import sys, engine, engine.engine_core, engine.async_llm; "
            "from engine import LLM, SamplingParams, StructuredOutputs; "
            "sys.exit('llguidance' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_preempted_json_requests_keep_their_grammar_state(random_folder, engine):
    small = LLM(random_folder, kv_cache_gib=24 * 16 * 2 * 2 * 2 * 16 * 4 / 2**30,
                max_model_len=1024, max_num_batched_tokens=256).engine
    so = StructuredOutputs(json=SCHEMAS["nested"])
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=300, structured_outputs=so)
              for s in range(8)]
    outs = run(small, params)
    assert small.stats()["num_preemptions"] > 0
    assert [o.text for o in outs] == [o.text for o in run(engine, params)]


def test_disallowed_is_a_row_of_the_models_vocabulary(smollm_tokenizer):
    """A model whose vocabulary is padded past the tokenizer's: the ids past it never come."""
    constraints = JsonConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size + 64)
    mask = constraints.matcher(StructuredOutputs(json_object=True), [EOS]).disallowed()
    assert mask.shape == (smollm_tokenizer.vocab_size + 64,) and mask.dtype == np.bool_
    assert mask[-64:].all()


@pytest.fixture(scope="module")
def smollm(embedded_llm):
    return embedded_llm


def test_the_embedded_model_answers_a_schema_with_its_own_values(smollm):
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
              "properties": {"city": {"type": "string"}, "country": {"type": "string"}}}
    out = smollm.chat([{"role": "user", "content": "Name the capital of France and its country "
                                                   "as JSON with keys city and country."}],
                      SamplingParams(temperature=0.0, max_tokens=60,
                                     structured_outputs=StructuredOutputs(json=schema))).output
    value = json.loads(out.text)
    assert out.finish_reason == "stop" and schema_errors(value, schema) == [], out.text
    assert "paris" in value["city"].lower(), out.text
