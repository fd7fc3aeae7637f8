"""`openclaw prompts eval VERSION`: a prompt version measured offline before any user sees it. The
version and the active one (else the config's system prompt / the engine's built-in tool
instructions) each answer the agent evaluation set (openclaw/prompts/evalset.py, plus the admin's
own cases) on the configured model in this process, and the measures are printed side by side
with their difference. See docs/prompts-eval.md."""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from engine.chat import split_tool_instructions
from openclaw.cli.common import with_store
from openclaw.config import Config, load_config
from openclaw.prompts.eval_run import DEFAULT_MAX_TOKENS, PromptPair, evaluate
from openclaw.prompts.evalset import Case, CaseFileError, Measures, Ratio, Result, cases, load_cases
from openclaw.prompts.labels import BUILTIN, CONFIG, make_label

SYSTEM, TOOLS = "system", "tools"


def add_parser(prompts) -> None:
    """Register `eval` under `openclaw prompts` (`prompts`: its subparsers)."""
    p = prompts.add_parser("eval", help="measure VERSION against the active version on the agent "
                                        "evaluation set (tool-call accuracy, false calls, reply "
                                        "length)")
    p.add_argument("version", metavar="VERSION",
                   help='"NAME:VERSION" or "VERSION" (of "system"): v4, system:v4, tools:v2')
    p.add_argument("--against", metavar="VERSION",
                   help="compare with this version of the same prompt, not the active one "
                        f"({CONFIG!r}: the config's system prompt, {BUILTIN!r}: the built-in "
                        "tool instructions)")
    p.add_argument("--file", type=Path, metavar="PATH",
                   help="the text to measure from PATH, not from the library (a version not "
                        "imported yet; VERSION only names it)")
    p.add_argument("--cases", type=Path, action="append", default=[], metavar="FILE",
                   help="the admin's own cases, JSONL or TOML ({prompt, expect: a skill or "
                        '"none"}), added to the set; repeatable')
    p.add_argument("--only-cases", action="store_true",
                   help="run only the --cases, not the built-in set")
    p.add_argument("--quick", type=int, default=None, metavar="N",
                   help="N tool prompts and N no-tool prompts of the built-in set, not 50 and 50")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="each reply's cap (the first model step is what is scored)")
    p.add_argument("--show", action="store_true", help="print each prompt's outcome")
    p.set_defaults(func=cmd_prompts_eval)


@dataclass(frozen=True)
class Library:
    """What the store holds that the evaluation reads: every version's text, the active ones."""

    texts: dict[tuple[str, str], str]  # (name, version) -> text
    active: dict[str, str]  # name -> its active version


async def read_library(store) -> Library:
    """The library from the store (openclaw/store/prompts.py)."""
    versions = await store.prompt_versions()
    settings = await store.prompt_settings()
    return Library({(v.name, v.version): v.text for v in versions},
                   {name: s.active for name, s in settings.items() if s.active})


def parse_target(text: str) -> tuple[str, str]:
    """("system", "v4") from "v4" or "system:v4"; ValueError for another name or an empty part."""
    name, _, version = text.rpartition(":")
    name = name or SYSTEM
    if name not in (SYSTEM, TOOLS):
        raise ValueError(f'{text!r}: the prompt is "system" or "tools", not {name!r}')
    if not version:
        raise ValueError(f"{text!r}: no version after the colon")
    return name, version


def prompt_pairs(config: Config, library: Library, target: str, candidate_text: str | None,
                 against: str | None) -> tuple[PromptPair, PromptPair]:
    """(candidate, baseline): the target's version against `against` or the active one (else the
    fallback); the other prompt the same in both, its active version or the fallback.
    `candidate_text`: the target's text, given (--file) rather than read from the library."""
    name, version = parse_target(target)
    fallback = {SYSTEM: (CONFIG, config.agent.system_prompt), TOOLS: (BUILTIN, None)}

    def text_of(prompt: str, ver: str | None) -> tuple[str, str | None]:
        if ver is None or ver == fallback[prompt][0]:
            return fallback[prompt]
        if (prompt, ver) not in library.texts:
            stored = sorted(v for n, v in library.texts if n == prompt)
            raise ValueError(f"{prompt} has no version {ver} in the library (stored: "
                             f"{', '.join(stored) or 'none'}; `openclaw prompts import DIR` "
                             "stores them)")
        return ver, library.texts[(prompt, ver)]

    if candidate_text is None:
        candidate = text_of(name, version)
    else:
        candidate = (version, candidate_text)
    if name == TOOLS and candidate[1] is not None:
        split_tool_instructions(candidate[1])  # a template without {tools}: refused now
    baseline = text_of(name, against or library.active.get(name))
    other = TOOLS if name == SYSTEM else SYSTEM
    fixed = text_of(other, library.active.get(other))

    def pair(chosen: tuple[str, str | None]) -> PromptPair:
        texts = {name: chosen, other: fixed}
        label = make_label({n: v for n, (v, _) in texts.items()})
        return PromptPair(label, texts[SYSTEM][1], texts[TOOLS][1])

    return pair(candidate), pair(baseline)


def eval_cases(args: argparse.Namespace) -> list[Case]:
    own = [case for path in args.cases for case in load_cases(path)]
    if args.only_cases and not own:
        raise CaseFileError("--only-cases needs --cases FILE")
    return own if args.only_cases else cases(args.quick) + own


def cmd_prompts_eval(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, tokens=False)
        for option, value in (("--quick", args.quick), ("--max-tokens", args.max_tokens)):
            if value is not None and value < 1:
                raise ValueError(f"{option} needs a number of 1 or more, not {value}")
        todo = eval_cases(args)
        candidate_text = None
        if args.file is not None:
            try:
                candidate_text = args.file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"{args.file}: cannot read it: {exc}") from None
        library = with_store(args, read_library, none_yet=Library({}, {}))
        candidate, baseline = prompt_pairs(config, library, args.version, candidate_text,
                                           args.against)
    except ValueError as exc:  # CaseFileError is one
        print(f"openclaw prompts eval: {exc}", file=sys.stderr)
        return 1
    print(f"measuring {candidate.label} against {baseline.label}: {len(todo)} prompts each, "
          f"one model step, replies capped at {args.max_tokens} tokens", flush=True)
    measured = asyncio.run(run(config, [candidate, baseline], todo, args.max_tokens, args.show))
    print(comparison([candidate.label, baseline.label], measured))
    if any(m.unanswered for m in measured):
        print("some prompts never reached the model (a prompt over the context, a failed turn): "
              "run again with --show to see the replies", file=sys.stderr)
    return 0


async def run(config: Config, pairs: list[PromptPair], todo: list[Case], max_tokens: int,
              show: bool) -> list[Measures]:
    from openclaw.backends import open_backend  # here: the local engine imports torch

    model = await open_backend(config.engine)
    try:
        return await evaluate(config, model, pairs, todo, max_tokens=max_tokens,
                              shown=shown if show else None)
    finally:
        await model.close()


def shown(result: Result, reply: str) -> None:
    print(f"  [{result.case.kind}/{result.case.expected or 'none'}] {result.case.prompt!r} -> "
          f"calls {[c[0] for c in result.calls]}, {result.tokens} tokens, reply {reply[:80]!r}",
          flush=True)


ROWS = (  # (row, Measures field)
    ("right tool (tool prompts)", "right_tool"),
    ("any call (tool prompts)", "any_call"),
    ("false calls (no-tool prompts)", "false_calls"),
    ("argument validity (calls made)", "valid_arguments"),
    ("malformed call attempts", "malformed"),
    ("prompts the model never saw", "unanswered"),
    ("mean reply tokens", "mean_reply_tokens"),
    ("mean seconds per prompt", "mean_seconds"),
)


def comparison(labels: list[str], measured: list[Measures]) -> str:
    """The measures side by side, the first against the second, with their difference."""
    head = ["measure", *labels, "difference"]
    rows = [head]
    for title, key in ROWS:
        values = [getattr(m, key) for m in measured]
        rows.append([title, *(_cell(v) for v in values), _difference(values[0], values[1])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def _cell(value: Ratio | int | float) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def _difference(a: Ratio | int | float, b: Ratio | int | float) -> str:
    if isinstance(a, Ratio) and isinstance(b, Ratio):
        if a.value is None or b.value is None:
            return "-"
        return f"{100 * (a.value - b.value):+.0f} pts"
    return f"{a - b:+.1f}" if isinstance(a, float) else f"{a - b:+d}"
