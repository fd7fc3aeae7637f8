"""logprobs through the official `openai` client: chat's shape (logprobs.content with token,
logprob, bytes, top_logprobs) and the legacy completions' (tokens, token_logprobs, top_logprobs,
text_offset), whole and streamed, with the values the engine reports for the same request."""

from __future__ import annotations

import httpx

from engine import SamplingParams

HELLO = [{"role": "user", "content": "Say hello."}]
MODEL = "chat-model0"


def engine_output(api, llm, prompt_ids: list[int], **params):
    """The engine's own final output for these ids, on the server's engine."""
    async def run():
        final = None
        async for out in llm.generate(prompt_ids, SamplingParams(**params)):
            final = out
        return final

    return api.call(run())


def chat_ids(api, messages) -> list[int]:
    return httpx.post(api.url + "/tokenize", json={"messages": messages}).json()["tokens"]


def token_text(llm, token: int) -> str:
    return llm.tokenizer.decode([token], skip_special_tokens=False)


def test_chat_logprobs_are_the_engines_with_top_lists_of_the_asked_length(api, llm, client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8,
                                           temperature=0, logprobs=True, top_logprobs=5,
                                           extra_body={"ignore_eos": True})
    content = reply.choices[0].logprobs.content
    ours = engine_output(api, llm, chat_ids(api, HELLO), temperature=0, max_tokens=8,
                         ignore_eos=True, logprobs=5).logprobs
    assert len(content) == len(ours) == 8
    for entry, lp in zip(content, ours, strict=True):
        assert entry.logprob == lp.logprob and entry.token == token_text(llm, lp.token_id)
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert [(t.token, t.logprob) for t in entry.top_logprobs] == \
            [(token_text(llm, t), v) for t, v in lp.top]
        top = [t.logprob for t in entry.top_logprobs]
        assert len(top) == 5 and top == sorted(top, reverse=True)
        # Greedy: the sampled token is the most likely one.
        assert (entry.top_logprobs[0].token, entry.top_logprobs[0].logprob) == \
            (entry.token, entry.logprob)
    assert "".join(e.token for e in content) == reply.choices[0].message.content


def test_a_sampled_token_is_in_the_top_list_where_its_logprob_ranks(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24,
                                           temperature=1.5, seed=4, logprobs=True, top_logprobs=3)
    ranked = 0
    for entry in reply.choices[0].logprobs.content:
        top = [(t.token, t.logprob) for t in entry.top_logprobs]
        if entry.logprob >= top[-1][1]:
            assert (entry.token, entry.logprob) in top
            ranked += 1
        else:
            assert all(logprob > entry.logprob for _, logprob in top)
    assert ranked < 24, "temperature 1.5 on a random model always picked a top-3 token"


def test_streamed_chat_logprobs_add_up_to_the_whole_answers(client):
    ask = dict(model=MODEL, messages=HELLO, max_tokens=10, temperature=0, logprobs=True,
               top_logprobs=2)
    whole = client.chat.completions.create(**ask).choices[0]
    chunks = list(client.chat.completions.create(**ask, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole.logprobs.content]
    # Logprobs ride on chunks with content, or on the one that finishes the choice.
    assert all(c.choices[0].delta.content or c.choices[0].finish_reason
               for c in chunks if c.choices and c.choices[0].logprobs)


def test_without_logprobs_there_are_none_and_without_top_logprobs_no_top_lists(client):
    plain = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert plain.choices[0].logprobs is None
    bare = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3,
                                          logprobs=True, extra_body={"ignore_eos": True})
    content = bare.choices[0].logprobs.content
    assert len(content) == 3 and all(e.top_logprobs == [] for e in content)


def test_completion_logprobs_in_the_legacy_shape_are_the_engines(api, llm, client):
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                      temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    lp = choice.logprobs
    ids = httpx.post(api.url + "/tokenize", json={"prompt": "Once upon a time"}).json()["tokens"]
    ours = engine_output(api, llm, ids, temperature=0, max_tokens=8, ignore_eos=True,
                         logprobs=3).logprobs
    assert lp.tokens == [token_text(llm, e.token_id) for e in ours]
    assert lp.token_logprobs == [e.logprob for e in ours]
    for k, (top, e) in enumerate(zip(lp.top_logprobs, ours, strict=True)):
        # The three most likely, and the sampled token (here the first of them: greedy).
        assert top == {token_text(llm, t): v for t, v in e.top}
        assert top[lp.tokens[k]] == lp.token_logprobs[k] == max(top.values())
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for token, offset in zip(lp.tokens, lp.text_offset, strict=True):
        if "\ufffd" not in token:
            assert choice.text[offset:].startswith(token)


def test_a_completion_sampled_outside_its_top_list_adds_the_sampled_token(client):
    reply = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=1.5,
                                      seed=4, logprobs=1, extra_body={"ignore_eos": True})
    lp = reply.choices[0].logprobs
    sizes = {len(top) for top in lp.top_logprobs}
    assert sizes <= {1, 2} and 2 in sizes  # k + 1 where the sampled token was not the top one
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob


def test_streamed_completion_logprobs_add_up_to_the_whole_ones(client):
    ask = dict(model=MODEL, prompt="Hello", max_tokens=10, temperature=0, logprobs=2)
    whole = client.completions.create(**ask).choices[0].logprobs
    chunks = [c for c in client.completions.create(**ask, stream=True) if c.choices]
    joined = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in chunks:
        for key, values in joined.items():
            values.extend(getattr(c.choices[0].logprobs, key))
    assert joined == {key: getattr(whole, key) for key in joined}
