"""`openclaw prompts ...`: the prompt library (openclaw/prompts, docs/prompts.md). Import versions
from a folder kept under version control, list and show them, diff two, activate one, split users
between versions (A/B), pin a user to one. They change only the store, so they work while the
daemon runs: it reads the library again within a few seconds (SNAPSHOT_MAX_AGE_S), at once after
`openclaw reload`."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from openclaw.cli import prompts_eval, prompts_report
from openclaw.cli.common import with_store

NO_LIBRARY = "no prompt versions stored yet: add some with `openclaw prompts import DIR`"


def add_commands(sub, common_sub) -> None:
    prompts = common_sub(sub.add_parser(
        "prompts", help="the prompt library: versions, the active one, A/B splits, pins")
        .add_subparsers(dest="prompts_cmd", required=True))
    p = prompts.add_parser("import", help="store the versions in DIR/<name>/<version>.md (or "
                                          ".txt); a stored version never changes")
    p.add_argument("dir", type=Path)
    p.add_argument("--author", help="who wrote them (default: your login name)")
    p.set_defaults(func=cmd_import)
    prompts.add_parser("list", help="each prompt's versions, the active one, any A/B split, "
                                    "pins").set_defaults(func=cmd_list)
    p = prompts.add_parser("show", help="a version's text (default: the active one)")
    p.add_argument("name")
    p.add_argument("version", nargs="?")
    p.set_defaults(func=cmd_show)
    p = prompts.add_parser("diff", help="a unified diff of two versions")
    p.add_argument("name")
    p.add_argument("v1")
    p.add_argument("v2")
    p.set_defaults(func=cmd_diff)
    p = prompts.add_parser("activate", help="answer with VERSION of NAME (ends an A/B split)")
    p.add_argument("name")
    p.add_argument("version")
    p.set_defaults(func=cmd_activate)
    p = prompts.add_parser("ab", help="split users between versions by weight: ab system v3=50 "
                                      "v4=50; `ab NAME off` ends it")
    p.add_argument("name")
    p.add_argument("weights", nargs="+", metavar="VERSION=WEIGHT")
    p.set_defaults(func=cmd_ab)
    p = prompts.add_parser("pin", help="give USER this version of NAME, whatever else is set")
    p.add_argument("user", help='"channel:id", e.g. "telegram:1001"')
    p.add_argument("name")
    p.add_argument("version")
    p.set_defaults(func=cmd_pin)
    p = prompts.add_parser("unpin", help="USER gets NAME as everyone does again")
    p.add_argument("user")
    p.add_argument("name")
    p.set_defaults(func=cmd_unpin)
    prompts_report.add_parser(prompts)  # outcomes per variant, from the traces
    prompts_eval.add_parser(prompts)  # a version measured offline on the evaluation set


def _fail(command: str, message: object, code: int = 1) -> int:
    print(f"openclaw prompts {command}: {message}", file=sys.stderr)
    return code


def _when_read() -> str:
    from openclaw.store.prompts import SNAPSHOT_MAX_AGE_S

    return (f"a running daemon answers with it within {SNAPSHOT_MAX_AGE_S:g} seconds "
            "(at once after `openclaw reload`)")


def cmd_import(args: argparse.Namespace) -> int:
    from openclaw.prompts.library import default_author, import_prompts, read_prompt_dir

    try:
        read_prompt_dir(args.dir)  # checked before a database is made for it
        imported = with_store(args, lambda store: import_prompts(
            store, args.dir, args.author or default_author()))
    except ValueError as exc:  # a file (PromptImportError), the author
        return _fail("import", exc)
    parents = {i.stored.id: i.stored.version for i in imported}
    for item in imported:
        v = item.stored
        if item.added:
            after = parents.get(v.parent_id) if v.parent_id else None
            print(f"added      {v.name} {v.version}" + (f" (after {after})" if after else "")
                  + f"  from {item.file.path}")
        else:
            print(f"unchanged  {v.name} {v.version}")
    added = sum(i.added for i in imported)
    print(f"{added} added, {len(imported) - added} unchanged; nothing is answered with a new "
          "version until `openclaw prompts activate NAME VERSION` (or `ab`, `pin`)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from openclaw.prompts import PROMPT_NAMES

    async def read(store):
        return (await store.prompt_versions(), await store.prompt_settings(),
                await store.prompt_pins())

    versions, settings, pins = with_store(args, read, none_yet=([], {}, {}))
    names = [*PROMPT_NAMES, *sorted({v.name for v in versions} - set(PROMPT_NAMES))]
    for name in names:
        mine = [v.version for v in versions if v.name == name]
        setting = settings.get(name)
        active = setting.active if setting and setting.active else None
        fallback = ("the config's [agent] system_prompt" if name == "system"
                    else "the engine's built-in template")
        print(f"{name}")
        print(f"  versions: {', '.join(mine) if mine else 'none'}")
        print(f"  active:   {active or f'none ({fallback})'}")
        if setting and setting.variants:
            print(f"  A/B:      {_split(setting.variants)} (the active version waits until `ab {name} off`)")
        pinned = sum(1 for (_, n) in pins if n == name)
        if pinned:
            print(f"  pins:     {pinned} user{'s' if pinned != 1 else ''}")
    if not versions:
        print(NO_LIBRARY)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    async def read(store):
        return await store.prompt_versions(args.name), (await store.prompt_settings()).get(args.name)

    versions, setting = with_store(args, read, none_yet=([], None))
    version = args.version or (setting.active if setting else None)
    if version is None:
        return _fail("show", f"{args.name} has no active version; name one "
                             f"(stored: {_listed(versions)})")
    found = next((v for v in versions if v.version == version), None)
    if found is None:
        return _fail("show", f"{args.name} has no version {version} (stored: {_listed(versions)})")
    parent = next((v.version for v in versions if v.id == found.parent_id), None)
    print(f"# {found.name} {found.version}{' (active)' if setting and setting.active == version else ''}"
          f", by {found.author}, {found.created_at:%Y-%m-%d %H:%M} UTC"
          + (f", after {parent}" if parent else ""))
    print(found.text)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    versions = with_store(args, lambda store: store.prompt_versions(args.name), none_yet=[])
    texts = {v.version: v.text for v in versions}
    missing = [v for v in (args.v1, args.v2) if v not in texts]
    if missing:
        return _fail("diff", f"{args.name} has no version {', '.join(missing)} "
                             f"(stored: {_listed(versions)})")
    lines = difflib.unified_diff(texts[args.v1].splitlines(keepends=True),
                                 texts[args.v2].splitlines(keepends=True),
                                 f"{args.name}/{args.v1}", f"{args.name}/{args.v2}")
    for line in lines:
        sys.stdout.write(line if line.endswith("\n") else line + "\n")
    return 0


def cmd_activate(args: argparse.Namespace) -> int:
    before = _change(args, "activate", lambda store: store.activate_prompt(args.name, args.version))
    if isinstance(before, int):
        return before
    was = f" (was {before.active})" if before.active and before.active != args.version else ""
    print(f"{args.name}: {args.version} is active{was}; {_when_read()}")
    if before.variants:
        print(f"ended the A/B split {_split(before.variants)}")
    return 0


def cmd_ab(args: argparse.Namespace) -> int:
    if args.weights == ["off"]:
        weights = None
    else:
        try:
            weights = _weights(args.weights)
        except ValueError as exc:
            return _fail("ab", exc, 2)
    before = _change(args, "ab", lambda store: store.set_prompt_variants(args.name, weights))
    if isinstance(before, int):
        return before
    if weights is None:
        if not before.variants:
            print(f"{args.name}: no A/B split was running")
        else:
            print(f"{args.name}: ended the A/B split {_split(before.variants)}; everyone gets "
                  f"{before.active or 'the default'} again (pins stay); {_when_read()}")
        return 0
    total = sum(weights.values())
    shares = ", ".join(f"{v} {100 * w / total:.0f}%" for v, w in weights.items())
    print(f"{args.name}: users split {shares} (each user stays in their variant; pinned users "
          f"keep their pin); {_when_read()}")
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    user = _user("pin", args.user)
    if user is None:
        return 2
    before = _change(args, "pin", lambda store: store.pin_prompt(user, args.name, args.version))
    if isinstance(before, int):
        return before
    was = f" (was {before})" if before and before != args.version else ""
    print(f"{user} gets {args.name} {args.version}{was}; {_when_read()}")
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    user = _user("unpin", args.user)
    if user is None:
        return 2
    removed = with_store(args, lambda store: store.unpin_prompt(user, args.name), none_yet=False)
    if not removed:
        return _fail("unpin", f"{user} has no pin of {args.name}")
    print(f"{user} gets {args.name} as everyone does again; {_when_read()}")
    return 0


def _user(command: str, value: str) -> str | None:
    """The user key checked, or None once the refusal is said."""
    from openclaw.gateway.access import check_user

    try:
        return check_user(value)
    except ValueError as exc:
        _fail(command, exc)
        return None


def _change(args: argparse.Namespace, command: str, work):
    """`work(store)`'s answer, or the exit code of a refusal (said on stderr)."""
    from openclaw.store.prompts import UnknownPromptVersion

    missing = object()
    try:
        before = with_store(args, work, none_yet=missing)
    except UnknownPromptVersion as exc:
        return _fail(command, exc)
    except ValueError as exc:
        return _fail(command, exc, 2)
    if before is missing:
        return _fail(command, NO_LIBRARY)
    return before


def _weights(words: list[str]) -> dict[str, int]:
    weights: dict[str, int] = {}
    for word in words:
        version, sep, weight = word.partition("=")
        if not sep or not version or not weight.isdigit() or int(weight) <= 0:
            raise ValueError(f"{word!r}: give each variant as VERSION=WEIGHT, a positive whole "
                             "number (e.g. v3=50 v4=50), or `off` alone to end the split")
        if version in weights:
            raise ValueError(f"{version} is named twice")
        weights[version] = int(weight)
    if len(weights) < 2:
        raise ValueError("an A/B split needs two versions or more; for one, use "
                         "`openclaw prompts activate NAME VERSION`")
    return weights


def _split(variants: dict[str, int]) -> str:
    return " ".join(f"{v}={w}" for v, w in variants.items())


def _listed(versions) -> str:
    return ", ".join(v.version for v in versions) or "none"
