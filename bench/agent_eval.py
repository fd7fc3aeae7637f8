"""Does the agent call a tool when asked to, and only then? 100 prompts through the real daemon.

50 prompts need a tool (each names the one that fits: shell, files, clock, reminders; most say
so explicitly, "Run the command ls -la in the shell", a few only naturally, "What time is it?")
and 50 need none (chit-chat, facts, writing). Each goes to the daemon as the owner's message in
a fresh conversation (/new before it), with the skills enabled and the executor, sandbox and
tool list the daemon builds, on the engine in this process (the embedded SmolLM2-135M-Instruct
unless --model). Only the first model step is scored (`[agent] max_steps = 1`): what the model
does with the user's words.

    .venv/bin/python bench/agent_eval.py [--quick N] [--model PATH] [--max-tokens 96]
        [--temperature 0] [--show]

Reported, on the tool prompts: tool-call rate (any call), right-tool rate (the first call names
the expected skill; explicit and natural prompts apart), argument validity (of the calls made:
the arguments parse and pass the skill's schema, skills.registry.check_arguments); on the
no-tool prompts: the false-call rate (any call, or a malformed attempt at one). `--quick N`
takes N tool prompts (the first explicit ones, and a fifth natural ones) and N no-tool prompts
spread over their list. `--no-tool-only --max-tokens 512` shows how replies end: at the cap, or
cut by the loop guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.tool_parser import StreamingToolParser  # noqa: E402
from openclaw.config import load_config  # noqa: E402
from openclaw.daemon import Daemon  # noqa: E402
from openclaw.gateway.contract import InboundMessage  # noqa: E402
from skills.registry import check_arguments  # noqa: E402
from tests.helpers.daemon import RecordingConnector  # noqa: E402

SKILLS = ("shell", "files", "clock", "reminders")

# (prompt, the skill that fits). Explicit: the prompt names the tool or the exact action.
EXPLICIT = [
    ("Run the command ls -la in the shell", "shell"),
    ("Call the files tool with action list and path .", "files"),
    ("Use the clock tool to tell me the current time.", "clock"),
    ("Use the reminders tool to list my reminders.", "reminders"),
    ("Run `pwd` in the shell.", "shell"),
    ("Use the shell to run: echo hello", "shell"),
    ("Call the shell tool with the command date", "shell"),
    ("Run uname -a in the shell and show me the output.", "shell"),
    ("Execute the shell command df -h", "shell"),
    ("Use the shell tool to count the lines of notes.txt with wc -l notes.txt", "shell"),
    ("Run 'cat /etc/os-release' using the shell tool.", "shell"),
    ("Please run the shell command whoami", "shell"),
    ("Shell: run ls", "shell"),
    ("Use the shell to list the files in the current folder.", "shell"),
    ("Run python3 --version in the shell", "shell"),
    ("Call the files tool to read notes.txt", "files"),
    ("Use the files tool to write 'buy milk' to todo.txt", "files"),
    ("Use the files tool to list the workspace folder.", "files"),
    ("Call files with action read and path README.md", "files"),
    ("With the files tool, append 'call mom' to todo.txt", "files"),
    ("Use the files tool to search for TODO in the workspace.", "files"),
    ("Read the file notes.md with the files tool.", "files"),
    ("Call the files tool: action list, path docs", "files"),
    ("Create the file hello.txt containing 'hi' using the files tool.", "files"),
    ("Use the files tool to list the folder .", "files"),
    ("Call the clock tool.", "clock"),
    ("Use the clock tool to get the time in Europe/Paris.", "clock"),
    ("Call the clock tool with timezone Asia/Tokyo", "clock"),
    ("Check the clock tool for today's date.", "clock"),
    ("Use the clock skill: what day of the week is it?", "clock"),
    ("Call the clock tool to get the time in America/New_York.", "clock"),
    ("Use the reminders tool to remind me to drink water in 20 minutes.", "reminders"),
    ("Call the reminders tool with action add, text 'stand up', when 'in 1 hour'", "reminders"),
    ("Use the reminders tool to cancel reminder number 2.", "reminders"),
    ("Add a reminder with the reminders tool: call the dentist tomorrow 9:00", "reminders"),
    ("Call the reminders tool with action list", "reminders"),
    ("Use the reminders tool: remind me every day at 8:00 to take my pills.", "reminders"),
    ("Set a reminder with the reminders tool for 5pm: go for a run.", "reminders"),
    ("Run the command 'ls /workspace' with the shell tool.", "shell"),
    ("Use the files tool to read todo.txt", "files"),
]
NATURAL = [
    ("What time is it?", "clock"),
    ("What's today's date?", "clock"),
    ("What time is it in Tokyo right now?", "clock"),
    ("Remind me to call Anna in 10 minutes.", "reminders"),
    ("Which reminders do I have?", "reminders"),
    ("Show me the files in my workspace.", "files"),
    ("What is in my notes.txt file?", "files"),
    ("Save 'meeting at 3pm' in a file called meeting.txt", "files"),
    ("How much disk space is free? Check with df.", "shell"),
    ("What's my username on this machine? Run whoami.", "shell"),
]
NO_TOOL = [
    "Hi! How are you today?",
    "Thanks, that was helpful.",
    "Good morning!",
    "Tell me a joke.",
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What is 12 times 7?",
    "How many days are in a leap year?",
    "What is the boiling point of water in Celsius?",
    "Explain photosynthesis in one sentence.",
    "Write a haiku about the sea.",
    "Write a short poem about autumn.",
    "Give me three tips for better sleep.",
    "Translate 'good night' into French.",
    "What is the largest planet in the solar system?",
    "Summarize the plot of Cinderella in two sentences.",
    "Suggest a name for a black cat.",
    "What does HTML stand for?",
    "Write a friendly birthday message for my sister.",
    "What is the difference between weather and climate?",
    "Who painted the Mona Lisa?",
    "How do I boil an egg?",
    "What is a synonym for happy?",
    "Write one sentence about dogs.",
    "What color is the sky on a clear day?",
    "Can you recommend a good book?",
    "What is the square root of 81?",
    "Name three fruits that are red.",
    "What language is spoken in Brazil?",
    "Describe a sunset in a few words.",
    "What is gravity?",
    "Tell me a fun fact about octopuses.",
    "How are you different from a search engine?",
    "Write a two-line rhyme about coffee.",
    "What is the opposite of cold?",
    "Why do leaves change color in the fall?",
    "Give me a motivational quote.",
    "What is the chemical symbol for gold?",
    "How many continents are there?",
    "What's a good way to learn a new language?",
    "Write a short thank-you note to a teacher.",
    "What is the speed of light?",
    "Tell me something nice.",
    "Which animal is known as the king of the jungle?",
    "Compose a limerick about a cat.",
    "What do bees make?",
    "Explain what a noun is.",
    "What is the main ingredient of guacamole?",
    "Goodbye, talk to you later!",
    "What is your name?",
]
assert len(EXPLICIT) + len(NATURAL) == 50 and len(NO_TOOL) == 50


@dataclass
class Case:
    prompt: str
    expected: str | None  # the skill that fits, None where no tool should be called
    kind: str  # "explicit" | "natural" | "none"


@dataclass
class Result:
    case: Case
    text: str
    calls: list = field(default_factory=list)  # (name, arguments) as parsed
    errors: list = field(default_factory=list)  # malformed calls
    seconds: float = 0.0
    tokens: int = 0


def cases(quick: int | None) -> list[Case]:
    tool = [Case(p, s, "explicit") for p, s in EXPLICIT] + [Case(p, s, "natural") for p, s in NATURAL]
    none = [Case(p, None, "none") for p in NO_TOOL]
    if quick:  # a subset with both kinds of tool prompts: every fifth one is natural
        step = max(1, len(tool) // quick)
        explicit_first = [c for c in tool if c.kind == "explicit"][: quick - quick // 5]
        natural = [c for c in tool if c.kind == "natural"][: quick // 5]
        tool = explicit_first + natural
        none = none[::step][:quick]
    return tool + none


class RecordingModel:
    """The daemon's model, with each call's final text kept for scoring."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.max_model_len = inner.max_model_len
        self.outputs: list = []

    async def generate(self, prompt, params=None, request_id=None, *, tools=None, priority=0,
                       cache_salt=None):
        last = None
        try:
            async with aclosing(self.inner.generate(prompt, params, request_id, tools=tools,
                                                    priority=priority, cache_salt=cache_salt)) as s:
                async for last in s:
                    yield last
        finally:  # also when the agent stops reading (the loop guard ends a reply)
            self.outputs.append(last)

    async def abort(self, request_id):
        await self.inner.abort(request_id)

    async def count_chat(self, messages, tools=None):
        return await self.inner.count_chat(messages, tools)

    def stats(self):
        return self.inner.stats()

    async def close(self):
        await self.inner.close()


def config_text(data_dir: str, args: argparse.Namespace) -> str:
    model = f'model = "{args.model}"\n' if args.model else ""
    return (f'data_dir = "{data_dir}"\n[admin]\nenabled = false\n'
            f"[engine]\n{model}kv_cache_gib = 0.5\n"
            f"[skills]\nenabled = {json.dumps(list(SKILLS))}\n"
            f"[agent]\nmax_steps = 1\nreply_max_tokens = {args.max_tokens}\n"
            f"temperature = {args.temperature}\n"
            + (f"tool_call_threshold = {args.threshold}\n" if args.threshold is not None else "")
            + (f"loop_repeats = {args.loop_repeats}\n" if args.loop_repeats is not None else "")
            + (f"[agent.sampling.chat]\nrepetition_penalty = {args.repetition_penalty}\n"
               if args.repetition_penalty is not None else ""))


async def run(args: argparse.Namespace) -> tuple[list[Result], dict]:
    from engine import EngineConfig
    from openclaw.backends.local import LocalBackend

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.toml"
        path.write_text(config_text(tmp, args))
        cfg = load_config(path)
        assert isinstance(cfg.engine, EngineConfig), "the benchmark runs the engine in process"
        model = RecordingModel(await LocalBackend.load(cfg.engine))
        conn = RecordingConnector()
        daemon = Daemon(cfg, model=model, connectors=[conn])
        await daemon.start()
        schemas = {s["function"]["name"]: s["function"]["parameters"]
                   for s in daemon.gateway.agent.executor.registry.tool_specs()}
        results = []
        todo = [c for c in cases(args.quick) if c.kind == "none" or not args.no_tool_only]
        for n, case in enumerate(todo):
            for text in ("/new", case.prompt):
                before = len(model.outputs)
                start = time.perf_counter()
                await conn.handler(InboundMessage("terminal", "local", "local", f"m{n}-{text[:4]}",
                                                  text))
                await daemon.gateway.wait_idle()
            out = model.outputs[before] if len(model.outputs) > before else None
            results.append(score(case, out, time.perf_counter() - start))
            if args.show:
                r = results[-1]
                print(f"[{case.kind}/{case.expected}] {case.prompt!r} -> "
                      f"{[c[0] for c in r.calls]} {r.errors} {r.tokens} tokens {r.text[:100]!r}"
                      f" / reply: {conn.sent[-1][1][-80:]!r}", flush=True)
        await daemon.stop()
        await model.close()
        return results, schemas


def score(case: Case, out, seconds: float) -> Result:
    text = out.text if out is not None else ""
    parser = StreamingToolParser()
    parser.feed(text)
    parsed = parser.finish()
    return Result(case, text, [(c.name, c.arguments) for c in parsed.tool_calls], parsed.errors,
                  seconds, out.completion_tokens if out is not None else 0)


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}% ({part}/{whole})" if whole else "-"


def report(results: list[Result], schemas: dict, max_tokens: int) -> list[tuple[str, str]]:
    explicit = [r for r in results if r.case.kind == "explicit"]
    natural = [r for r in results if r.case.kind == "natural"]
    tool = explicit + natural
    none = [r for r in results if r.case.kind == "none"]
    called = [r for r in tool if r.calls]
    right = [r for r in tool if r.calls and r.calls[0][0] == r.case.expected]
    calls = [c for r in results for c in r.calls]
    valid = [c for c in calls if c[0] in schemas and not check_arguments(schemas[c[0]], c[1])]
    malformed = sum(len(r.errors) for r in results)
    rows = [
        ("tool-call rate (tool prompts)", pct(len(called), len(tool))),
        ("right-tool rate (tool prompts)", pct(len(right), len(tool))),
        ("right-tool rate, explicit prompts",
         pct(sum(r in right for r in explicit), len(explicit))),
        ("right-tool rate, natural prompts", pct(sum(r in right for r in natural), len(natural))),
        ("argument validity (calls made)", pct(len(valid), len(calls))),
        ("malformed call attempts (all prompts)", str(malformed)),
        ("false-call rate (no-tool prompts)",
         pct(sum(bool(r.calls or r.errors) for r in none), len(none))),
        ("mean seconds per prompt", f"{sum(r.seconds for r in results) / len(results):.1f}"),
        ("mean completion tokens", f"{sum(r.tokens for r in results) / len(results):.0f}"),
        ("replies at the token cap", str(sum(r.tokens >= max_tokens for r in results))),
    ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", type=int, default=None, metavar="N",
                        help="N tool prompts and N no-tool prompts, not 50 and 50")
    parser.add_argument("--model", default=None, help="[engine] model; default: the embedded one")
    parser.add_argument("--max-tokens", type=int, default=96, help="[agent] reply_max_tokens")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--threshold", type=float, default=None,
                        help="[agent] tool_call_threshold (0: off); default: the config's")
    parser.add_argument("--repetition-penalty", type=float, default=None,
                        help="[agent.sampling.chat] repetition_penalty; default: the config's")
    parser.add_argument("--loop-repeats", type=int, default=None,
                        help="[agent] loop_repeats (0: off); default: the config's")
    parser.add_argument("--no-tool-only", action="store_true",
                        help="only the no-tool prompts (with --max-tokens 512: how replies end)")
    parser.add_argument("--no-examples", action="store_true",
                        help="the tool prompt without its worked examples (to measure them)")
    parser.add_argument("--show", action="store_true", help="print each prompt's outcome")
    args = parser.parse_args()
    if args.no_examples:
        import engine.chat

        engine.chat.example_parts = lambda tools: []
    started = time.perf_counter()
    results, schemas = asyncio.run(run(args))
    print(f"\nmachine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}; model: {args.model or 'embedded SmolLM2-135M-Instruct'}; "
          f"temperature {args.temperature}, max tokens {args.max_tokens}, threshold "
          f"{args.threshold}, repetition penalty {args.repetition_penalty}, examples "
          f"{not args.no_examples}, loop repeats {args.loop_repeats}; "
          f"{len(results)} prompts in {time.perf_counter() - started:.0f} s\n")
    print("| measure | value |")
    print("|---|---|")
    for name, value in report(results, schemas, args.max_tokens):
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
