"""Fixtures shared by the test packages."""

import asyncio
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
