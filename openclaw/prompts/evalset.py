"""The agent evaluation set: prompts that need a tool (each naming the skill that fits) and prompts
that need none, the admin's own cases from a file, and how one model step is scored. Used by
`openclaw prompts eval` and bench/agent_eval.py."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.tool_parser import StreamingToolParser
from skills.registry import check_arguments

SKILLS = ("shell", "files", "clock", "reminders")
NO_TOOL_EXPECTED = "none"  # a case's `expect` when no tool should be called

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
    kind: str  # "explicit" | "natural" | "own" (the admin's, from a file) | "none"


@dataclass
class Result:
    case: Case
    text: str  # the model's first step, as generated
    calls: list = field(default_factory=list)  # (name, arguments) as parsed
    errors: list = field(default_factory=list)  # malformed calls
    seconds: float = 0.0
    tokens: int = 0  # completion tokens
    answered: bool = True  # False: no model step (the turn was refused or failed before it)


def cases(quick: int | None = None) -> list[Case]:
    """The built-in set: 50 tool prompts, then 50 no-tool prompts. `quick` N: N tool prompts (the
    first explicit ones, a fifth of them natural ones) and N no-tool ones spread over their list."""
    tool = [Case(p, s, "explicit") for p, s in EXPLICIT] + [Case(p, s, "natural") for p, s in NATURAL]
    none = [Case(p, None, "none") for p in NO_TOOL]
    if quick:
        step = max(1, len(tool) // quick)
        explicit_first = [c for c in tool if c.kind == "explicit"][: quick - quick // 5]
        natural = [c for c in tool if c.kind == "natural"][: quick // 5]
        tool = explicit_first + natural
        none = none[::step][:quick]
    return tool + none


class CaseFileError(ValueError):
    """A cases file the admin must fix; the message names the file and the line or entry."""


def load_cases(path: Path) -> list[Case]:
    """The admin's cases: JSONL (one `{"prompt": ..., "expect": ...}` a line; blank lines and
    lines starting with # skipped) or TOML (`[[cases]]` tables with prompt and expect). `expect`
    is one of SKILLS or "none". CaseFileError naming the line (JSONL) or entry (TOML)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseFileError(f"{path}: cannot read it: {exc}") from None
    if path.suffix == ".toml":
        try:
            entries = tomllib.loads(text).get("cases")
        except tomllib.TOMLDecodeError as exc:
            raise CaseFileError(f"{path}: not valid TOML: {exc}") from None
        if not isinstance(entries, list) or not entries:
            raise CaseFileError(f'{path}: no [[cases]] tables (each with prompt and expect)')
        return [_case(entry, f"{path}: [[cases]] number {n}") for n, entry in enumerate(entries, 1)]
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{n}"
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise CaseFileError(f"{where}: not a JSON object: {exc}") from None
        found.append(_case(entry, where))
    if not found:
        raise CaseFileError(f"{path}: no cases (one JSON object a line: prompt and expect)")
    return found


def _case(entry: Any, where: str) -> Case:
    if not isinstance(entry, dict):
        raise CaseFileError(f"{where}: expected an object with prompt and expect")
    unknown = sorted(set(entry) - {"prompt", "expect"})
    prompt, expect = entry.get("prompt"), entry.get("expect")
    if unknown:
        raise CaseFileError(f"{where}: unknown key {', '.join(unknown)} (only prompt and expect)")
    if not isinstance(prompt, str) or not prompt.strip():
        raise CaseFileError(f"{where}: prompt must be a non-empty text")
    if expect not in (*SKILLS, NO_TOOL_EXPECTED):
        raise CaseFileError(f"{where}: expect is {expect!r}; it must be one of "
                            f"{', '.join(SKILLS)} or {NO_TOOL_EXPECTED!r}")
    if expect == NO_TOOL_EXPECTED:
        return Case(prompt, None, "none")
    return Case(prompt, expect, "own")


def score(case: Case, text: str | None, tokens: int, seconds: float = 0.0) -> Result:
    """The calls and malformed calls in the model's first step (`text` None: there was none)."""
    parser = StreamingToolParser()
    parser.feed(text or "")
    parsed = parser.finish()
    return Result(case, text or "", [(c.name, c.arguments) for c in parsed.tool_calls],
                  parsed.errors, seconds, tokens, answered=text is not None)


@dataclass(frozen=True)
class Ratio:
    part: int
    whole: int

    @property
    def value(self) -> float | None:
        return self.part / self.whole if self.whole else None

    def __str__(self) -> str:
        return f"{100 * self.part / self.whole:.0f}% ({self.part}/{self.whole})" if self.whole else "-"


@dataclass(frozen=True)
class Measures:
    """What a run over the set shows (rates as Ratio, so the counts stay visible)."""

    right_tool: Ratio  # the first call names the expected skill, on the tool prompts
    any_call: Ratio  # a call at all, on the tool prompts
    false_calls: Ratio  # a call or a malformed attempt, on the no-tool prompts
    valid_arguments: Ratio  # of the calls made: parse and pass the skill's schema
    malformed: int  # malformed call attempts, all prompts
    unanswered: int  # prompts the model never saw: the turn was refused or failed before it
    mean_reply_tokens: float
    mean_seconds: float


def measure(results: list[Result], schemas: dict[str, dict]) -> Measures:
    tool = [r for r in results if r.case.expected is not None]
    none = [r for r in results if r.case.expected is None]
    calls = [c for r in results for c in r.calls]
    valid = [c for c in calls if c[0] in schemas and not check_arguments(schemas[c[0]], c[1])]
    count = max(len(results), 1)
    return Measures(
        right_tool=Ratio(sum(bool(r.calls) and r.calls[0][0] == r.case.expected for r in tool),
                         len(tool)),
        any_call=Ratio(sum(bool(r.calls) for r in tool), len(tool)),
        false_calls=Ratio(sum(bool(r.calls or r.errors) for r in none), len(none)),
        valid_arguments=Ratio(len(valid), len(calls)),
        malformed=sum(len(r.errors) for r in results),
        unanswered=sum(not r.answered for r in results),
        mean_reply_tokens=sum(r.tokens for r in results) / count,
        mean_seconds=sum(r.seconds for r in results) / count)
