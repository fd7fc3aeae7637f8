"""IncrementalDetokenizer against the real SmolLM2 byte-level BPE tokenizer."""

from __future__ import annotations

import random

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams

FFFD = "\ufffd"

TEXTS = [
    "Hello, world! This is plain ASCII.",
    "  leading spaces and  double  spaces ",
    "def f(x):\n    if x:\n\treturn [i for i in range(10)]\n    return None\n",
    "Rust 🦀 is great 👍🏽👍🏽!",
    "🦀",
    "日本語のテキストです。中文也可以。",
    "café naïve Ångström señor Œuvre",
    "mixed: 日本 and 🦀 and é — “quotes” … done\n\n",
    " 12345 digits 3.14159",
]


def stream(tok, ids, params=None, chunk=1):
    """Feed `ids` `chunk` at a time; return (deltas taken after each add, flush(), stop, det)."""
    det = IncrementalDetokenizer(tok, [1, 2, 3], params or SamplingParams())
    deltas, stop = [], None
    for i in range(0, len(ids), chunk):
        got = det.add(ids[i : i + chunk])
        deltas.append(det.take_delta())
        if got is not None:
            stop = got
            break
    return deltas, det.flush(), stop, det


def encode(tok, text):
    return tok.encode(text, allow_special=False)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_deltas_join_to_full_decode_with_no_replacement_chars(smollm_tokenizer, text, chunk):
    ids = encode(smollm_tokenizer, text)
    deltas, tail, stop, det = stream(smollm_tokenizer, ids, chunk=chunk)
    assert stop is None
    assert "".join(deltas) + tail == smollm_tokenizer.decode(ids) == text
    assert det.text == text
    assert not any(FFFD in d for d in deltas)


def test_split_emoji_is_withheld_until_its_last_byte_token(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "a🦀")
    assert len(ids) >= 3  # the crab is several byte tokens; otherwise this test checks nothing
    det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams())
    det.add(ids[:-1])
    assert det.take_delta() == "a"
    assert det.text == "a"
    det.add(ids[-1:])
    assert det.take_delta() == "🦀"


def test_text_cut_mid_character_flushes_as_decode_does(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "ok 🦀")[:-1]  # the crab's last byte never arrives
    deltas, tail, _, det = stream(smollm_tokenizer, ids)
    assert "".join(deltas) == "ok "
    assert "".join(deltas) + tail == smollm_tokenizer.decode(ids)
    assert tail.endswith(FFFD)
    assert det.text == smollm_tokenizer.decode(ids)


def test_stop_string_spanning_tokens_truncates_at_match_start(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "Hello world, and more after")
    assert "lo wor" not in smollm_tokenizer.convert_ids_to_tokens(ids)
    deltas, tail, stop, det = stream(smollm_tokenizer, ids, SamplingParams(stop=["lo wor"]))
    assert stop == "lo wor"
    assert det.text == "Hel"
    assert "".join(deltas) + tail == "Hel"


def test_include_stop_str_in_output_keeps_the_stop_string(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "Hello world, and more after")
    params = SamplingParams(stop=["lo wor"], include_stop_str_in_output=True)
    deltas, tail, stop, det = stream(smollm_tokenizer, ids, params)
    assert stop == "lo wor"
    assert det.text == "Hello wor"
    assert "".join(deltas) + tail == "Hello wor"


def test_stop_string_ending_in_a_split_character_matches_only_when_complete(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "見て日本語だ")
    deltas, tail, stop, det = stream(smollm_tokenizer, ids, SamplingParams(stop=["本語"]))
    assert stop == "本語"
    assert det.text == "見て日"
    assert "".join(deltas) + tail == "見て日"
    assert not any(FFFD in d for d in deltas)


def test_earliest_stop_in_one_batch_wins_over_list_order(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "alpha beta gamma")
    det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams(stop=["gamma", "beta"]))
    assert det.add(ids) == "beta"
    assert det.text == "alpha "


def test_stop_completed_by_last_char_of_a_new_batch_is_found(smollm_tokenizer):
    # The match starts len(stop) - 1 characters before the new text: the search window's edge.
    det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams(stop=["STOP"]))
    assert det.add(encode(smollm_tokenizer, "xx STO")) is None
    assert det.add(encode(smollm_tokenizer, "P")) == "STOP"
    assert det.text == "xx "


def test_possible_stop_prefix_is_held_back_then_released_by_flush(smollm_tokenizer):
    ids = encode(smollm_tokenizer, "Say Hel")
    deltas, tail, stop, _ = stream(smollm_tokenizer, ids, SamplingParams(stop=["Hello!"]))
    assert stop is None
    assert "".join(deltas) == "Say "
    assert tail == "Hel"


def test_disproved_stop_prefix_is_released_without_waiting_for_flush(smollm_tokenizer):
    det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams(stop=["<END>"]))
    det.add(encode(smollm_tokenizer, "a <EN"))
    assert det.take_delta() == "a "
    det.add(encode(smollm_tokenizer, "D"))
    assert det.take_delta() == ""  # "<END" could still become "<END>"
    det.add(encode(smollm_tokenizer, "X and on"))
    assert det.take_delta() == "<ENDX and on"
    assert det.flush() == ""


def test_no_stop_means_text_streams_with_nothing_held(smollm_tokenizer):
    det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams())
    det.add(encode(smollm_tokenizer, "Hel"))
    assert det.take_delta() == "Hel"
    assert det.flush() == ""


def test_skip_special_tokens_drops_im_end_from_text(smollm_tokenizer):
    im_end = smollm_tokenizer.token_to_id("<|im_end|>")
    ids = encode(smollm_tokenizer, "a 🦀") + [im_end] + encode(smollm_tokenizer, " b")
    deltas, tail, _, det = stream(smollm_tokenizer, ids, SamplingParams(skip_special_tokens=True))
    assert det.text == "".join(deltas) + tail == "a 🦀 b"


def test_special_tokens_kept_when_not_skipped_and_can_match_a_stop(smollm_tokenizer):
    im_end = smollm_tokenizer.token_to_id("<|im_end|>")
    ids = encode(smollm_tokenizer, "a") + [im_end] + encode(smollm_tokenizer, " b")
    kept = stream(smollm_tokenizer, ids, SamplingParams(skip_special_tokens=False))[3]
    assert kept.text == "a<|im_end|> b"
    params = SamplingParams(skip_special_tokens=False, stop=["<|im_end|>"])
    _, _, stop, det = stream(smollm_tokenizer, ids, params)
    assert stop == "<|im_end|>"
    assert det.text == "a"


def test_add_after_stop_is_ignored(smollm_tokenizer):
    det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams(stop=["."]))
    assert det.add(encode(smollm_tokenizer, "One. Two")) == "."
    assert det.take_delta() == "One"
    assert det.add(encode(smollm_tokenizer, " Three.")) is None
    assert det.text == "One"
    assert det.take_delta() == ""
    assert det.flush() == ""


def test_each_step_decodes_only_a_small_window(smollm_tokenizer):
    calls: list[int] = []

    class Spy:
        special_ids = smollm_tokenizer.special_ids

        def decode(self, ids, *, skip_special_tokens=True):
            calls.append(len(ids))
            return smollm_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    text = "Streaming 🦀 text, 日本語 and more. " * 40
    ids = encode(smollm_tokenizer, text)
    deltas, tail, _, _ = stream(Spy(), ids, SamplingParams(stop=["never appears"]))
    assert "".join(deltas) + tail == text
    assert len(ids) > 300
    assert max(calls) <= 8  # a few tokens of context, not the whole output


def test_random_byte_tokens_in_random_batches_join_to_full_decode(smollm_tokenizer):
    # Single-byte tokens in random order make split, invalid and truncated UTF-8 of every kind.
    rng = random.Random(0)
    vocab = smollm_tokenizer.backend.get_vocab()
    byte_ids = sorted(i for t, i in vocab.items() if len(t) == 1)
    word_ids = encode(smollm_tokenizer, "日本 🦀 é ok")
    for _ in range(200):
        ids = [rng.choice(byte_ids + word_ids) for _ in range(rng.randint(1, 12))]
        det = IncrementalDetokenizer(smollm_tokenizer, [], SamplingParams())
        out, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 3)
            det.add(ids[i : i + n])
            out.append(det.take_delta())
            i += n
        assert "".join(out) + det.flush() == smollm_tokenizer.decode(ids), ids
