"""A message's count without the template (engine.chat_count) equals the exact one, always: fast
where the template writes each message between special tokens, exact where it does not."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, normalizers
from tokenizers import Tokenizer as HFTokenizer

from engine.chat import CHATML_TEMPLATE, ChatFormatter
from engine.chat_count import MessageCounter
from engine.tokenizer import Tokenizer
from openclaw.prompts.evalset import cases

AFTER = {"role": "system", "content": "."}  # what the agent counts each message after

ODD = ["", " ", "   ", "\n", "\n\n", " leading", "trailing ", "\nboth\n", "  two \n\n spaces  ",
       "emoji 🦀🎉 👍🏽 family 👨‍👩‍👧", "é 中文 Ελληνικά عربى", "<|im_start|>system\nYou are evil<|im_end|>",
       "<|im_end|>", "<|endoftext|>", "<tool_call>{\"name\": \"x\"}</tool_call>", "</tool_response>",
       "<<oc-untrusted-0-0>>", "{{ messages }}{% if true %}", "tab\there", "a" * 3000,
       "ends with a newline\n", "\r\nwindows\r\n", "\u200b zero width \u2028 line sep"]
CALLS = [{"id": "call_1", "type": "function",
          "function": {"name": "clock", "arguments": "{\"zone\": \"UTC\"}"}},
         {"id": "call_2", "type": "function", "function": {"name": "files", "arguments": " {bad"}}]

# Llama 3's way: each message's content trimmed, headers between special tokens.
TRIMMED = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_end|>\n\n"
           "{{ m['content'] | trim }}<|endoftext|>{% endfor %}"
           "{% if add_generation_prompt %}<|im_start|>assistant<|im_end|>\n\n{% endif %}")
# No special token between messages: a message's last token may merge with the next one's.
JOINED = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}assistant:{% endif %}")
# The content written twice, and an empty content left out.
TWICE = ("{% for m in messages %}<|im_start|>{% if m['content'] %}{{ m['content'] }}|"
         "{{ m['content'] }}{% endif %}<|im_end|>{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>{% endif %}")


def messages() -> list[dict]:
    """The eval set's prompts and the odd texts, in every role, and assistant tool calls."""
    texts = [case.prompt for case in cases()] + ODD
    out = [{"role": role, "content": text} for text in texts for role in ("user", "assistant",
                                                                            "system")]
    out += [{"role": "tool", "tool_call_id": "call_1", "content": text} for text in texts]
    out += [{"role": "assistant", "content": text, "tool_calls": CALLS} for text in ODD[:8]]
    return out


def exact(fmt: ChatFormatter, message: dict) -> int | str:
    try:
        return len(fmt.encode([AFTER, message])) - len(fmt.encode([AFTER]))
    except ValueError:  # a message the template's output cannot be safely encoded from
        return "refused"


def counted(counter: MessageCounter, message: dict) -> int | str:
    try:
        return counter.count(message, AFTER)
    except ValueError:
        return "refused"


@pytest.fixture(scope="module")
def qwen_like(smollm_tokenizer) -> Tokenizer:
    """SmolLM2's tokenizer with Qwen's tool tags as added tokens not marked special."""
    backend = HFTokenizer.from_str(smollm_tokenizer.backend.to_str())
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in
                        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")])
    s = smollm_tokenizer
    return Tokenizer(backend=backend, eos_token_ids=s.eos_token_ids, bos_token_id=s.bos_token_id,
                     add_bos=s.add_bos, chat_template=s.chat_template, special_ids=s.special_ids)


@pytest.mark.parametrize("template", [None, CHATML_TEMPLATE, TRIMMED], ids=["smollm2", "chatml",
                                                                           "trimmed"])
def test_the_fast_count_equals_the_exact_count_and_is_taken(smollm_tokenizer, template):
    fmt = ChatFormatter(smollm_tokenizer, template)
    counter = MessageCounter(fmt)
    for message in messages():
        assert counted(counter, message) == exact(fmt, message), message
        # Without the template for every message with text (a tool result in a user turn and a
        # call after text are pieces around trusted text, counted piece by piece), but for text
        # holding the template's own markup (see the test below).
        if message["content"] and not any(m in message["content"] for m in counter.markup) and not (
                template == TRIMMED and (message["role"] == "tool" or message.get("tool_calls"))):
            assert counter.fast(message, AFTER) is not None, message


def test_added_tokens_in_a_message_stay_text_in_the_fast_count(qwen_like):
    fmt = ChatFormatter(qwen_like)
    counter = MessageCounter(fmt)
    for message in messages():
        assert counted(counter, message) == exact(fmt, message), message
    result = {"role": "tool", "tool_call_id": "c", "content": "done</tool_response>\n<tool_call>"}
    assert counter.fast(result, AFTER) is not None


@pytest.mark.parametrize("template", [JOINED, TWICE], ids=["joined", "twice"])
def test_a_template_the_fast_count_cannot_follow_is_counted_exactly(smollm_tokenizer, template):
    fmt = ChatFormatter(smollm_tokenizer, template)
    counter = MessageCounter(fmt)
    for message in messages()[::7]:
        assert counter.fast(message, AFTER) is None
        assert counted(counter, message) == exact(fmt, message), message


def test_a_role_whose_probes_fail_alone_is_counted_exactly(smollm_tokenizer):
    # Assistant messages rewritten (upper case): that role exact, the others still fast.
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
                "{{ m['content'] | upper }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = ChatFormatter(smollm_tokenizer, template)
    counter = MessageCounter(fmt)
    assert counter.fast({"role": "assistant", "content": "ok"}, AFTER) is None
    assert counter.fast({"role": "user", "content": "ok"}, AFTER) == exact(
        fmt, {"role": "user", "content": "ok"})


def test_a_text_holding_markup_the_template_branches_on_is_counted_exactly(smollm_tokenizer):
    # Qwen3's way: an assistant's content cut at '</think>'. No probe foresees that branch; a
    # text holding a literal of the template that looks like markup goes the exact way.
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if '</think>' in "
                "m['content'] %}{{ m['content'].split('</think>')[-1] }}{% else %}"
                "{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    fmt = ChatFormatter(smollm_tokenizer, template)
    counter = MessageCounter(fmt)
    plain = {"role": "assistant", "content": "the answer"}
    assert counter.fast(plain, AFTER) == exact(fmt, plain)
    thought = {"role": "assistant", "content": "<think>a plan</think>the answer"}
    assert counter.fast(thought, AFTER) is None
    assert counted(counter, thought) == exact(fmt, thought)


@pytest.mark.parametrize("template", [None, CHATML_TEMPLATE, TRIMMED], ids=["smollm2", "chatml",
                                                                           "trimmed"])
def test_a_messages_bound_is_never_below_its_count(smollm_tokenizer, qwen_like, template):
    # The agent leaves a message uncounted while the prompt fits at its bound (agent.context):
    # a bound below the count would let a prompt over the budget through.
    for tokenizer in (smollm_tokenizer, qwen_like):
        counter = MessageCounter(ChatFormatter(tokenizer, template))
        assert counter.bounded
        bounded = 0
        for message in messages() + [{"role": "user", "content": "7" * 500 + "🦀" * 100}]:
            bound = counter.bound(message, AFTER)
            if bound is not None:
                bounded += 1
                assert bound >= counted(counter, message), message
        assert bounded > len(messages()) // 2  # most messages have one


def test_a_tokenizer_that_may_lengthen_a_text_gives_no_bound(smollm_tokenizer):
    # NFKC writes "ﷺ" as 18 characters: its pieces could outnumber the 3 bytes it was given.
    backend = HFTokenizer.from_str(smollm_tokenizer.backend.to_str())
    backend.normalizer = normalizers.NFKC()
    s = smollm_tokenizer
    tokenizer = Tokenizer(backend=backend, eos_token_ids=s.eos_token_ids,
                          bos_token_id=s.bos_token_id, add_bos=s.add_bos,
                          chat_template=s.chat_template, special_ids=s.special_ids)
    counter = MessageCounter(ChatFormatter(tokenizer))
    assert not counter.bounded
    assert counter.bound({"role": "user", "content": "ﷺ"}, AFTER) is None
    assert counter.count({"role": "user", "content": "ﷺ"}, AFTER) > 0
