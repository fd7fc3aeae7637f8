"""The embedded SmolLM2-135M-Instruct GGUF through our loader, against transformers' own GGUF
loading of the same file: tokenizer, logits at every position, greedy tokens batched."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from engine import LLM, SamplingParams
from tests.helpers.hf_reference import compare_greedy, greedy

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
    "Translate 'good morning' into Spanish and German.",
]


@pytest.fixture(scope="module")
def reference(smollm_gguf_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(smollm_gguf_path)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return tok, model.eval()


@pytest.fixture(scope="module")
def llm(embedded_fp32_llm):
    return embedded_fp32_llm  # the exact fp32 path


def chat_ids(llm: LLM, text: str) -> list[int]:
    return llm.engine.encode_chat([{"role": "user", "content": text}])


def test_tokenizer_rebuilt_from_gguf_matches_transformers(llm, reference):
    tok, _ = reference
    texts = ["Hello, world!", "  two  spaces\n\nand tabs\t", "naïve café 日本語 🦀",
             "def f(x):\n    return x ** 2\n", "<|im_start|>user\nhi<|im_end|>\n"]
    for text in texts:
        assert llm.tokenizer.encode(text, allow_special=True) == tok.encode(
            text, add_special_tokens=False)


def test_prefill_logits_match_transformers_at_every_position(llm, reference):
    _, model = reference
    ids = chat_ids(llm, CHATS[2])
    ours = llm.engine.runner.prefill_logits(ids)
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0]
    assert (ours - theirs).abs().max().item() < 2e-3


def test_greedy_tokens_match_transformers_when_batched(llm, reference):
    _, model = reference
    batch = [chat_ids(llm, text) for text in CHATS]
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    for ids, out in zip(batch, outs, strict=True):
        note = compare_greedy(out.token_ids, greedy(model, ids, 32))
        if note:
            warnings.warn(note, stacklevel=1)


def test_chat_answers_and_stops_at_end_of_turn(llm):
    out = llm.chat([{"role": "user", "content": CHATS[0]}],
                   SamplingParams(temperature=0.0, max_tokens=64))
    assert "Paris" in out.content
    assert out.finish_reason == "stop"
    assert out.output.token_ids[-1] == 2  # <|im_end|> ended the turn, and is not in the text
    assert "<|im_end|>" not in out.content
