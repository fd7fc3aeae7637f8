"""Fixtures shared by the test packages."""

import asyncio
import gc
import os

import pytest

from sandbox import network
from sandbox.runner import Sandbox


@pytest.fixture(scope="session")
def slirp4netns_works():
    # Optional for `make test` (a role granted network is refused without it); CI installs it and
    # sets OPENCLAW_REQUIRE_SLIRP4NETNS, so there a missing one fails instead of skipping.
    why = network.missing()
    if why and os.environ.get("OPENCLAW_REQUIRE_SLIRP4NETNS"):
        pytest.fail(f"{why}; CI requires it: apt-get install slirp4netns")
    if why:
        pytest.skip(f"{why}; install it to run these tests: apt-get install slirp4netns")
    works, what = asyncio.run(Sandbox().network())
    if not works:
        pytest.fail(f"slirp4netns is installed but cannot give a sandbox its network here: {what}")


def pytest_collection_finish(session):
    # Every test module is imported now, with torch and the other libraries: some hundreds of
    # thousands of objects that live as long as the run, which each full collection walked with
    # the event loop stopped (0.26-0.29 s, longer than some tests' timing allows on a loaded
    # machine). Frozen, a collection walks only what was made since, as `openclaw run` has it
    # (openclaw.daemon.freeze_start_up_heap). Collected first: frozen garbage is never freed.
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    # Given back for the exit's collections: left frozen, Triton's bindings count their objects
    # as leaked and print a page of warnings (see Daemon.stop).
    gc.unfreeze()
