"""[agent.sampling] presets reach each kind of model call, and a reply that loops is cut short
with the non-repeated part delivered."""

from __future__ import annotations

import asyncio

from openclaw.agent.repetition import LoopGuard
from tests.helpers.daemon import say, started
from tests.helpers.scripted_model import ScriptedModel

LOOP = "I'm happy to help with anything you need. "


class RecordingModel(ScriptedModel):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.params: list = []

    def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                 cache_salt=None):
        self.params.append(params)
        return super().generate(prompt, params, request_id, tools=tools, priority=priority,
                                cache_salt=cache_salt)


def summarising(messages: list[dict]) -> bool:
    return "You write the memory" in messages[0]["content"]


async def test_each_purpose_gets_its_preset(tmp_path):
    model = RecordingModel(lambda m: "Summary." if summarising(m) else "A reply of a few words.")
    daemon, conn = await started(tmp_path, model, """
context_tokens = 700
reply_max_tokens = 100
compaction_keep_messages = 2
tool_call_threshold = 0.2
[agent.sampling.chat]
repetition_penalty = 1.3
frequency_penalty = 0.5
[agent.sampling.tool_arguments]
temperature = 0.1
[agent.sampling.summary]
temperature = 0.4
repetition_penalty = 1.05
""")
    for i in range(12):  # enough words to outgrow 600 prompt tokens: older turns are summarised
        await say(daemon, conn, f"message {i}: " + "word " * 60)
    await daemon.stop()
    replies = [p for p, prompt in zip(model.params, model.prompts, strict=True)
               if not summarising(prompt)]
    summaries = [p for p, prompt in zip(model.params, model.prompts, strict=True)
                 if summarising(prompt)]
    assert replies and summaries
    reply = replies[-1]
    assert (reply.temperature, reply.repetition_penalty, reply.frequency_penalty) == (0.0, 1.3, 0.5)
    assert reply.tool_choice == "auto" and reply.tool_call_threshold == 0.2
    assert reply.call_params.temperature == 0.1 and reply.call_params.repetition_penalty == 1.0
    summary = summaries[-1]
    assert (summary.temperature, summary.repetition_penalty) == (0.4, 1.05)
    assert summary.max_tokens == 256 and summary.call_params is None


async def test_the_chat_preset_guards_against_repetition_by_default(tmp_path):
    model = RecordingModel(lambda m: "Hello.")
    daemon, conn = await started(tmp_path, model)
    await say(daemon, conn, "hi")
    await daemon.stop()
    params = model.params[-1]
    assert params.repetition_penalty > 1.0
    assert params.call_params.repetition_penalty == 1.0 and params.call_params.temperature == 0.0


async def test_a_reply_that_loops_is_ended_and_delivered_without_the_repeats(tmp_path):
    model = ScriptedModel(lambda m: "Sure! " + LOOP * 300, chunk=8)
    daemon, conn = await started(tmp_path, model)
    reply = await say(daemon, conn, "hello")
    await daemon.stop()
    assert reply == "Sure! " + LOOP.strip()
    assert model.aborted  # the stream was closed early: the engine's request ends there
    assert model.spent[-1][1] < len(LOOP) * 6  # not 300 repeats' worth of tokens


async def test_the_loop_guard_can_be_turned_off(tmp_path):
    model = ScriptedModel(lambda m: LOOP * 5, chunk=64)
    daemon, conn = await started(tmp_path, model, "loop_repeats = 0")
    reply = await say(daemon, conn, "hello")
    await daemon.stop()
    assert reply == (LOOP * 5).strip()


def feed(guard: LoopGuard, text: str, step: int = 5) -> bool:
    return any(guard.looping(text[:end]) for end in range(step, len(text) + step, step))


def test_alternating_sentences_count_as_a_loop():
    text = ("The weather is nice today in Paris. I like it a lot. The weather is nice today in "
            "Paris. Truly. The weather is nice today in Paris. And more text follows here.")
    guard = LoopGuard(3)
    assert feed(guard, text)
    assert guard.kept == "The weather is nice today in Paris. I like it a lot."


def test_ordinary_text_with_short_repeats_is_not_a_loop():
    texts = ["Ha ha ha ha ha ha ha! That is funny. " * 1,
             "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n| 5 | 6 |\n",
             "First, wash the rice. Then, cook the rice for ten minutes. Serve the rice warm.",
             "- milk\n- eggs\n- bread\n- butter\n- jam\n"]
    for text in texts:
        assert not feed(LoopGuard(3), text), text


def test_two_repeats_are_allowed_when_three_make_a_loop():
    guard = LoopGuard(3)
    assert not feed(guard, LOOP * 2)
    assert feed(guard, LOOP * 3)


async def test_loop_guard_runs_in_the_stream_not_after_it(tmp_path):
    # The stream never ends by itself: only the guard can stop it.
    class Endless(ScriptedModel):
        async def generate(self, prompt, params=None, request_id=None, **kw):
            sent = ""
            try:
                while True:
                    sent += LOOP
                    yield type(self).output(LOOP, sent)
                    await asyncio.sleep(0)
            except GeneratorExit:
                self.aborted.append(request_id)
                raise

        @staticmethod
        def output(delta, text):
            from openclaw.agent.model import ModelOutput
            return ModelOutput(delta, text, 10, len(text))

    model = Endless(lambda m: "")
    daemon, conn = await started(tmp_path, model)
    assert await say(daemon, conn, "hello") == LOOP.strip()
    await daemon.stop()
    assert model.aborted
