"""GGUF files with a SentencePiece ('llama') tokenizer: a BPE vocabulary with byte fallback trained
here, written into a tiny random Llama GGUF, against transformers' own GGUF tokenizer loading and a
plain Python rendering of llama.cpp's SentencePiece tokenizer; then streaming, constrained-decoding
bytes, the special-token safety rule, and the model loaded, generating and chatting through LLM."""

from __future__ import annotations

import json
import random

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers, trainers

from engine import LLM, SamplingParams
from engine.chat import ChatFormatter
from engine.chat_count import MessageCounter
from engine.constrained.vocab import token_bytes
from engine.detokenizer import IncrementalDetokenizer
from engine.loader.gguf import read_fields
from engine.tokenizer import Tokenizer
from tests.helpers.gguf_writer import byte_vocab, write_gguf
from tests.helpers.hf_reference import TINY, build_tiny_checkpoint

SP = "\u2581"  # SentencePiece's space
UNK, BOS, EOS = 0, 1, 2
NORMAL, UNKNOWN, CONTROL, UNUSED, BYTE = 1, 2, 3, 5, 6
BYTES = [f"<0x{b:02X}>" for b in range(256)]
SPECIALS = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
INST = [("[INST]", CONTROL), ("[/INST]", CONTROL)]  # control tokens, as in Mistral's later files

# Mistral-style: the template writes BOS itself.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)

TRAIN = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.",
    "Hello, world! Hello again, world. Say hello to the other world, hello there.",
    "Numbers: 12345, 2024, 3.14159 and 42 are numbers; 100 + 200 = 300.",
    "Le café est très bon, naïve élève, déjà vu à Paris, l'été.",
    "def main():\n    return print('hello')\n\tindented line\n",
    "日本語のテキスト 日本 本日 日本語",
    "tokenizers tokenize text into tokens; a token is a piece of text, tokens are pieces.",
] * 3

CORPUS = [
    "Hello, world!",
    "The lazy dog sleeps.",
    "Say hello to the other one over there.",
    " one leading space",
    "  two leading spaces and  double   triple spaces inside ",
    "line one\nline two\n\n\ttabbed\tcolumns\r\nend",
    "digits 0123456789 and 3.14159, 2024-01-01",
    "punctuation: (a) [b] {c} <d> 'e' \"f\" !?;:",
    "accents: café naïve élève déjà Ångström",
    "CJK 日本語のテキスト and 中文 and 한국어",
    "emoji 🦀👍🏽 and a € sign",
    "text with <s> and </s> inside, and [INST] markers [/INST]",
    "tokenizers tokenize tokens",
    "",
    "   ",
    "a",
]


# ---- the vocabulary and the file ----------------------------------------------------------------


def trained_pieces() -> list[str]:
    """Normal pieces best first, as SentencePiece BPE ranks them: merges in training order, then
    the single characters. Newlines and tabs are left out, so they need byte fallback (as in Llama)."""
    tok = HFTokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="never", split=True)
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=118, limit_alphabet=46,
                                                       show_progress=False))
    model = json.loads(tok.to_str())["model"]
    merged = ["".join(pair) for pair in model["merges"]]
    chars = [t for t in model["vocab"] if len(t) == 1]
    return [p for p in merged + chars if not set(p) & set("\n\t\r")]


@pytest.fixture(scope="module")
def vocab() -> dict[str, list]:
    """tokens, scores and types of a GGUF 'llama' vocabulary. The normal pieces sit at shuffled
    ids, so only the scores give their merge order, and unused ids fill it up to TINY's size."""
    pieces = trained_pieces()
    scores = {p: -float(rank) for rank, p in enumerate(pieces)}
    random.Random(0).shuffle(pieces)
    entries = [*SPECIALS, *((b, BYTE) for b in BYTES), *INST, *((p, NORMAL) for p in pieces)]
    assert len(entries) <= TINY["vocab_size"]
    entries += [(f"<unused{i}>", UNUSED) for i in range(TINY["vocab_size"] - len(entries))]
    return {
        "tokens": [t for t, _ in entries],
        "scores": [scores.get(t, 0.0) for t, _ in entries],
        "types": [ty for _, ty in entries],
    }


@pytest.fixture(scope="module")
def gguf_path(vocab, tmp_path_factory):
    folder = tmp_path_factory.mktemp("spm")

    def write_tokenizer(writer: gguf.GGUFWriter, vocab_size: int) -> None:
        assert vocab_size == len(vocab["tokens"])
        writer.add_tokenizer_model("llama")
        writer.add_token_list(vocab["tokens"])
        writer.add_token_scores(vocab["scores"])
        writer.add_token_types(vocab["types"])
        writer.add_bos_token_id(BOS)
        writer.add_eos_token_id(EOS)
        writer.add_unk_token_id(UNK)
        writer.add_chat_template(TEMPLATE)
        # No add_bos_token and no add_space_prefix: both default to true for 'llama'.

    checkpoint = build_tiny_checkpoint("llama", folder / "hf")
    write_gguf(checkpoint, folder / "spm.gguf", "llama", write_tokenizer)
    return folder / "spm.gguf"


@pytest.fixture(scope="module")
def tok(gguf_path) -> Tokenizer:
    return Tokenizer.from_gguf_fields(read_fields(gguf_path))


@pytest.fixture(scope="module")
def theirs(gguf_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def normal_ids(vocab: dict[str, list]) -> dict[str, int]:
    pairs = zip(vocab["tokens"], vocab["types"], strict=True)
    return {t: i for i, (t, ty) in enumerate(pairs) if ty == NORMAL}


def llama_cpp_spm(text: str, vocab: dict[str, list]) -> list[int]:
    """llama.cpp's llm_tokenizer_spm without specials, plainly: "▁" in front and for every space,
    then merge the adjacent pair whose merged piece scores highest (leftmost on ties) until none is
    a piece; what is not a piece goes out as its UTF-8 bytes."""
    if not text:
        return []
    ids = normal_ids(vocab)
    score = {t: vocab["scores"][i] for t, i in ids.items()}
    symbols = list(SP + text.replace(" ", SP))
    while True:
        best = None
        for k in range(len(symbols) - 1):
            s = score.get(symbols[k] + symbols[k + 1])
            if s is not None and (best is None or s > best[0]):
                best = (s, k)
        if best is None:
            break
        k = best[1]
        symbols[k : k + 2] = [symbols[k] + symbols[k + 1]]
    out = []
    for s in symbols:
        out += [ids[s]] if s in ids else [vocab["tokens"].index(f"<0x{b:02X}>") for b in s.encode()]
    return out


def spm_fields(vocab: dict[str, list], **flags) -> dict:
    """GGUF metadata as read from a file, for tests that need no file."""
    fields = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": vocab["tokens"],
              "tokenizer.ggml.scores": vocab["scores"], "tokenizer.ggml.token_type": vocab["types"]}
    return fields | {f"tokenizer.ggml.{k}": v for k, v in flags.items()}


# ---- encoding -----------------------------------------------------------------------------------


def test_ids_equal_llama_cpps_sentencepiece_algorithm(tok, vocab):
    for text in CORPUS:
        assert tok.encode(text, allow_special=False) == llama_cpp_spm(text, vocab), text


def test_ids_equal_transformers_gguf_tokenizer(tok, theirs):
    # transformers prefixes "▁" with Metaspace(prepend_scheme="first"), which adds none to text
    # that already starts with a space; llama.cpp and SentencePiece always add one. On " " + text
    # both see the same "▁"-string, so their ids must agree on every text.
    for text in CORPUS:
        ours = tok.encode(text, allow_special=False)
        their_text = " " + text if text else text
        assert ours == theirs.encode(their_text, add_special_tokens=False,
                                     split_special_tokens=True), text
        if not text.startswith(" "):
            assert ours == theirs.encode(text, add_special_tokens=False,
                                         split_special_tokens=True), text
    assert tok.add_bos and theirs.add_bos_token  # neither written in the file: true for 'llama'
    for text in CORPUS:
        if text and not text.startswith(" ") and "<" not in text and "[" not in text:
            assert tok.encode_prompt(text) == theirs.encode(text), text
            assert tok.encode_prompt(text)[:2] == [BOS, tok.encode(text, allow_special=False)[0]]


def test_merge_order_comes_from_the_scores(tok, vocab):
    """Merges ranked by token id (the file's order), not score, tokenize some text differently."""
    tokens, normal = vocab["tokens"], normal_ids(vocab)
    by_id = sorted(
        ((i, cut, t[:cut], t[cut:]) for t, i in normal.items() for cut in range(1, len(t))
         if t[:cut] in normal and t[cut:] in normal),
    )
    naive = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                   merges=[(a, b) for *_, a, b in by_id], byte_fallback=True))
    naive.normalizer = tok.backend.normalizer
    differ = [t for t in CORPUS if naive.encode(t).ids != tok.encode(t, allow_special=False)]
    assert differ, "every text tokenizes the same with merges in id order: the test shows nothing"
    for text in differ:
        assert tok.encode(text, allow_special=False) == llama_cpp_spm(text, vocab)


def test_special_tokens_are_plain_text_unless_allowed(tok, vocab):
    text = "a <s> b </s> c [INST] d [/INST] <unk>"
    inst, end_inst = vocab["tokens"].index("[INST]"), vocab["tokens"].index("[/INST]")
    specials = {UNK, BOS, EOS, inst, end_inst}
    assert tok.special_ids == specials
    plain = tok.encode(text, allow_special=False)
    assert not specials & set(plain)
    assert plain == llama_cpp_spm(text, vocab)
    assert tok.decode(plain) == text
    # Allowed (trusted text): each special is one id, and like llama.cpp every stretch of text
    # after a special gets its own "▁" prefix.
    assert tok.encode("a </s>b[INST]", allow_special=True) == [
        *llama_cpp_spm("a ", vocab), EOS, *llama_cpp_spm("b", vocab), inst]


def test_a_control_token_never_comes_out_of_merges():
    # "</" + "s>" spells "</s>": as a merge it would turn plain text into the EOS id.
    small = {
        "tokens": ["<unk>", "<s>", "</s>", *BYTES, SP, "<", "/", "s", ">", "</", "s>"],
        "types": [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * 7],
        "scores": [0.0] * 259 + [-10.0, -11, -12, -13, -14, -1, -2],
    }
    tok = Tokenizer.from_gguf_fields(spm_fields(small))
    assert (tok.bos_token_id, tok.eos_token_ids) == (BOS, [EOS])  # llama.cpp's defaults
    ids = tok.encode("</s>", allow_special=False)
    assert tok.convert_ids_to_tokens(ids) == [SP, "</", "s>"] and EOS not in ids
    assert ids == llama_cpp_spm("</s>", small)
    assert tok.decode(ids) == "</s>"
    # Without the rule, the same merges plus ("</", "s>") do produce EOS from plain text.
    naive = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(small["tokens"])},
                                   merges=[("<", "/"), ("s", ">"), ("</", "s>")]))
    assert naive.encode("</s>").ids == [EOS]


def small_vocab(pieces: list[tuple[str, float]]) -> dict[str, list]:
    """The specials and the byte tokens, then these normal pieces, at ids in this order."""
    return {"tokens": ["<unk>", "<s>", "</s>", *BYTES, *(p for p, _ in pieces)],
            "types": [UNKNOWN, CONTROL, CONTROL, *[BYTE] * 256, *[NORMAL] * len(pieces)],
            "scores": [0.0] * 259 + [float(s) for _, s in pieces]}


def pieces_of(tok: Tokenizer, text: str) -> list[str]:
    return tok.convert_ids_to_tokens(tok.encode(text, allow_special=False))


def test_tied_scores_merge_the_leftmost_pair_first_as_llama_cpp_does():
    # "ab", "bc" and "cd" score the same, at ids in reverse order. llama.cpp merges the leftmost of
    # equal pairs first: "abc" is "ab" + "c" ("abc" is no piece), where id order would give
    # "a" + "bc"; in "bcabc" the first "bc" is left of "ab", which is left of the second.
    chars = [(SP, -10), ("a", -11), ("b", -12), ("c", -13), ("d", -14)]
    small = small_vocab([*chars, ("cd", -1), ("bc", -1), ("ab", -1)])
    tok = Tokenizer.from_gguf_fields(spm_fields(small))
    expected = {"abc": [SP, "ab", "c"], "bcabc": [SP, "bc", "ab", "c"], "abcd": [SP, "ab", "cd"],
                "dbcd": [SP, "d", "bc", "d"]}
    for text, pieces in expected.items():
        assert pieces_of(tok, text) == pieces, text
        assert tok.encode(text, allow_special=False) == llama_cpp_spm(text, small), text
    # Ranked by id the same merges give other tokens: the test tells the two orders apart.
    by_id = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(small["tokens"])},
                                   merges=[("c", "d"), ("b", "c"), ("a", "b")], byte_fallback=True))
    by_id.normalizer = tok.backend.normalizer
    assert by_id.encode("abc").tokens == [SP, "a", "bc"]
    assert by_id.encode("bcabc").tokens == [SP, "bc", "a", "bc"]


def test_tied_merges_in_a_cycle_keep_vocabulary_order():
    # ("a","b") and ("b","a") tied: llama.cpp gives "ab"+"a" for "aba" and "ba"+"b" for "bab", and
    # no rank order gives both. The one with the lower id ranks first, in both texts.
    small = small_vocab([(SP, -10), ("a", -11), ("b", -12), ("ab", -1), ("ba", -1)])
    tok = Tokenizer.from_gguf_fields(spm_fields(small))
    assert pieces_of(tok, "aba") == [SP, "ab", "a"]
    assert tok.encode("aba", allow_special=False) == llama_cpp_spm("aba", small)
    assert pieces_of(tok, "bab") == [SP, "b", "ab"]  # llama.cpp: "▁", "ba", "b"


def test_scores_that_are_all_equal_fall_back_to_vocabulary_order():
    # What converters write for a model with only a tokenizer.json (-1000 for every token): the
    # order is then the vocabulary's, the BPE the model was trained with, not the overlap rule.
    small = small_vocab([(SP, -1000), ("a", -1000), ("b", -1000), ("c", -1000), ("bc", -1000),
                         ("ab", -1000)])
    tok = Tokenizer.from_gguf_fields(spm_fields(small))
    assert pieces_of(tok, "abc") == [SP, "a", "bc"]
    unscored = {k: v for k, v in spm_fields(small).items() if k != "tokenizer.ggml.scores"}
    assert pieces_of(Tokenizer.from_gguf_fields(unscored), "abc") == [SP, "a", "bc"]


@pytest.mark.parametrize("kind", ["bert", "t5", "rwkv", None])
def test_other_tokenizer_kinds_are_refused_by_name(kind):
    fields = {"tokenizer.ggml.model": kind, "tokenizer.ggml.tokens": ["a"]}
    with pytest.raises(ValueError, match=f"tokenizer.ggml.model={kind!r} is not supported"):
        Tokenizer.from_gguf_fields(fields)


def test_flags_from_the_file_are_honoured(vocab):
    tok = Tokenizer.from_gguf_fields(spm_fields(
        vocab, add_bos_token=False, add_eos_token=True, add_space_prefix=False, bos_token_id=3,
        eos_token_id=4))
    assert (tok.bos_token_id, tok.eos_token_ids, tok.add_bos, tok.add_eos) == (3, [4], False, True)
    text = "Hello world"
    ids = tok.encode_prompt(text)
    assert ids[-1] == 4 and 3 not in ids
    assert tok.convert_ids_to_tokens(ids[:1])[0][0] != SP  # no prefix space
    assert tok.decode(ids[:-1]) == text
    assert tok.decode(tok.encode(" x", allow_special=False)) == " x"  # nor a stripped one


# ---- decoding -----------------------------------------------------------------------------------


def stream(tok: Tokenizer, ids: list[int], chunk: int, rng: random.Random | None = None):
    det = IncrementalDetokenizer(tok, [], SamplingParams(skip_special_tokens=False))
    deltas, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 3) if rng else chunk
        det.add(ids[i : i + n])
        deltas.append(det.take_delta())
        i += n
    return deltas, det.flush()


def test_decode_round_trips_like_transformers(tok, theirs):
    for text in CORPUS:
        ids = tok.encode(text, allow_special=False)
        assert tok.decode(ids) == text == theirs.decode(ids), text


@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_streamed_text_equals_the_full_decode(tok, chunk):
    for text in CORPUS:
        ids = tok.encode(text, allow_special=False)
        deltas, tail = stream(tok, ids, chunk)
        assert "".join(deltas) + tail == tok.decode(ids) == text, text
        assert not any("\ufffd" in d for d in deltas), text


def test_a_character_split_over_byte_tokens_streams_whole(tok):
    ids = tok.encode("a € b", allow_special=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[-4:-1] == ["<0xE2>", "<0x82>", "<0xAC>"]  # € needs byte fallback here
    deltas, tail = stream(tok, ids, 1)
    assert "".join(deltas) + tail == "a € b"
    assert "€" in "".join(deltas)  # out before flush, once a non-byte token ends the run
    assert "\ufffd" not in "".join(deltas)


def test_random_byte_runs_stream_as_the_full_decode(tok):
    # Invalid runs decode to one U+FFFD per byte, whole run at once: "€" then a stray byte is four
    # U+FFFD. Streaming must match that however the tokens arrive.
    rng = random.Random(1)
    byte_ids = sorted(tok.byte_fallback_ids)
    assert len(byte_ids) == 256
    words = tok.encode("€ 日本 a", allow_special=False) + [EOS]
    for _ in range(300):
        ids = [rng.choice(byte_ids + words) for _ in range(rng.randint(1, 12))]
        deltas, tail = stream(tok, ids, 0, rng)
        assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=False), ids


def test_byte_runs_are_known_wherever_the_decoder_joins_them(tok, tmp_path):
    tok.backend.save(str(tmp_path / "tokenizer.json"))
    assert Tokenizer.from_hf_folder(tmp_path).byte_fallback_ids == tok.byte_fallback_ids
    # In a byte-level vocabulary "<0x41>" is just text: nothing to hold back.
    byte_level = Tokenizer.from_gguf_fields({"tokenizer.ggml.model": "gpt2",
                                             "tokenizer.ggml.tokens": [*byte_vocab(256), "<0x41>"]})
    assert byte_level.byte_fallback_ids == frozenset()


def test_token_bytes_spell_what_the_model_reads(tok, vocab):
    spelled = token_bytes(tok, tok.vocab_size)
    for i, (text, ty) in enumerate(zip(vocab["tokens"], vocab["types"], strict=True)):
        if ty in (CONTROL, UNKNOWN):
            assert spelled[i] is None, text
        elif ty == BYTE:
            assert spelled[i] == bytes([int(text[3:5], 16)]), text
        elif ty == NORMAL:
            assert spelled[i] == text.replace(SP, " ").encode(), text
    for text in CORPUS:
        ids = tok.encode(text, allow_special=False)
        # The prefix space is in the bytes; decode() drops it from the start of an output.
        assert b"".join(spelled[i] for i in ids) == (" " + text if text else "").encode(), text


# ---- the model ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(gguf_path):
    return LLM(str(gguf_path), kv_cache_gib=0.01)


def test_llm_loads_generates_and_streams_the_same_text(llm, tok):
    assert llm.tokenizer.encode(CORPUS[9], allow_special=False) == tok.encode(
        CORPUS[9], allow_special=False)
    params = SamplingParams(temperature=0.8, seed=0, max_tokens=24, ignore_eos=True)
    out = llm.generate("Hello world", params)[0]
    assert out.prompt_token_ids == [BOS, *tok.encode("Hello world", allow_special=False)]
    assert len(out.token_ids) == 24
    assert out.text == tok.decode(out.token_ids)


def test_chat_prompt_has_exactly_one_bos(llm, vocab):
    tok = llm.tokenizer
    inst, end_inst = vocab["tokens"].index("[INST]"), vocab["tokens"].index("[/INST]")
    content = "hi </s> [INST] <s>"
    ids = llm.engine.encode_chat([{"role": "user", "content": content}])
    # The template's own "<s>" and "[INST]" are tokens; the user's are text.
    assert ids == [BOS, inst, *tok.encode(f" {content} ", allow_special=False), end_inst]
    # A template without bos_token: BOS is added once, as add_bos (absent from the file) asks.
    plain = ChatFormatter(tok, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert plain.encode([{"role": "user", "content": "hi"}]) == [BOS, *tok.encode("hi", allow_special=False)]
    reply = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=8, seed=0))
    assert reply.output.prompt_token_ids.count(BOS) == 1
    assert reply.output.text == tok.decode(reply.output.token_ids)


def test_a_forced_tool_call_may_start_with_sentencepieces_space(llm):
    from engine.constrained.grammar import CallGrammar, tool_specs
    from engine.constrained.masks import CallMasks
    from engine.constrained.vocab import TokenVocab
    from engine.tool_parser import parse_tool_calls

    tools = [{"type": "function", "function": {"name": "now", "parameters": {
        "type": "object", "properties": {}}}}]
    tok = llm.tokenizer
    vocab = TokenVocab(tok, tok.vocab_size)
    g = CallGrammar(tool_specs(tools), "required")
    allowed = ~CallMasks(g, vocab, ()).disallowed(g.initial)
    assert allowed[vocab.bytes.index(b" ")]  # "▁": what "▁<" or "▁" + "<" starts with
    assert not allowed[vocab.bytes.index(b"a")]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=300, tool_choice="required")
    out = llm.generate("Call it", params, tools=tools)[0]
    parsed = parse_tool_calls(out.text)
    assert out.finish_reason == "stop" and parsed.errors == [], out.text
    assert [c.name for c in parsed.tool_calls] == ["now"], out.text


def test_json_output_over_a_sentencepiece_vocabulary(llm):
    """llguidance reads this vocabulary (byte fallback, ▁ for a space) as our token_bytes does."""
    import json

    from engine import StructuredOutputs

    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    spelled = token_bytes(llm.tokenizer, llm.tokenizer.vocab_size)
    matcher = llm.engine.json_constraints.matcher(StructuredOutputs(json=schema), [EOS])
    allowed = (~matcher.disallowed()).nonzero()[0]
    assert len(allowed)
    for i in allowed:  # '[' after optional whitespace (such as SentencePiece's prefix space)
        assert spelled[i] and (spelled[i].lstrip().startswith(b"[") or not spelled[i].strip())
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=200,
                             structured_outputs=StructuredOutputs(json=schema)) for s in range(4)]
    for out in llm.generate(["Numbers:"] * 4, params):
        value = json.loads(out.text)
        assert out.finish_reason == "stop" and 1 <= len(value) <= 3, out.text
        assert all(isinstance(v, int) for v in value), out.text


BOUND_TEMPLATE = ("{% for m in messages %}[INST]{{ m['role'] }}\n{{ m['content'] }}[/INST]"
                  "{% endfor %}{% if add_generation_prompt %}[INST]assistant\n{% endif %}")
BOUND_TEXT = list(" \n\t  abcdeéü日本語🦀€.,<>[]") + ["  ", "\n\n", " \t "]


def test_a_messages_bound_is_at_least_its_count_with_byte_fallback(tok):
    # The agent leaves a message uncounted while the prompt fits at its bound (agent.context):
    # SentencePiece writes each space "▁" (3 bytes for 1) and falls back to bytes for the rest.
    counter = MessageCounter(ChatFormatter(tok, BOUND_TEMPLATE))
    assert counter.bounded
    after = {"role": "system", "content": "You help."}
    rng = random.Random(7)
    had = 0
    for _ in range(3000):
        text = "".join(rng.choice(BOUND_TEXT) for _ in range(rng.randint(1, 30)))
        for role in ("user", "assistant", "tool"):
            message = {"role": role, "content": text}
            if role == "tool":
                message["tool_call_id"] = "call_1"
            bound = counter.bound(message, after)
            if bound is not None:
                had += 1
                assert bound >= counter.count(message, after), (role, repr(text))
    assert had > 1000
