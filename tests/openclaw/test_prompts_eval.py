"""`openclaw prompts eval`: the evaluation set (built in, and the admin's own cases from a file), a
prompt pair run over it through the real daemon, and the CLI comparing a stored version with the
active one. The model is scripted (its reply follows the system prompt it is shown) or a tiny
random one (the whole path through the engine, in seconds)."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from engine.chat import BUILTIN_TOOL_INSTRUCTIONS
from openclaw.cli import prompts_eval
from openclaw.config import load_config
from openclaw.prompts.eval_run import PromptPair, evaluate
from openclaw.prompts.evalset import NATURAL, NO_TOOL, CaseFileError, cases, load_cases
from openclaw.store import Store
from tests.helpers.scripted_model import ScriptedModel

CALLS_CLOCK = "Always call the clock."
CLOCK_CALL = '<tool_call>{"name": "clock", "arguments": {}}</tool_call>'
TOOLS_V2 = "Functions:\n{tools}\nUse one when asked."


def follows_the_system_prompt(prompt: list[dict]) -> str:
    return CLOCK_CALL if CALLS_CLOCK in prompt[0]["content"] else "Hello there."


def config(tmp_path, extra: str = ""):
    path = tmp_path / "openclaw.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n[agent]\nsystem_prompt = "Be kind."\n'
                    + extra)
    return load_config(path)


# ---- the set ----------------------------------------------------------------------------------


def test_quick_takes_both_kinds_of_tool_prompts_and_no_tool_ones():
    assert len(cases()) == 100
    quick = cases(5)
    assert [c.kind for c in quick] == ["explicit"] * 4 + ["natural"] + ["none"] * 5
    assert quick[4].prompt == NATURAL[0][0] and quick[5].prompt == NO_TOOL[0]


def test_the_admins_cases_load_from_jsonl_and_toml(tmp_path):
    jsonl = tmp_path / "mine.jsonl"
    jsonl.write_text('# my cases\n{"prompt": "What time is it in Lima?", "expect": "clock"}\n\n'
                     '{"prompt": "Say hi.", "expect": "none"}\n')
    toml = tmp_path / "mine.toml"
    toml.write_text('[[cases]]\nprompt = "List my reminders."\nexpect = "reminders"\n')
    assert [(c.prompt, c.expected, c.kind) for c in load_cases(jsonl)] == [
        ("What time is it in Lima?", "clock", "own"), ("Say hi.", None, "none")]
    assert [(c.expected, c.kind) for c in load_cases(toml)] == [("reminders", "own")]


@pytest.mark.parametrize("lines, says", [
    (['{"prompt": "a", "expect": "clock"}', '{"prompt": "b", "expect": clock}'],
     ":2: not a JSON object"),
    (['{"prompt": "a", "expect": "weather"}'], ":1: expect is 'weather'; it must be one of"),
    (['{"prompt": "", "expect": "none"}'], ":1: prompt must be a non-empty text"),
    (['{"prompt": "a", "expect": "none", "why": "x"}'], ":1: unknown key why"),
    (['["a", "none"]'], ":1: expected an object with prompt and expect"),
])
def test_a_malformed_case_is_an_error_naming_its_line(tmp_path, lines, says):
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CaseFileError) as err:
        load_cases(path)
    assert str(err.value).startswith(str(path)) and says in str(err.value)


def test_a_malformed_toml_case_names_its_entry(tmp_path):
    path = tmp_path / "cases.toml"
    path.write_text('[[cases]]\nprompt = "a"\nexpect = "none"\n[[cases]]\nprompt = "b"\n')
    with pytest.raises(CaseFileError, match=r"\[\[cases\]\] number 2: expect is None"):
        load_cases(path)


# ---- a pair run through the daemon --------------------------------------------------------------


async def test_each_pair_answers_the_same_cases_with_its_own_prompts(tmp_path):
    model = ScriptedModel(follows_the_system_prompt)
    todo = cases(5)
    calls, plain = await evaluate(config(tmp_path), model, [
        PromptPair("system=calls", CALLS_CLOCK, TOOLS_V2),
        PromptPair("system=config", "Be kind.", None)], todo)
    # The pair that calls the clock everywhere: right on the clock prompts only, false on all
    # no-tool ones; the plain one never calls.
    clock_prompts = sum(c.expected == "clock" for c in todo)
    assert (calls.right_tool.part, calls.right_tool.whole) == (clock_prompts, 5)
    assert (calls.false_calls.part, calls.false_calls.whole) == (5, 5)
    assert (calls.valid_arguments.part, calls.valid_arguments.whole) == (10, 10)
    assert (plain.right_tool.part, plain.false_calls.part, plain.valid_arguments.whole) == (0, 0, 0)
    assert plain.mean_reply_tokens == len("Hello there.")  # the scripted model: a token a char
    # Every model call of the first run had its tool instructions, none of the second.
    shown = model.tool_instructions
    assert shown[:10] == [TOOLS_V2] * 10 and shown[10:] == [None] * 10


# ---- the command ------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    """`openclaw prompts ...` as the prompts group registers eval (openclaw/cli/prompts.py)."""
    parser = argparse.ArgumentParser(prog="openclaw prompts")
    parser.add_argument("--config")
    prompts_eval.add_parser(parser.add_subparsers(dest="prompts_cmd", required=True))
    return parser.parse_args(argv)


def stored(cfg, *entries, active: dict[str, str] | None = None) -> None:
    async def put():
        store = await Store.open(cfg.store.url)
        try:
            await store.add_prompt_versions(list(entries), "tester")
            for name, version in (active or {}).items():
                await store.activate_prompt(name, version)
        finally:
            await store.close()

    asyncio.run(put())


def test_pairs_take_the_stored_version_against_the_active_one_or_the_fallback(tmp_path):
    cfg = config(tmp_path)
    library = prompts_eval.Library(
        {("system", "v1"): "One.", ("system", "v2"): "Two.", ("tools", "t1"): TOOLS_V2},
        {"system": "v1", "tools": "t1"})
    new, old = prompts_eval.prompt_pairs(cfg, library, "v2", None, None)
    assert (new.label, new.system, new.tools) == ("system=v2;tools=t1", "Two.", TOOLS_V2)
    assert (old.label, old.system, old.tools) == ("system=v1;tools=t1", "One.", TOOLS_V2)
    new, old = prompts_eval.prompt_pairs(cfg, prompts_eval.Library(library.texts, {}),
                                         "tools:t1", None, None)
    assert (new.label, new.system, new.tools) == ("system=config;tools=t1", "Be kind.", TOOLS_V2)
    assert (old.label, old.tools) == ("system=config;tools=builtin", None)
    _, old = prompts_eval.prompt_pairs(cfg, library, "v2", None, "config")
    assert (old.label, old.system) == ("system=config;tools=t1", "Be kind.")
    with pytest.raises(ValueError, match="system has no version v9 in the library "
                                         r"\(stored: v1, v2;"):
        prompts_eval.prompt_pairs(cfg, library, "system:v9", None, None)
    with pytest.raises(ValueError, match='the prompt is "system" or "tools", not \'sys\''):
        prompts_eval.prompt_pairs(cfg, library, "sys:v2", None, None)
    with pytest.raises(ValueError, match=r"tool_instructions: .*\{tools\}"):
        prompts_eval.prompt_pairs(cfg, library, "tools:t9", "No placeholder.", None)


def test_the_command_refuses_what_it_cannot_measure_and_names_it(tmp_path, capsys):
    cfg = config(tmp_path)
    stored(cfg, ("system", "v1", "One."))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "expect": "none"}\n{"prompt": "y"}\n')
    for argv, says in ((["eval", "v7"], "system has no version v7 in the library (stored: v1;"),
                       (["eval", "v1", "--cases", str(bad)], f"{bad}:2: expect is None"),
                       (["eval", "v1", "--only-cases"], "--only-cases needs --cases FILE"),
                       (["eval", "v1", "--max-tokens", "0"], "--max-tokens needs a number of 1")):
        args = parse(["--config", str(tmp_path / "openclaw.toml"), *argv])
        assert args.func(args) == 1
        assert says in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from tests.helpers.chat_model import random_chat_model

    # Positions for the four skills' tool prompt (about 1,500 tokens) and a reply.
    return str(random_chat_model(tmp_path_factory.mktemp("tiny"), positions=4096))


def test_the_command_prints_both_versions_side_by_side_with_the_difference(
        tmp_path, capsys, tiny_model):
    cfg = config(tmp_path, f'[engine]\nmodel = "{tiny_model}"\nkv_cache_gib = 0.02\n'
                           "max_model_len = 4096\n")
    stored(cfg, ("system", "v1", "You are brief."), ("system", "v2", "You are very brief."),
           active={"system": "v1"})
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"prompt": "What time is it in Lima?", "expect": "clock"}) + "\n")
    args = parse(["--config", str(tmp_path / "openclaw.toml"), "eval", "system:v2", "--quick", "1",
                  "--cases", str(own), "--max-tokens", "4"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "measuring system=v2;tools=builtin against system=v1;tools=builtin: 3 prompts" in out
    head, *rows = out.splitlines()[1:]
    assert head.split() == ["measure", "system=v2;tools=builtin", "system=v1;tools=builtin",
                            "difference"]
    right = next(r for r in rows if r.startswith("right tool (tool prompts)"))
    assert "(2)" not in right and right.count("/2)") == 2  # both tool prompts, in both runs
    assert next(r for r in rows if r.startswith("false calls")).count("/1)") == 2
    assert next(r for r in rows if r.startswith("mean reply tokens")).split()[3:5] == ["4.0", "4.0"]
    assert next(r for r in rows if r.startswith("prompts the model never saw")).split()[5:] == [
        "0", "0", "+0"]


def test_the_built_in_template_is_what_the_tools_fallback_means():
    assert "{tools}" in BUILTIN_TOOL_INSTRUCTIONS


async def test_a_prompt_the_model_never_saw_is_counted_as_such(tmp_path):
    # A context too small for the tools' prompt: every turn is refused before the model.
    model = ScriptedModel(follows_the_system_prompt, max_model_len=170)
    (measured,) = await evaluate(config(tmp_path), model,
                                 [PromptPair("system=config", "Be kind.", None)], cases(1))
    assert measured.unanswered == 2 and not model.prompts
    assert (measured.right_tool.part, measured.false_calls.part) == (0, 0)
