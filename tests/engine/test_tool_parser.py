"""Tool-call parsing: Hermes blocks, Llama 3.1 JSON, broken and cut-off output, and streaming."""

from __future__ import annotations

import random
import re

import pytest

from engine.tool_parser import ParsedOutput, StreamingToolParser, ToolCall, parse_tool_calls


def call(name: str, **arguments) -> ToolCall:
    return ToolCall(id="ignored", name=name, arguments=arguments)


# ---- good output ----------------------------------------------------------------------------


def test_one_hermes_call_is_parsed_with_a_fresh_call_id():
    out = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>')
    assert out == ParsedOutput("", [call("get_weather", city="Paris")], [])
    assert re.fullmatch(r"call_[0-9a-f]{12}", out.tool_calls[0].id)


def test_two_calls_get_distinct_ids_and_keep_their_order():
    out = parse_tool_calls(
        '<tool_call>{"name": "a", "arguments": {"n": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"n": 2}}</tool_call>'
    )
    assert out.tool_calls == [call("a", n=1), call("b", n=2)]
    assert out.tool_calls[0].id != out.tool_calls[1].id
    assert out.errors == []


def test_content_before_and_after_blocks_is_kept_and_stripped():
    out = parse_tool_calls(
        '  Let me check.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\nOne moment. '
    )
    assert out.content == "Let me check.\n\nOne moment."
    assert out.tool_calls == [call("a")]


def test_plain_text_without_calls_is_all_content():
    out = parse_tool_calls("  The answer is 42.\n")
    assert out == ParsedOutput("The answer is 42.", [], [])


def test_arguments_given_as_a_json_string_are_decoded():
    out = parse_tool_calls('<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"cats\\"}"}</tool_call>')
    assert out.tool_calls == [call("search", q="cats")]


def test_parameters_key_is_accepted_for_arguments():
    out = parse_tool_calls('<tool_call>{"name": "a", "parameters": {"x": 1}}</tool_call>')
    assert out.tool_calls == [call("a", x=1)]


def test_missing_arguments_means_a_call_without_arguments():
    assert parse_tool_calls('<tool_call>{"name": "now"}</tool_call>').tool_calls == [call("now")]


def test_llama31_json_output_is_one_call():
    out = parse_tool_calls('\n{"name": "get_weather", "parameters": {"city": "Oslo"}}\n')
    assert out == ParsedOutput("", [call("get_weather", city="Oslo")], [])


def test_llama31_python_tag_form_is_one_call():
    out = parse_tool_calls('<|python_tag|>{"name": "f", "arguments": {"x": [1, 2]}}')
    assert out.tool_calls == [call("f", x=[1, 2])]


def test_json_answer_without_call_shape_stays_content():
    text = '{"city": "Oslo", "temp": 3}'
    assert parse_tool_calls(text) == ParsedOutput(text, [], [])


def test_json_call_followed_by_prose_is_content_not_a_call():
    text = '{"name": "Bob", "arguments": {}} is how the record looks.'
    assert parse_tool_calls(text) == ParsedOutput(text, [], [])


# ---- tolerated slips ------------------------------------------------------------------------


def test_json_fence_inside_block_is_tolerated():
    out = parse_tool_calls('<tool_call>\n```json\n{"name": "a", "arguments": {"x": 1}}\n```\n</tool_call>')
    assert out == ParsedOutput("", [call("a", x=1)], [])


def test_trailing_commas_are_tolerated():
    out = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"x": [1, 2,],},}</tool_call>')
    assert out == ParsedOutput("", [call("a", x=[1, 2])], [])


def test_a_comma_inside_a_string_before_a_brace_is_not_touched():
    out = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"x": ",}",}}</tool_call>')
    assert out.tool_calls == [call("a", x=",}")]


def test_stray_closing_brace_after_a_call_is_tolerated():
    out = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}}</tool_call>')
    assert out == ParsedOutput("", [call("a")], [])


def test_two_objects_or_an_array_in_one_block_are_two_calls():
    two = parse_tool_calls('<tool_call>{"name": "a"}\n{"name": "b"}</tool_call>')
    array = parse_tool_calls('<tool_call>[{"name": "a"}, {"name": "b"}]</tool_call>')
    assert two.tool_calls == array.tool_calls == [call("a"), call("b")]


# ---- partial output -------------------------------------------------------------------------


def test_unclosed_final_block_with_complete_json_is_parsed():
    out = parse_tool_calls('Checking.\n<tool_call>{"name": "a", "arguments": {"x": 1}}\n')
    assert out == ParsedOutput("Checking.", [call("a", x=1)], [])


def test_truncated_json_is_an_error_not_an_exception():
    out = parse_tool_calls('Sure.<tool_call>{"name": "a", "arguments": {"path": "/tm')
    assert out.content == "Sure."
    assert out.tool_calls == []
    assert len(out.errors) == 1
    assert "incomplete JSON" in out.errors[0] and '"/tm' in out.errors[0]


def test_truncated_llama_call_is_an_error_not_content():
    out = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Os')
    assert out.content == "" and out.tool_calls == []
    assert "incomplete JSON" in out.errors[0]


# ---- broken output --------------------------------------------------------------------------


def test_invalid_json_is_an_error_quoting_the_text():
    out = parse_tool_calls("<tool_call>{name: 'a'}</tool_call> after")
    assert out.content == "after"
    assert out.tool_calls == []
    assert "invalid JSON" in out.errors[0] and "{name: 'a'}" in out.errors[0]


def test_missing_name_is_an_error():
    out = parse_tool_calls('<tool_call>{"arguments": {"x": 1}}</tool_call>')
    assert out.tool_calls == [] and 'missing "name"' in out.errors[0]


def test_arguments_that_are_not_an_object_are_an_error():
    for args in ("[1, 2]", '"just text"', "42"):
        out = parse_tool_calls(f'<tool_call>{{"name": "a", "arguments": {args}}}</tool_call>')
        assert out.tool_calls == [], args
        assert '"arguments" of a' in out.errors[0], args


def test_one_bad_block_does_not_spoil_a_good_one():
    out = parse_tool_calls(
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>'
    )
    assert out.tool_calls == [call("ok")]
    assert len(out.errors) == 1 and "block 2" in out.errors[0]


def test_empty_block_is_an_error():
    out = parse_tool_calls("<tool_call></tool_call>")
    assert out.tool_calls == [] and "empty" in out.errors[0]


def test_close_tag_and_nested_braces_inside_a_string_value_stay_in_the_call():
    text = (
        '<tool_call>{"name": "write", "arguments": {"text": "a } b { </tool_call> c", '
        '"opts": {"deep": {"x": [1, {"y": 2}]}}}}</tool_call>done'
    )
    out = parse_tool_calls(text)
    args = {"text": "a } b { </tool_call> c", "opts": {"deep": {"x": [1, {"y": 2}]}}}
    assert out == ParsedOutput("done", [call("write", **args)], [])


def test_long_offending_text_is_truncated_in_the_error():
    out = parse_tool_calls("<tool_call>{" + "x" * 5000 + "}</tool_call>")
    assert out.errors and len(out.errors[0]) < 600


def test_error_says_how_to_call_a_tool():
    out = parse_tool_calls("<tool_call>nonsense</tool_call>")
    assert '<tool_call>{"name"' in out.errors[0]


# ---- never raises ---------------------------------------------------------------------------

_ATOMS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "</tool",
    "<|python_tag|>",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ",",
    ":",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"a"',
    "1",
    "null",
    " ",
    "\n",
    "```",
    "json",
    "text",
    "é",
    "\x00",
]
_SAMPLES = [
    'Hi <tool_call>{"name": "a", "arguments": {"x": "y"}}</tool_call> there',
    '{"name": "f", "parameters": {"q": "</tool_call>"}}',
    '<tool_call>```json\n{"name": "b", "arguments": "{\\"k\\": [1,]}"}\n```</tool_call>',
    '<|python_tag|>{"name": "c", "arguments": {}}',
]


def _garbage(rng: random.Random) -> str:
    if rng.random() < 0.5:
        sample = rng.choice(_SAMPLES)
        return sample[: rng.randrange(len(sample) + 1)]  # a truncation
    return "".join(rng.choice(_ATOMS) for _ in range(rng.randrange(30)))


def test_random_garbage_and_truncations_never_raise():
    rng = random.Random(1234)
    for _ in range(3000):
        out = parse_tool_calls(_garbage(rng))
        assert isinstance(out.content, str)
        assert all(isinstance(c.arguments, dict) and c.name for c in out.tool_calls)


def test_pathological_nesting_never_raises():
    for text in ("<tool_call>" + "[" * 50000, "<tool_call>" + "[" * 50000 + "]" * 50000, "{" * 9999):
        assert isinstance(parse_tool_calls(text), ParsedOutput)


def test_non_string_input_never_raises():
    assert parse_tool_calls(None) == ParsedOutput("", [], [])  # type: ignore[arg-type]


# ---- streaming ------------------------------------------------------------------------------

_STREAM_CASES = [
    *_SAMPLES,
    "Plain answer, no tools at all.",
    'Let me look.\n<tool_call>{"name": "a", "arguments": {"t": "x </tool_call> y"}}</tool_call>'
    '\n<tool_call>{"name": "b", "arguments": {}}</tool_call>\nDone <tool_ maybe',
    'Before <tool_call>{"name": "a", "arguments": {"p": "/tm',
    '{"city": "Oslo"} is JSON but not a call',
    "a <tool_call>{broken</tool_call> b </tool_call> c",
    '<tool_call>{"name": "a"}</tool_callx> more text',
]


def _stream(text: str, sizes: list[int] | None) -> tuple[list[str], ParsedOutput, str]:
    parser = StreamingToolParser()
    deltas, i = [], 0
    while i < len(text):
        n = 1 if sizes is None else sizes[len(deltas) % len(sizes)]
        deltas.append(parser.feed(text[i : i + n]))
        i += n
    return deltas, parser.finish(), parser.shown


@pytest.mark.parametrize("text", _STREAM_CASES)
def test_streaming_char_by_char_matches_one_shot_parse(text):
    deltas, final, shown = _stream(text, None)
    assert final == parse_tool_calls(text)
    assert "".join(deltas) == shown
    assert final.content.startswith(shown)


def test_streaming_in_random_chunks_matches_one_shot_parse_and_shows_only_content():
    rng = random.Random(99)
    texts = _STREAM_CASES + [_garbage(rng) for _ in range(400)]
    for text in texts:
        sizes = [rng.randint(1, 9) for _ in range(7)]
        deltas, final, shown = _stream(text, sizes)
        assert final == parse_tool_calls(text), text
        # Whatever was shown is the start of the final content, so no tool-block text leaked.
        assert final.content.startswith("".join(deltas)), text


def test_streaming_never_shows_text_from_a_tool_block():
    text = 'Hi.<tool_call>{"name": "secret_tool", "arguments": {"k": "v"}}</tool_call>'
    for k in range(len(text) + 1):
        parser = StreamingToolParser()
        shown = parser.feed(text[:k]) + parser.feed(text[k:])
        assert "secret_tool" not in shown and "<" not in shown
        assert parser.finish().tool_calls == [call("secret_tool", k="v")]


def test_streaming_shows_plain_text_promptly():
    parser = StreamingToolParser()
    assert parser.feed("Hello") == "Hello"
    assert parser.feed(" wor") == " wor"
    assert parser.feed("ld <") == "ld"  # "<" could start <tool_call>; the space waits with it
    assert parser.feed("b>") == " <b>"
    assert parser.feed("\n\n") == ""  # trailing whitespace is only shown once text follows it
    assert parser.feed("Next") == "\n\nNext"
    assert parser.finish().content == "Hello world <b>\n\nNext"


def test_streaming_withholds_a_possible_tag_prefix_until_it_is_decided():
    parser = StreamingToolParser()
    assert parser.feed("ok <tool_ca") == "ok"
    assert parser.feed('ll>{"name": "a"}</tool_call>') == ""
    assert parser.finish() == ParsedOutput("ok", [call("a")], [])


def test_streaming_holds_a_possible_llama_call_and_releases_other_json():
    parser = StreamingToolParser()
    assert parser.feed('{"name": "f", "parameters": {}}') == ""
    assert parser.finish().tool_calls == [call("f")]
    parser = StreamingToolParser()
    assert parser.feed('{"city": "Oslo"} ') == '{"city": "Oslo"}'


def test_text_held_at_the_end_is_in_the_final_content():
    parser = StreamingToolParser()
    shown = parser.feed("Done <tool_")
    final = parser.finish()
    assert final.content == "Done <tool_"
    assert final.content[len(shown) :] == " <tool_"
