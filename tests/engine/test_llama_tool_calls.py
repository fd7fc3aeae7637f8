"""Llama 3.1 tool calls, constrained like Hermes ones: the dialect its chat template asks for, the
automaton over `{"name": ..., "parameters": {...}}` and `<|python_tag|>`, masks on a Llama-3-style
tokenizer trained here (byte-level BPE with Llama 3's pre-tokenizer and special tokens after the
normal ones), and the real engine on a tiny random-weight Llama with that tokenizer and template."""

from __future__ import annotations

import json

import pytest
import torch

from engine import LLM, SamplingParams
from engine.chat import CHATML_TEMPLATE, ChatFormatter
from engine.constrained.grammar import HERMES, LLAMA3, MAX_WS, CallGrammar, tool_dialect, tool_specs
from engine.constrained.masks import CallMasks, ToolCallMatcher, ToolConstraints
from engine.constrained.vocab import TokenVocab
from engine.tokenizer import Tokenizer
from engine.tool_parser import parse_tool_calls
from tests.helpers.llama3_tokenizer import END_TOKENS, TEMPLATE, tokenizer_folder
from tests.helpers.tools import TOOLS as CHOICE_TOOLS

# The random-model tests' tools, and one that takes any arguments.
TOOLS = [*CHOICE_TOOLS, {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {}}, "additionalProperties": True}}}]
NAMES = {t["function"]["name"] for t in TOOLS}
KEYS = {t["function"]["name"]: set(t["function"]["parameters"]["properties"]) for t in TOOLS}
VALID = [
    '{"name": "get_weather", "parameters": {"unit": "celsius", "days": 3}}',
    '{ "name" : "now" , "parameters" : { } }',
    '{"name":"search","parameters":{"q":[1,-2.5e+3,true,null,{"a":"\\u00e9\\n"}],"x":"caf\u00e9"}}',
    '\n{\n  "name": "get_weather",\n  "parameters": {"hourly": false, "days": -12}\n}',
]
CALL = '{"name": "get_weather", "parameters": {'
# The first token's bonus (see `folder`): its size, the weight of `{`-tokens and of the tag.
BONUS = (10.0, 5.0, 8.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """A random-weight Llama with the Llama-3-style tokenizer and template, as a HF folder.

    Random weights seldom start an answer with `{` (7 of 504 tokens open a call), so the token
    that ends every prompt (the blank line after the assistant header) carries a dimension that
    no layer writes and that the head turns into a bonus for those tokens and the tag: then about
    half the "auto" answers open a call, and a forced call starts with the tag about half the
    time."""
    import transformers as tf

    path = tmp_path_factory.mktemp("random-llama3")
    tok = tokenizer_folder(path)
    ends = [tok.token_to_id(t) for t in END_TOKENS]
    vocab = TokenVocab(Tokenizer.from_hf_folder(path), tok.get_vocab_size())
    opening = [i for i, b in enumerate(vocab.bytes) if b and b.lstrip().startswith(b"{")]
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, initializer_range=0.25,
                         tie_word_embeddings=False, eos_token_id=ends,
                         bos_token_id=tok.token_to_id("<|begin_of_text|>"))
    model = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 0.0
        model.model.embed_tokens.weight[tok.token_to_id("ĊĊ"), 0] = BONUS[0]
        for layer in model.model.layers:  # nothing else writes to dimension 0
            layer.self_attn.o_proj.weight[0] = 0.0
            layer.mlp.down_proj.weight[0] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[opening, 0] = BONUS[1]
        model.lm_head.weight[vocab.python_tag, 0] = BONUS[2]
    model.save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.fixture(scope="module")
def tok(folder) -> Tokenizer:
    return Tokenizer.from_hf_folder(folder)


@pytest.fixture(scope="module")
def vocab(tok) -> TokenVocab:
    return TokenVocab(tok, tok.vocab_size)


@pytest.fixture(scope="module")
def llm(folder) -> LLM:
    return LLM(folder, kv_cache_gib=0.05, max_model_len=1024, max_num_seqs=32)


def grammar(mode: str = "required", can_end: bool = True) -> CallGrammar:
    return CallGrammar(tool_specs(TOOLS), mode, can_end=can_end, dialect=LLAMA3)


def walk(text: str, mode: str = "required", tagged: bool = False):
    """The state after `text` (after <|python_tag|> first, if `tagged`), or None if refused."""
    g = grammar(mode)
    state = g.special(g.initial, python_tag=True) if tagged else g.initial
    return None if state is None else g.walk(state, text.encode())


# ---- the dialect and the prompt -------------------------------------------------------------


def test_the_dialect_follows_what_the_template_asks_for(tok):
    header = "<|start_header_id|>{{ m.role }}<|end_header_id|>"
    assert tool_dialect(TEMPLATE) == LLAMA3  # Llama 3.1: <|python_tag|> and "parameters"
    assert tool_dialect(header + '{{ \'{"name": "\' + n + \'", "parameters": \' }}') == LLAMA3  # 3.2
    assert tool_dialect(header) == HERMES  # Llama 3.0: no call form of its own
    assert tool_dialect(header + '"parameters" <tool_call>') == HERMES  # a Hermes fine-tune
    assert tool_dialect(CHATML_TEMPLATE) == tool_dialect(None) == HERMES
    assert tool_dialect('<|im_start|>{{ "parameters" }}<|python_tag|>') == HERMES  # no headers
    assert ChatFormatter(tok).tool_dialect == LLAMA3
    assert ToolConstraints(tok, tok.vocab_size).dialect == LLAMA3
    assert ToolConstraints(tok, tok.vocab_size, dialect=HERMES).dialect == HERMES


def test_llama_prompt_asks_for_its_own_form_and_shows_past_calls_in_it(tok):
    call = {"type": "function", "function": {"name": "get_weather",
                                             "arguments": '{"unit": "celsius"}'}}
    chat = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "sunny"}]
    text = ChatFormatter(tok).render(chat, TOOLS)
    assert '{"name": <function-name>, "parameters": <arguments-as-a-JSON-object>}' in text
    assert "<tool_call>" not in text and "<tool_response>" not in text
    past = '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", ' \
           '"parameters": {"unit": "celsius"}}<|eot_id|>'
    assert past in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>" in text
    # The Hermes form is untouched for other templates.
    assert "<tool_call>" in ChatFormatter(tok, CHATML_TEMPLATE).render(chat, TOOLS)


# ---- the automaton ----------------------------------------------------------------------------


@pytest.mark.parametrize("call", VALID)
@pytest.mark.parametrize("mode,tagged", [("required", False), ("required", True),
                                         ("auto", False), ("auto", True)])
def test_valid_llama_calls_are_accepted_byte_by_byte_then_only_the_end(call, mode, tagged):
    g = grammar(mode)
    state = g.special(g.initial, python_tag=True) if tagged else g.initial
    data = call.encode()
    for k, b in enumerate(data):
        # Once the call is open ("auto" may end before it: an empty answer), it must finish.
        assert state is not None and (not g.may_end(state) or (mode == "auto" and not tagged
                                                               and not data[:k].strip()))
        state = g.step(state, b)
    assert state is not None and g.may_end(state)
    assert g.step(state, ord(" ")) is None and g.step(state, ord("{")) is None
    assert g.special(state, python_tag=True) is None and g.special(state, python_tag=False) is None
    parsed = parse_tool_calls(call)  # what the grammar lets through, the parser reads as a call
    assert parsed.errors == [] and len(parsed.tool_calls) == 1 and parsed.content == ""


@pytest.mark.parametrize("bad", [  # "|" marks where the valid prefix ends
    '{"name": "get_weather|X',  # unknown tool
    '{"name": "now|_later"',  # unknown tool sharing a known name's start
    '{"name": "now", |"arguments"',  # the Hermes key: Llama's is "parameters"
    '{"name": "now", "param|s"',  # another wrong key
    '{|"parameters"',  # parameters before the name
    '{"name": "now"|}',  # no parameters
    '{"name": "now", "parameters": |[',  # parameters not an object
    '{"name": "now", "parameters": |null',  # parameters not an object
    CALL.replace("get_weather", "search") + '"q": 1,|}',  # trailing comma
    CALL.replace("get_weather", "search") + "|'q'",  # single quotes
    CALL.replace("get_weather", "search") + '"q": "a|\nb"',  # control byte in a string
    CALL.replace("get_weather", "search") + '"q": 0|1',  # leading zero
    CALL + '"|town"',  # undeclared property
    CALL + '"unit": "|kelvin',  # not in the enum
    CALL + '"days": 1|.5',  # not an integer
    CALL + '"days": |"3"',  # not an integer
    CALL + '"hourly": |"yes',  # not a boolean
    '{"name": "set_volume", "parameters": {"level": |true',  # not a number
    '{"name": "now", "parameters": {}}|}',  # a stray brace after the call
    '{"name": "now", "parameters": {}}|\n',  # nothing but the end of the turn after a call
    "|x{",  # a forced call starts the output
    "|<tool_call>",  # in the model's own dialect
    " " * MAX_WS + "| {",  # only a short whitespace run before it
    "{" + " " * MAX_WS + '| "name"',  # whitespace runs are bounded inside the call
])
def test_malformed_llama_calls_are_refused_where_they_go_wrong(bad):
    prefix, rest = bad.split("|")
    assert walk(prefix) is not None
    assert walk(prefix + rest) is None


@pytest.mark.parametrize("text,opens", [
    ('{"name": "now", "parameters": {}}', True),
    (' \n\t{"name": "now", "parameters": {}}', True),
    ('\u3000\u00a0\u2009{"name": "now", "parameters": {}}', True),  # what str.strip() drops
    ('<|python_tag|>{"name": "now", "parameters": {}}', True),  # the tag written as text
    ('Sure: {"name": "nothing", "parameters": 7} is JSON', False),
    ("\u2019s text", False),  # starts like a multi-byte space, is not one
    ("<|python", False),
    ('<tool_call>{"name": "now", "parameters": {}}</tool_call> more', False),
])
def test_auto_output_opens_a_call_only_at_its_start(text, opens):
    g = grammar("auto")
    state = g.walk(g.initial, text.encode())
    assert state is not None and g.may_end(state)
    assert (g.step(state, ord("x")) is None) == opens  # after a call, only the end of the turn
    assert (parse_tool_calls(text).tool_calls != []) == (opens or "<tool_call>" in text)


@pytest.mark.parametrize("bad", [  # "^" marks where the valid prefix ends
    "^{x",  # a call at the start must be valid
    '\u3000^{"name": "x',
    '<|python_tag|>^ {"name": "x',  # the tag as text opens a call too
    "<|python_tag|>^Hello",
    'Sure. <tool_call>{"name": "now", ^"arguments"',  # Hermes blocks too, under "parameters"
    'Sure. <tool_call>{"name": "^later"',
])
def test_auto_output_refuses_broken_calls(bad):
    prefix, rest = bad.split("^")
    assert walk(prefix, "auto") is not None
    assert walk(prefix + rest, "auto") is None


def test_python_tag_may_only_open_the_call():
    g = grammar("required")
    assert g.special(g.initial, python_tag=True) is not None
    for text in [" ", "{", CALL]:  # a forced call: only as the output's first token
        assert g.special(g.walk(g.initial, text.encode()), python_tag=True) is None
    assert g.special(g.initial, python_tag=False) is None  # no other special token either
    auto = grammar("auto")
    assert auto.special(auto.initial, python_tag=True) is not None
    assert auto.special(auto.walk(auto.initial, b" \n"), python_tag=True) is not None
    for data in [b"Hi", "\u3000".encode()[:1], CALL.encode()]:  # text begun, or a call
        assert auto.special(auto.walk(auto.initial, data), python_tag=True) is None
    # Other special tokens are free text's, and do not move the start.
    assert auto.special(auto.initial, python_tag=False) == auto.initial
    free = auto.walk(auto.initial, b"Hi")
    assert auto.special(free, python_tag=False) == free
    # A Hermes grammar's free text takes <|python_tag|> like any special token, as before.
    hermes = CallGrammar(tool_specs(TOOLS), "auto")
    assert hermes.special(hermes.initial, python_tag=True) == hermes.initial


def test_without_end_tokens_free_text_follows_a_forced_call():
    g = grammar("required", can_end=False)
    state = g.walk(g.initial, VALID[0].encode())
    assert g.in_free_text(state) and g.walk(state, b" and more") is not None


# ---- masks on the Llama-3-style vocabulary ----------------------------------------------------


def test_the_vocabulary_has_the_tokens_worth_testing(vocab, tok):
    spelled = {b for b in vocab.bytes if b}
    assert vocab.python_tag == tok.backend.token_to_id("<|python_tag|>") >= 256
    assert vocab.bytes[vocab.python_tag] is None
    # Tokens that open a call after whitespace, go on past its "{", hold multi-byte spaces,
    # and spell the tag as text.
    assert {b" {", b'{"', b' {"', b'":{"', b"\xe3\x80\x80", b"<|", b"|>", b"_tag"} <= spelled


def brute_force_allowed(g: CallGrammar, vocab: TokenVocab, state, end_ids) -> set[int]:
    allowed = {i for i, b in enumerate(vocab.bytes) if b and g.walk(state, b) is not None}
    for i, b in enumerate(vocab.bytes):
        if b is None and ((g.may_end(state) and i in end_ids)
                          or g.special(state, python_tag=i == vocab.python_tag) is not None):
            allowed.add(i)
    return allowed


STATES = [
    ("required", False, ""),
    ("required", True, ""),
    ("required", False, " "),
    ("required", False, '{"name": "'),
    ("required", False, '{"name": "now", "'),
    ("required", False, CALL + '"unit": "c'),
    ("required", False, CALL + '"days": 4'),
    ("required", False, '{"name": "search", "parameters": {"q": "text \\'),
    ("required", False, '{"name": "search", "parameters": {"q": [1.5'),
    ("required", False, '{"name": "now", "parameters": {}'),
    ("required", False, '{"name": "now", "parameters": {}}'),
    ("auto", False, ""),
    ("auto", False, " \n"),
    ("auto", False, "\u3000"),
    ("auto", True, ""),
    ("auto", False, "{"),
    ("auto", False, "<|"),
    ("auto", False, "<|python_tag|>"),
    ("auto", False, "Let me look. "),
    ("auto", False, "Let me look. <tool"),
    ("auto", False, '{"name": "now", "parameters": {}}'),
]


@pytest.mark.parametrize("mode,tagged,text", STATES)
def test_masks_equal_a_brute_force_walk_of_every_token(tok, vocab, mode, tagged, text):
    ends = tok.eos_token_ids
    g = grammar(mode)
    state = g.special(g.initial, python_tag=True) if tagged else g.initial
    state = g.walk(state, text.encode())
    mask = CallMasks(g, vocab, ends).disallowed(state)
    got = set(range(vocab.size)) if mask is None else set((~mask).nonzero()[0].tolist())
    assert got == brute_force_allowed(g, vocab, state, ends)


def test_a_split_multibyte_space_keeps_the_start(tok, vocab):
    g = grammar("auto")
    half = g.walk(g.initial, "\u3000".encode()[:2])
    assert half is not None and not g.in_free_text(half) and g.at_start(half)
    mask = CallMasks(g, vocab, tok.eos_token_ids).disallowed(half)
    got = set(range(vocab.size)) if mask is None else set((~mask).nonzero()[0].tolist())
    assert got == brute_force_allowed(g, vocab, half, tok.eos_token_ids)
    assert vocab.python_tag not in got  # the text has begun: no tag now


def test_special_tokens_in_the_mask_follow_the_python_tag_rule(tok, vocab):
    ends = tok.eos_token_ids
    tag = vocab.python_tag
    forced = grammar("required")
    masks = CallMasks(forced, vocab, ends)
    first = ~masks.disallowed(forced.initial)
    assert first[tag] and not first[ends].any()
    inside = masks.disallowed(forced.walk(forced.initial, CALL.encode()))
    assert inside[tag] and inside[ends].all()
    done = ~masks.disallowed(forced.walk(forced.initial, VALID[0].encode()))
    assert done.nonzero()[0].tolist() == sorted(ends)
    auto = grammar("auto")
    masks = CallMasks(auto, vocab, ends)
    start = masks.disallowed(auto.initial)
    assert not start[tag] and not start[ends].any()
    free = masks.disallowed(auto.walk(auto.initial, b"Hello"))
    assert free is not None and free.nonzero()[0].tolist() == [tag]


def test_the_matcher_follows_special_tokens(tok, vocab):
    ends = tok.eos_token_ids
    matcher = ToolCallMatcher(CallMasks(grammar("required"), vocab, ends))
    matcher.advance(vocab.python_tag)
    for t in tok.encode(VALID[0], allow_special=False):
        assert not matcher.disallowed()[t]
        matcher.advance(t)
    assert matcher.masks.grammar.may_end(matcher.state)
    matcher.advance(ends[0])
    assert matcher.state is not None
    auto = ToolCallMatcher(CallMasks(grammar("auto"), vocab, ends))
    for t in tok.encode("Hi", allow_special=False):
        auto.advance(t)
    auto.advance(vocab.python_tag)  # only a caller that skipped the mask gets here
    assert auto.state is None


# ---- the real engine, random weights -------------------------------------------------------------


def prompts(llm: LLM, n: int) -> list[list[int]]:
    questions = ["What is the weather like?", "Turn it up.", "What time is it?", "Find pizza.",
                 "Hello!", "Is it going to rain in Oslo tomorrow?", "Quieter, please.", "Thanks"]
    return [llm.engine.encode_chat([{"role": "user", "content": f"{questions[i % 8]} ({i})"}], TOOLS)
            for i in range(n)]


def check_call(out, names=NAMES) -> None:
    parsed = parse_tool_calls(out.text)
    assert parsed.errors == [] and parsed.content == "", out.text
    assert len(parsed.tool_calls) == 1, out.text
    call = parsed.tool_calls[0]
    assert call.name in names, out.text
    assert call.name == "search" or set(call.arguments) <= KEYS[call.name], out.text


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_forced_calls_from_a_random_llama_always_parse(llm, tok, skip_special_tokens):
    named = {"type": "function", "function": {"name": "set_volume"}}
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200, tool_choice="required",
                             skip_special_tokens=skip_special_tokens) for s in range(12)]
    params += [SamplingParams(temperature=1.0, seed=s, max_tokens=200, tool_choice=named,
                              skip_special_tokens=skip_special_tokens) for s in range(4)]
    outs = llm.generate(prompts(llm, len(params)), params, tools=TOOLS)
    tag = tok.backend.token_to_id("<|python_tag|>")
    for out, p in zip(outs, params, strict=True):
        assert out.finish_reason == "stop" and out.token_ids[-1] in tok.eos_token_ids, out.text
        assert tag not in out.token_ids[1:], out.token_ids  # the tag only opens the call
        body = out.text if skip_special_tokens else out.text.removeprefix("<|python_tag|>")
        assert body.lstrip().startswith("{") and len(body) - len(body.lstrip()) <= MAX_WS
        check_call(out, {"set_volume"} if isinstance(p.tool_choice, dict) else NAMES)
    tagged = sum(o.token_ids[0] == tag for o in outs)
    assert 0 < tagged < len(outs)  # both ways of opening a call were taken


def test_auto_output_of_a_random_llama_never_holds_a_malformed_call(llm, tok):
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200) for s in range(32)]
    outs = llm.generate(prompts(llm, len(params)), params, tools=TOOLS)
    tag = tok.backend.token_to_id("<|python_tag|>")
    opened = 0
    for out in outs:
        parsed = parse_tool_calls(out.text)
        assert parsed.errors == [], out.text
        if out.text.lstrip().startswith("{"):
            opened += 1
            assert out.finish_reason == "stop" and out.token_ids[-1] in tok.eos_token_ids
            check_call(out)
        else:  # free text, where the tag may not come
            assert tag not in out.token_ids and not parsed.tool_calls, out.text
    assert 4 <= opened <= len(outs) - 4, [o.text for o in outs]  # calls and text both tested


def test_a_call_may_end_on_the_templates_eom_though_eos_is_only_eot(folder, tmp_path):
    """Like a Llama 3.1 GGUF file: its eos is <|eot_id|> alone, but the template ends a tool
    call's turn with <|eom_id|>, which must end the request too (and be offered after a call)."""
    import shutil

    copy = tmp_path / "eot-only"
    shutil.copytree(folder, copy)
    for name in ("config.json", "generation_config.json"):
        data = json.loads((copy / name).read_text())
        data["eos_token_id"] = Tokenizer.from_hf_folder(folder).backend.token_to_id("<|eot_id|>")
        (copy / name).write_text(json.dumps(data))
    llm = LLM(str(copy), kv_cache_gib=0.05, max_model_len=1024, max_num_seqs=32)
    eot, eom = (llm.engine.tokenizer.backend.token_to_id(t) for t in ("<|eot_id|>", "<|eom_id|>"))
    assert llm.engine.tokenizer.eos_token_ids == [eot]
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200, tool_choice="required")
              for s in range(12)]
    outs = llm.generate(prompts(llm, len(params)), params, tools=TOOLS)
    for out in outs:
        assert out.finish_reason == "stop" and out.token_ids[-1] in (eot, eom), out.text
        check_call(out)
    assert eom in {out.token_ids[-1] for out in outs}  # 12 seeds: it came, and it ended them
