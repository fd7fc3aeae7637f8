"""POST /v1/completions, /tokenize and /detokenize, GET /v1/models: vLLM's shapes, and counts that
agree with what the generating endpoints send the model."""

from __future__ import annotations

import httpx

from tests.helpers.tools import TOOLS

HELLO = [{"role": "user", "content": "Say hello."}]


SERVER = {"served_model_name": "tiny"}

def tokenize(api, **body) -> dict:
    return httpx.post(api.url + "/tokenize", json=body).json()


def test_models_lists_the_served_name_with_its_context_length(api, llm, client):
    (card,) = client.models.list().data
    assert card.id == "tiny" and card.object == "model" and card.owned_by == "openclaw"
    assert card.model_extra["max_model_len"] == 1024 == llm.max_model_len
    assert client.models.retrieve("tiny").id == "tiny"


def test_a_text_prompt_is_completed_and_counted_as_tokenize_counts_it(api, client):
    reply = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert reply.object == "text_completion" and reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == tokenize(api, prompt="Once upon a time")["count"]
    assert reply.usage.completion_tokens == 5 and reply.choices[0].text


def test_token_ids_and_text_of_the_same_prompt_complete_alike(api, client):
    ids = tokenize(api, prompt="Once upon a time")["tokens"]
    by_text = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6,
                                        temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_a_batch_of_prompts_with_n_numbers_choices_prompt_by_prompt(client):
    reply = client.completions.create(model="tiny", prompt=["The sky is", "Water is"], n=2,
                                      max_tokens=3, seed=5, extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.usage.completion_tokens == 12
    again = client.completions.create(model="tiny", prompt="Water is", n=2, max_tokens=3, seed=5,
                                      extra_body={"ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in reply.choices[2:]]


def test_a_streamed_completion_adds_up_to_the_whole_one(client):
    whole = client.completions.create(model="tiny", prompt="Hello", max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model="tiny", prompt="Hello", max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens


def test_tokenize_counts_a_chat_exactly_as_chat_completions_does(api, client):
    for tools in (None, TOOLS):
        counted = tokenize(api, messages=HELLO, **({"tools": tools} if tools else {}))
        reply = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=1,
                                               **({"tools": tools} if tools else {}))
        assert counted["count"] == len(counted["tokens"]) == reply.usage.prompt_tokens
        assert counted["max_model_len"] == 1024
    without_prompt = tokenize(api, messages=HELLO, add_generation_prompt=False)["count"]
    assert without_prompt < tokenize(api, messages=HELLO)["count"]


def test_detokenize_gives_back_what_was_tokenized_special_tokens_and_all(api):
    out = tokenize(api, messages=HELLO, return_token_strs=True)
    assert len(out["token_strs"]) == out["count"] and out["token_strs"][0] == "<|im_start|>"
    text = httpx.post(api.url + "/detokenize", json={"tokens": out["tokens"]}).json()["prompt"]
    assert text == "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
    plain = tokenize(api, prompt="<|im_start|>x", add_special_tokens=False)
    assert plain["tokens"][0] == out["tokens"][0]  # a completion's prompt may hold special tokens
