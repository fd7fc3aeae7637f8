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

The cases, their scoring and the daemon set-up live in openclaw/prompts/ (evalset.py, eval_run.py),
shared with `openclaw prompts eval`, which compares two prompt versions on them.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openclaw.config import load_config  # noqa: E402
from openclaw.prompts.eval_run import PromptPair, run_cases  # noqa: E402
from openclaw.prompts.evalset import Ratio, Result, cases, measure  # noqa: E402


def config_text(data_dir: str, args: argparse.Namespace) -> str:
    model = f'model = "{args.model}"\n' if args.model else ""
    return (f'data_dir = "{data_dir}"\n'
            f"[engine]\n{model}kv_cache_gib = 0.5\n"
            f"[agent]\ntemperature = {args.temperature}\n"
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
        model = await LocalBackend.load(cfg.engine)
        todo = [c for c in cases(args.quick) if c.kind == "none" or not args.no_tool_only]

        def shown(r: Result, reply: str) -> None:
            print(f"[{r.case.kind}/{r.case.expected}] {r.case.prompt!r} -> "
                  f"{[c[0] for c in r.calls]} {r.errors} {r.tokens} tokens {r.text[:100]!r}"
                  f" / reply: {reply[-80:]!r}", flush=True)

        try:
            return await run_cases(cfg, model, PromptPair("config", cfg.agent.system_prompt, None),
                                   todo, max_tokens=args.max_tokens,
                                   shown=shown if args.show else None)
        finally:
            await model.close()


def report(results: list[Result], schemas: dict, max_tokens: int) -> list[tuple[str, str]]:
    m = measure(results, schemas)
    explicit = [r for r in results if r.case.kind == "explicit"]
    natural = [r for r in results if r.case.kind == "natural"]

    def right(rs: list[Result]) -> Ratio:
        return Ratio(sum(bool(r.calls) and r.calls[0][0] == r.case.expected for r in rs), len(rs))

    return [
        ("tool-call rate (tool prompts)", str(m.any_call)),
        ("right-tool rate (tool prompts)", str(m.right_tool)),
        ("right-tool rate, explicit prompts", str(right(explicit))),
        ("right-tool rate, natural prompts", str(right(natural))),
        ("argument validity (calls made)", str(m.valid_arguments)),
        ("malformed call attempts (all prompts)", str(m.malformed)),
        ("false-call rate (no-tool prompts)", str(m.false_calls)),
        ("mean seconds per prompt", f"{m.mean_seconds:.1f}"),
        ("mean completion tokens", f"{m.mean_reply_tokens:.0f}"),
        ("replies at the token cap", str(sum(r.tokens >= max_tokens for r in results))),
    ]


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
