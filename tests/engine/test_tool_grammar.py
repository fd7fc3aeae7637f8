"""The tool-call automaton and its token masks, on SmolLM2's real byte-level vocabulary."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from engine.constrained.grammar import MAX_WS, CallGrammar, tool_specs
from engine.constrained.masks import CallMasks, ToolConstraints
from engine.constrained.vocab import TokenVocab

EOS = 2  # SmolLM2's <|im_end|>
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"enum": ["celsius", "fahrenheit"]},
                                         "days": {"type": "integer"},
                                         "hourly": {"type": "boolean"}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {}}, "additionalProperties": True}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object",
                                                                    "properties": {}}}},
]
VALID_CALLS = [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    "</tool_call>",
    '<tool_call>\n{"name":"search","arguments":{"q":[1,-2.5e+3,0,true,false,null,'
    '{"a":"\\u00e9\\n\\"x\\""}],"nested":{"k":[]},"s":"caf\u00e9 \U0001f980"}}\n</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"days": -12, "hourly": false}}</tool_call>',
    '<tool_call>{ "name" : "now" , "arguments" : { } }</tool_call>',
]
CALL = '<tool_call>{"name": "search", "arguments": {'


@pytest.fixture(scope="module")
def vocab(smollm_tokenizer) -> TokenVocab:
    return TokenVocab(smollm_tokenizer, smollm_tokenizer.vocab_size)


def grammar(mode: str = "required", tools=TOOLS) -> CallGrammar:
    return CallGrammar(tool_specs(tools), mode)


def accepts(text: str, mode: str = "required") -> bool:
    g = grammar(mode)
    return g.walk(g.initial, text.encode()) is not None


@pytest.mark.parametrize("call", VALID_CALLS)
def test_valid_calls_are_accepted_byte_by_byte_and_end_the_turn(call):
    g = grammar()
    state = g.initial
    for b in call.encode():
        assert not g.may_end(state)
        state = g.step(state, b)
        assert state is not None
    assert g.may_end(state)
    assert g.step(state, ord(" ")) is None  # a forced turn is one call, then the end


@pytest.mark.parametrize("bad", [  # "|" marks where the valid prefix ends
    '<tool_call>{"name": "get_weather|X',  # unknown tool
    '<tool_call>{"name": "search", |"name"',  # a second "name" key
    '<tool_call>{|"arguments"',  # arguments before name
    '<tool_call>{"name": "search"|}',  # "}" before the arguments
    '<tool_call>{"name": "search", "arguments": |[',  # arguments not an object
    CALL + '"q": "a|\nb"',  # unescaped control byte in a string
    CALL + '"q": "\\|x"',  # unknown escape
    CALL + '"q": 1,|}',  # trailing comma in an object
    CALL + '"q": [1,|]',  # trailing comma in an array
    CALL + '"q": 0|1',  # leading zero
    CALL + '"q": tru| ',  # broken literal
    CALL + "|'q'",  # single quotes
    '<tool_call>{"name": "get_weather", "arguments": {"|town"',  # undeclared property
    '<tool_call>{"name": "get_weather", "arguments": {"unit": "|kelvin',  # not in the enum
    '<tool_call>{"name": "get_weather", "arguments": {"days": 1|.5',  # not an integer
    '<tool_call>{"name": "get_weather", "arguments": {"hourly": |"yes',  # not a boolean
    '<tool_call>{"name": "now", "arguments": {|"',  # a tool without arguments
    "<tool_call>" + " " * MAX_WS + "| ",  # whitespace runs are bounded
    '<tool_call>{"name": "now", "arguments": {}}</tool_call>|x',  # text after a forced call
    "|x<tool_call>",  # a forced call starts the output: no text before it
    " " * MAX_WS + "| <tool_call>",  # only a short whitespace run (SentencePiece's "▁<")
])
def test_invalid_continuations_are_refused(bad):
    prefix, rest = bad.split("|")
    assert accepts(prefix)
    assert not accepts(prefix + rest)


def test_auto_mode_allows_text_around_calls_and_constrains_only_the_calls():
    assert accepts('Sure. <tool <tool_call>{"name": "now", "arguments": {}}</tool_call> and '
                   '<tool_call>{"name": "now", "arguments": {}}</tool_call> done', "auto")
    assert not accepts('Sure. <tool_call>{"name": "later"', "auto")


def test_special_tokens_are_refused_inside_a_call_and_only_end_of_turn_after_it(vocab):
    g = grammar()
    masks = CallMasks(g, vocab, [EOS])
    inside = g.walk(g.initial, CALL.encode())
    assert masks.disallowed(inside)[[0, 1, EOS]].all()
    after = g.walk(g.initial, VALID_CALLS[0].encode())
    assert (~masks.disallowed(after)).nonzero()[0].tolist() == [EOS]
    assert masks.disallowed(g.walk(g.initial, b"<tool_call>{")).sum() < vocab.size


def brute_force_allowed(g: CallGrammar, vocab: TokenVocab, state, end_ids) -> set[int]:
    allowed = {i for i, b in enumerate(vocab.bytes) if b and g.walk(state, b) is not None}
    if g.in_free_text(state):
        allowed |= {i for i, b in enumerate(vocab.bytes) if b is None}
    elif g.may_end(state):
        allowed |= set(end_ids)
    return allowed


@pytest.mark.parametrize("mode,text", [
    ("required", ""),
    ("required", "<tool_call>"),
    ("required", '<tool_call>{"name": "'),
    ("required", '<tool_call>{"name": "get_weather", "arguments": {"unit": "c'),
    ("required", '<tool_call>{"name": "get_weather", "arguments": {"days": 4'),
    ("required", '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'),
    ("required", CALL + '"q": [1.5'),
    ("required", CALL + '"q": {"deep": "text \\'),
    ("required", CALL + '"q": 1} '),
    ("auto", "Let me look. "),
    ("auto", "Let me look. <tool_call"),
    ("auto", "Let me look. <tool_c"),
])
def test_masks_equal_a_brute_force_walk_of_every_token(vocab, mode, text):
    g = grammar(mode)
    state = g.walk(g.initial, text.encode())
    mask = CallMasks(g, vocab, [EOS]).disallowed(state)
    got = set(range(vocab.size)) if mask is None else set((~mask).nonzero()[0].tolist())
    assert got == brute_force_allowed(g, vocab, state, [EOS])


def test_free_text_refuses_only_tokens_that_open_a_broken_call(vocab):
    g = grammar("auto")
    masks = CallMasks(g, vocab, [EOS])
    assert masks.disallowed(g.initial) is None  # nothing in SmolLM2's vocabulary holds the tag
    mask = masks.disallowed(g.walk(g.initial, b"Sure <tool_call"))
    refused = {vocab.bytes[i] for i in mask.nonzero()[0].tolist()}
    assert b">>" in refused and b">" not in refused and b"x" not in refused
    assert all(b.startswith(b">") for b in refused)


def test_tool_choice_is_validated_with_the_field_named():
    for bad in ["sometimes", {"type": "function"}, {"type": "function", "function": {}},
                {"function": {"name": "x"}}, 3]:
        with pytest.raises(ValueError, match="SamplingParams.tool_choice"):
            SamplingParams(tool_choice=bad)


def test_forced_tool_choice_needs_the_tool_among_those_offered(smollm_tokenizer):
    constraints = ToolConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    with pytest.raises(ValueError, match="tool_choice.*needs tools"):
        constraints.matcher(None, "required", [EOS])
    named = {"type": "function", "function": {"name": "send_email"}}
    with pytest.raises(ValueError, match="send_email.*get_weather, now, search"):
        constraints.matcher(TOOLS, named, [EOS])
    with pytest.raises(ValueError, match=r"tools\[1\]"):
        constraints.matcher([TOOLS[0], {"function": {}}], "auto", [EOS])
    assert constraints.matcher(TOOLS, "none", [EOS]) is None
    assert constraints.matcher(None, "auto", [EOS]) is None


NOW = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'


@pytest.mark.parametrize("mode,can_end", [("auto", True), ("auto", False),
                                          ("required", False)])
def test_a_one_call_grammar_refuses_a_second_call(mode, can_end):
    many = CallGrammar(tool_specs(TOOLS), mode, can_end=can_end)
    one = CallGrammar(tool_specs(TOOLS), mode, can_end=can_end, single=True)
    first = "Sure. " + NOW if mode == "auto" else NOW
    assert many.walk(many.initial, (first + "\n" + NOW).encode()) is not None
    after = one.walk(one.initial, first.encode())
    assert after is not None and one.may_end(after)
    assert one.walk(after, ("\n" + NOW).encode()) is None
    assert one.walk(after, b"\n<tool_call") is not None  # the tag is refused only once whole
    if not can_end:  # text may follow the call, as long as it opens no other
        assert one.walk(after, b" done, <tool>") is not None


def test_a_one_call_grammar_refuses_a_second_llama_call_in_free_text():
    one = CallGrammar(tool_specs(TOOLS), "auto", can_end=False, dialect="llama3", single=True)
    text = 'Sure. <tool_call>{"name": "now", "parameters": {}}</tool_call>'
    after = one.walk(one.initial, text.encode())
    assert after is not None and one.walk(after, text.encode()[6:]) is None


def test_parallel_tool_calls_false_masks_the_second_calls_opening_tokens(smollm_tokenizer):
    constraints = ToolConstraints(smollm_tokenizer, smollm_tokenizer.vocab_size)
    tag = smollm_tokenizer.encode("<tool_call>", allow_special=False)
    tokens = smollm_tokenizer.encode(NOW + "\n", allow_special=False) + tag[:-1]
    for single in (False, True):
        matcher = constraints.matcher(TOOLS, "auto", [], single=single)  # no end: text may follow
        for token in tokens:
            matcher.advance(token)
        assert matcher.state is not None  # every token fitted
        mask = matcher.disallowed()
        assert (mask is not None and bool(mask[tag[-1]])) is single
    assert SamplingParams(parallel_tool_calls=False).parallel_tool_calls is False
