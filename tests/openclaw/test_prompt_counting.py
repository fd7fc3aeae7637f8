"""A prompt's tokens are summed from counts kept per message (agent.counting): a long conversation
is not counted whole at every model call, and a model whose template does not count by sums is
found out and counted whole again."""

from __future__ import annotations

import json

from engine.chat import ChatFormatter
from engine.chat_count import MessageCounter
from engine.tokenizer import Tokenizer
from openclaw.agent.context import Budget, ContextBuilder
from openclaw.agent.counting import PromptCounter
from openclaw.backends.counting import UsageEstimate
from openclaw.store import Store
from tests.helpers.llama3_tokenizer import tokenizer_folder
from tests.helpers.scripted_model import ScriptedModel


class CountingModel(ScriptedModel):
    """Records how many messages each prompt it counts has; `joined` tokens more for each message
    after the second (a template that does not count by sums: say, one that joins messages)."""

    def __init__(self, joined: int = 0) -> None:
        super().__init__(lambda m: "Summary.", max_model_len=100_000)
        self.joined = joined
        self.counted: list[int] = []

    async def count_chat(self, messages, tools=None) -> int:
        self.counted.append(len(messages))
        return await super().count_chat(messages, tools) + self.joined * max(0, len(messages) - 2)


async def _conversation(tmp_path, messages: int) -> tuple[Store, int]:
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'openclaw.db'}")
    await store.ensure_user("terminal", "local")
    conversation = await store.active_conversation("terminal:local", "local", "terminal")
    for i in range(messages):
        await store.add_message(conversation.id, "user" if i % 2 == 0 else "assistant", f"line {i}")
    return store, conversation.id


async def test_a_long_conversation_is_not_counted_whole_at_every_model_call(tmp_path):
    store, conversation = await _conversation(tmp_path, 300)
    model = CountingModel()
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=90_000, keep_messages=8))
    try:
        first = await context.build(conversation, None)
        assert max(model.counted) == len(first)  # read from the store: counted whole once
        for turn in range(3):
            model.counted.clear()
            await context.add(conversation, "user", f"question {turn}")
            prompt = await context.build(conversation, None)
            await context.add(conversation, "assistant", f"answer {turn}")
            # The second build checks a sum against the whole count; after it, only the new
            # messages are counted, each alone.
            if turn > 0:
                assert model.counted and max(model.counted) <= 2, model.counted
            assert await model.count_chat(prompt) <= 90_000
    finally:
        await store.close()


async def test_a_model_that_does_not_count_by_sums_is_counted_whole_again(tmp_path):
    store, conversation = await _conversation(tmp_path, 20)
    model = CountingModel(joined=5)
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=90_000, keep_messages=8))
    try:
        await context.build(conversation, None)
        for turn in range(3):
            await context.add(conversation, "user", f"question {turn}")
            model.counted.clear()
            prompt = await context.build(conversation, None)
            assert max(model.counted) == len(prompt)  # whole, every time
        assert not context.counter.summing
    finally:
        await store.close()


async def test_a_sum_over_the_budget_is_decided_by_the_whole_count(tmp_path):
    """Sums only ever say "fits": a prompt a sum puts over the budget (here the template counts
    5 tokens less for each message than the message alone) is counted whole, and compacted only
    if that count is over too."""
    store, conversation = await _conversation(tmp_path, 10)
    model = CountingModel(joined=-5)
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=90_000, keep_messages=2))
    try:
        await context.build(conversation, None)
        await context.add(conversation, "user", "question")
        prompt = await context.build(conversation, None)  # the sum checked: it was more
        await context.add(conversation, "assistant", "answer")
        # Exactly at the budget, by the model's count of the next prompt: fits.
        context.budget.prompt_tokens = await model.count_chat(
            [*prompt, {"role": "assistant", "content": "answer"}])
        model.counted.clear()
        prompt = await context.build(conversation, None)
        assert max(model.counted) == len(prompt) == 13  # counted whole: nothing compacted
        assert model.generated == 0 and context.counter.summing
    finally:
        await store.close()


async def test_a_model_call_turns_only_the_new_messages_into_chat_messages(tmp_path):
    """The prompt's history is kept as chat messages between model calls (the old ones are the
    same objects), and equals the prompt built from the store afresh: calls left without a
    result read "not run", wherever they are."""
    store, conversation = await _conversation(tmp_path, 40)
    model = CountingModel()
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=90_000, keep_messages=8))
    try:
        first = await context.build(conversation, None)
        call = {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
        await context.add(conversation, "user", "what time is it?")
        await context.add(conversation, "assistant", "", tool_calls=[call])
        second = await context.build(conversation, None)  # the call has no result yet
        assert all(a is b for a, b in zip(first, second[:len(first)], strict=False)
                   if a["role"] != "system")
        assert second[-1]["content"].startswith("error: not run")
        await context.add(conversation, "user", "never mind")  # the call stays without one
        third = await context.build(conversation, None)
        afresh = ContextBuilder(model, store, "You help.", context.budget)
        assert third == await afresh.build(conversation, None)
        assert [m["role"] for m in third[-4:]] == ["user", "assistant", "tool", "user"]
    finally:
        await store.close()


class SystemJoinsUser(ScriptedModel):
    """50 tokens more for a prompt holding the system prompt and a user message together than
    for either apart: a message's count alone does not show them."""

    def __init__(self) -> None:
        super().__init__(lambda m: "An answer.", max_model_len=100_000)

    async def count_chat(self, messages, tools=None) -> int:
        joined = (any(m["role"] == "system" and m["content"] != "." for m in messages)
                  and any(m["role"] == "user" for m in messages))
        return await super().count_chat(messages, tools) + (50 if joined else 0)


async def test_a_message_is_checked_whole_against_the_budget_until_a_sum_held(tmp_path):
    store, _ = await _conversation(tmp_path, 0)
    model = SystemJoinsUser()
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=90_000, keep_messages=8))
    try:
        text = "word " * 100
        whole = await model.count_chat([{"role": "system", "content": "You help."},
                                        {"role": "user", "content": text}])
        context.budget.prompt_tokens = whole - 10  # the sum (40 under it) would say it fits
        assert not await context.fits_alone(text, None)
    finally:
        await store.close()


class EstimatingModel(ScriptedModel):
    """count_chat as the OpenAI backend counts without /tokenize nor a local tokenizer: an
    estimate whose rate follows the server's usage reports."""

    fixed_counts = False

    def __init__(self) -> None:
        super().__init__(lambda m: "Summary.", max_model_len=1_000_000)
        self.estimate = UsageEstimate()

    async def count_chat(self, messages, tools=None, tool_instructions=None) -> int:
        return self.estimate.count(messages, tools)


async def test_a_count_that_changes_is_never_summed_so_no_prompt_over_the_budget_is_sent(tmp_path):
    store, conversation = await _conversation(tmp_path, 200)
    model = EstimatingModel()
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=1_000_000,
                                                               keep_messages=8))
    try:
        await context.build(conversation, None)  # read, counted whole
        await context.add(conversation, "user", "question 0")
        await context.build(conversation, None)  # a sum would be checked here: it holds
        model.estimate.rates.append(0.5)  # a usage report: more tokens per character (x1.1 margin)
        await context.add(conversation, "assistant", "answer 0")
        await context.add(conversation, "user", "question 1")
        probe = ContextBuilder(model, store, "You help.", context.budget)
        whole = await model.count_chat(await probe.build(conversation, None))
        context.budget.prompt_tokens = whole - 50  # by the model's count now, it does not fit
        prompt = await context.build(conversation, None)
        assert await model.count_chat(prompt) <= context.budget.prompt_tokens
    finally:
        await store.close()
async def test_a_message_alone_is_counted_once_and_as_the_template_counts_it(tmp_path):
    # A user message's stored token_count is its count alone; once sums held, it comes from the
    # count the prompt's sum takes of it: the message is encoded once, not a second time alone.
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tokenizer_folder(folder)  # Llama 3's template: a date line in every prompt, a default system
    formatter = ChatFormatter(Tokenizer.from_hf_folder(folder))
    encoded: list[int] = []

    async def count(messages, tools, instructions) -> int:
        encoded.append(len(messages))
        return len(formatter.encode(messages, tools=tools))

    counter = PromptCounter(count)
    first = {"role": "user", "content": "hello there"}
    assert await counter.alone(first) == len(formatter.encode([first]))
    counter.check(10, 10)  # a sum held against a whole count
    for text in ("what time is it?", "  spaces and\nnewlines ", "émoji ✓ and <|eot_id|> typed"):
        chat = {"role": "user", "content": text}
        encoded.clear()
        await counter.message(chat)  # as the budget check and the prompt's sum take it
        assert await counter.alone(chat) == len(formatter.encode([chat])), text
        assert encoded == [2], encoded  # after the anchor, once; not again alone


async def test_new_messages_are_counted_without_the_template_and_their_sum_is_the_exact_count(
        tmp_path):
    # The engine's count_message (engine.chat_count): a new message's share of the prompt from
    # one tokenizer call, not two renderings of the template; summed, the exact count.
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tokenizer_folder(folder)  # Llama 3's template: contents trimmed, a date line in the system
    formatter = ChatFormatter(Tokenizer.from_hf_folder(folder))
    messages = MessageCounter(formatter)

    class EngineCounted(CountingModel):
        async def count_chat(self, chats, tools=None) -> int:
            self.counted.append(len(chats))
            return len(formatter.encode(chats, tools=tools))

        def count_message(self, message: dict, after: dict) -> int:
            return messages.count(message, after)

    store, conversation = await _conversation(tmp_path, 20)
    model = EngineCounted()
    context = ContextBuilder(model, store, "You help.", Budget(prompt_tokens=90_000, keep_messages=8))
    call = [{"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]
    try:
        await context.build(conversation, None)  # read from the store: counted whole once
        await context.add(conversation, "user", "first")
        await context.build(conversation, None)  # a sum checked against the whole count
        for text in ("  spaces and\nnewlines ", "émoji 🦀 and <|eot_id|> typed", "plain", "\n"):
            model.counted.clear()
            await context.add(conversation, "user", text)
            prompt = await context.build(conversation, None)
            await context.add(conversation, "assistant", f" {text} ", tool_calls=call)
            await context.add(conversation, "tool", f"result of {text}", tool_call_id="c1")
            assert model.counted == [], model.counted  # no template rendered for them
            summed = await context.counter.head(prompt[0], None) + sum(
                [await context.counter.message(chat) for chat in prompt[1:]])
            assert summed == len(formatter.encode(prompt)), text
        assert context.counter.summing and context.counter.checked
    finally:
        await store.close()


async def test_a_tool_set_is_counted_once_and_any_change_to_it_counted_again():
    # The system prompt with the tools is counted once per tool set, however many lists hold it;
    # a schema that only compares equal (1 and True) is another text to the model: counted apart.
    counted: list[str] = []

    async def count(messages, tools, instructions) -> int:
        counted.append(json.dumps(tools))
        return len(counted[-1])

    def tools(default) -> list[dict]:
        return [{"type": "function", "function": {"name": "clock", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "default": default}}}}}]

    counter = PromptCounter(count)
    system = {"role": "system", "content": "You help."}
    first = await counter.head(system, tools(1))
    assert await counter.head(dict(system), tools(1)) == first and len(counted) == 1
    assert await counter.head(system, tools(True)) == first + 3 and len(counted) == 2
    assert await counter.head(system, tools(1.0)) == first + 2 and len(counted) == 3
    assert await counter.head(system, tools(1), "{tools}") == first and len(counted) == 4


async def test_far_from_the_budget_new_messages_wait_at_their_bounds_and_are_counted_together(
        tmp_path):
    # While a prompt fits with its new messages at their bounds (no encoding: engine.chat_count),
    # they are not counted; once the bounds no longer fit, all of them are, in one go. The prompts
    # built (and when the history is compacted) are those of counting every message at once.
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tokenizer_folder(folder)
    formatter = ChatFormatter(Tokenizer.from_hf_folder(folder))
    counter = MessageCounter(formatter)
    budget = 700

    class EngineCounted(CountingModel):
        def __init__(self, bounds: bool) -> None:
            super().__init__()
            self.message_counts = 0
            if not bounds:
                self.bound_message = None

        async def count_chat(self, chats, tools=None) -> int:
            return len(formatter.encode(chats, tools=tools))

        def count_message(self, message: dict, after: dict) -> int:
            self.message_counts += 1
            return counter.count(message, after)

        def bound_message(self, message: dict, after: dict) -> int | None:
            return counter.bound(message, after)

    runs = []
    for bounds in (True, False):
        store, conversation = await _conversation(tmp_path / str(bounds), 6)
        model = EngineCounted(bounds)
        context = ContextBuilder(model, store, "You help.", Budget(budget, keep_messages=4))
        prompts, counts_per_build = [], []
        try:
            await context.build(conversation, None)
            for i in range(40):
                await context.add(conversation, "user" if i % 2 == 0 else "assistant",
                                  f"message {i}: " + "some words of the conversation " * 3)
                before = model.message_counts
                prompt = await context.build(conversation, None)
                counts_per_build.append(model.message_counts - before)
                prompts.append(prompt)
                assert len(formatter.encode(prompt)) <= budget
        finally:
            await store.close()
        runs.append((prompts, counts_per_build, model.generated))
    (bounded, bounded_counts, summaries), (exact, exact_counts, exact_summaries) = runs
    assert bounded == exact and summaries == exact_summaries > 0  # the same prompts, compactions
    assert bounded_counts.count(0) >= 5  # builds that encoded none of their new messages
    assert max(bounded_counts) > 1  # those waiting at their bounds, counted together
    assert sum(bounded_counts) <= sum(exact_counts)  # each counted once at most, or never
