"""What the command groups share: the store opened for one command, the data_dir held while a
command changes the store under it, a yes/no question, and a config error's whole report."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from openclaw.config import Config, ConfigError, load_config
from openclaw.datadir import DaemonRunning, claim_data_dir, release_data_dir

_OPEN = object()  # with_store's default: open (and create) the database whatever


def with_store(args: argparse.Namespace, work, *, none_yet=_OPEN):
    """Run `work(store)` against the config's database, from a command-line command. `none_yet`:
    the answer, when the database is a file not made yet, of a command that only looks (or finds
    nothing to change): a look at a fresh install creates no data folder and no database, which
    would be the command's user's, not the service's."""
    from openclaw.store import Store

    config = load_config(args.config, tokens=False)
    if none_yet is not _OPEN and _not_made_yet(config.store.url):
        return none_yet

    async def run():
        store = await Store.open(config.store.url)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def with_later_problems(exc: ConfigError) -> ConfigError:
    """A file that failed validation, with what the start would refuse next in its valid parts
    (skills, roles, the model file): one round of fixes, not one per kind of check."""
    from openclaw.skillset import problems_after_validation  # here: it imports the skills

    later = [p for p in problems_after_validation(exc.partial) if p not in exc.problems]
    return ConfigError(exc.path, exc.problems + later)


def _not_made_yet(url: str) -> bool:
    from openclaw.store.engine import normalize_url, sqlite_file

    path = sqlite_file(normalize_url(url))
    return path is not None and not path.exists()


def confirmed(command: str, question: str, yes: bool) -> bool:
    """--yes, or "y" typed at a terminal. Without a terminal to ask, says how to go on."""
    if yes:
        return True
    if not sys.stdin.isatty():
        print(f"{command}: nothing done: stdin is not a terminal to ask at; add --yes to go ahead",
              file=sys.stderr)
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() in ("y", "yes"):
        return True
    print("nothing done", file=sys.stderr)
    return False


@contextmanager
def data_dir_held(config: Config) -> Iterator[str | None]:
    """Hold the data_dir as a daemon does, so that none runs or starts while a command changes the
    store under it. Yields None, or what holds it (then nothing is held). With a PostgreSQL store,
    a daemon on another machine (another data_dir) is not seen: stop it first."""
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        lock = claim_data_dir(config.data_dir)
    except DaemonRunning as running:
        yield running.holder
        return
    try:
        yield None
    finally:
        release_data_dir(lock)
