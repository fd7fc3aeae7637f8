"""MCP servers as skills, as the daemon runs them: a real MCP server (tests/fakes/mcp_server.py,
written with the SDK) started under the real bubblewrap sandbox, its tools in the registry as
SERVER.TOOL, each call through the executor (role, arguments, approval, audit in a real SQLite
store). The servers start once per module where the test allows it."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio

from openclaw.config import load_config
from openclaw.skillset import configured_skills, executor_for, mcp_for
from openclaw.store import Store
from sandbox.bwrap import isolation_available
from sandbox.policy import sandbox_uid
from tests.helpers.mcp import MemoryPins, stdio_server

pytestmark = pytest.mark.asyncio(loop_scope="module")

def config_text(root: Path) -> str:
    return f"""
data_dir = "{root}/data"
[access.roles]
"telegram:1" = "dev"
"telegram:2" = "dev"
"telegram:3" = "user"
"telegram:4" = "careful"
"telegram:5" = "netdev"
[roles.netdev]
network = true
[roles.dev]
skills = ["clock"]
[roles.careful]
skills = ["mcp:t"]
approval = ["mcp:t"]
approval_timeout_s = 5
""" + stdio_server("t", 'per_user = true\nroles = ["dev"]\nbackoff_s = 0.2\n') + stdio_server(
        "shared", 'roles = ["dev"]\ntools = ["echo", "whoami", "read"]\nidle_s = 0.5\n') + stdio_server(
        "net", 'per_user = true\nnetwork = true\nroles = ["dev", "netdev"]\ntools = ["read", "connect"]\n')


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mcp():
    if shutil.which("bwrap") is None or not isolation_available()[0]:
        pytest.fail("bubblewrap is missing or cannot create namespaces: run `make setup`")
    # Not tmp_path: pytest's /tmp/pytest-of-root is 0700, which the sandbox uid cannot walk through.
    root = Path(tempfile.mkdtemp(prefix="openclaw-mcp-", dir="/tmp"))
    config_file = root / "openclaw.toml"
    config_file.write_text(config_text(root))
    config = load_config(config_file)
    config.data_dir.mkdir(mode=0o700)
    store = await Store.open(config.store.url)
    registry = configured_skills(config)
    servers = await mcp_for(config, registry, MemoryPins())
    executor = executor_for(config, registry, store.add_audit)
    policy = config.policy()

    class Parts:
        pass

    parts = Parts()
    parts.config, parts.store, parts.registry, parts.servers = config, store, registry, servers
    parts.executor, parts.policy = executor, policy

    async def call(user, name, args=None, **kwargs):
        return await executor.call(name, args or {}, policy.principal(user), **kwargs)

    parts.call = call
    yield parts
    await servers.close()
    await store.close()
    shutil.rmtree(root, ignore_errors=True)


async def test_tools_appear_as_server_dot_tool_with_their_schema(mcp):
    names = mcp.registry.names
    assert {"t.echo", "t.add", "t.read", "t.crash"} <= set(names)
    assert {n for n in names if n.startswith("shared.")} == {"shared.echo", "shared.whoami", "shared.read"}
    add = mcp.registry.get("t.add")
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert "MCP server t" in mcp.registry.origin("t.add")
    assert "(tool of the MCP server t)" in add.spec()["function"]["description"]


async def test_a_server_is_stopped_after_listing_and_started_by_its_first_call(mcp):
    instance = mcp.servers.instance("t", mcp.policy.principal("telegram:2"))
    assert not instance.running
    out = await mcp.call("telegram:2", "t.echo", {"text": "hello"})
    assert (out.ok, out.text, out.decision) == (True, "hello", "allowed")
    assert instance.running


async def test_each_escape_attempt_is_contained_and_the_result_says_so(mcp):
    other = mcp.config.data_dir / "workspaces" / "telegram-9"
    other.mkdir(parents=True)
    (other / "diary.txt").write_text("TOPSECRET-DIARY")
    targets = ["/etc/shadow", str(mcp.config.source), str(other / "diary.txt"),
               str(mcp.config.data_dir / "openclaw.db")]
    for path in targets:
        out = await mcp.call("telegram:1", "t.read", {"path": path})
        assert out.ok and out.text.startswith("BLOCKED: FileNotFoundError"), (path, out.text)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        out = await mcp.call("telegram:1", "t.connect", {"host": "127.0.0.1", "port": port})
        assert out.text.startswith("BLOCKED"), out.text
        out = await mcp.call("telegram:1", "t.connect", {"host": "1.1.1.1", "port": 53})
        assert out.text.startswith("BLOCKED"), out.text


async def test_a_per_user_server_has_that_users_workspace_and_uid_only(mcp):
    wrote = await mcp.call("telegram:1", "t.write", {"name": "note.txt", "text": "alice's"})
    assert wrote.ok, wrote.text
    assert (mcp.config.data_dir / "workspaces/telegram-1/note.txt").read_text() == "alice's"
    mine = await mcp.call("telegram:1", "t.whoami")
    theirs = await mcp.call("telegram:2", "t.whoami")
    assert f"uid={sandbox_uid('telegram:1')}" in mine.text and "note.txt" in mine.text
    assert f"uid={sandbox_uid('telegram:2')}" in theirs.text and "note.txt" not in theirs.text
    peek = await mcp.call("telegram:2", "t.read", {"path": "/workspace/note.txt"})
    assert peek.text.startswith("BLOCKED"), peek.text
    alice = mcp.config.data_dir / "workspaces/telegram-1/note.txt"
    peek = await mcp.call("telegram:2", "t.read", {"path": str(alice)})
    assert peek.text.startswith("BLOCKED"), peek.text


async def test_a_shared_server_has_a_workspace_of_its_own_and_stops_when_idle(mcp):
    out = await mcp.call("telegram:1", "shared.whoami")
    assert out.ok and f"uid={sandbox_uid('mcp:shared')}" in out.text, out.text
    assert "note.txt" not in out.text  # no user's workspace
    instance = mcp.servers.instance("shared", mcp.policy.principal("telegram:1"))
    connection = instance.connection
    assert connection is not None and instance.running
    await connection.ended.wait()  # idle_s = 0.5
    assert not instance.running
    again = await mcp.call("telegram:2", "shared.echo", {"text": "back"})
    assert again.ok and again.text == "back"


async def test_a_tool_outside_the_allow_list_is_not_offered(mcp):
    out = await mcp.call("telegram:1", "shared.crash")
    assert out.decision == "unknown" and "no tool named 'shared.crash'" in out.text


async def test_a_crashed_server_answers_an_error_then_is_started_again(mcp):
    principal = mcp.policy.principal("telegram:1")
    crashed = await mcp.call("telegram:1", "t.crash")
    assert not crashed.ok and "the MCP server t cannot answer" in crashed.text, crashed.text
    assert "started again" in crashed.text
    meanwhile = await mcp.call("telegram:1", "t.echo", {"text": "x"})
    assert not meanwhile.ok and "started again at the first call after" in meanwhile.text
    await mcp.servers.instance("t", principal).backoff_over()
    back = await mcp.call("telegram:1", "t.echo", {"text": "back"})
    assert back.ok and back.text == "back"
    rows = await mcp.store.list_audit(user="telegram:1")
    crash_row = next(r for r in rows if r.skill == "t.crash")
    assert crash_row.decision == "allowed" and "cannot answer" in crash_row.detail


async def test_a_tool_error_and_structured_content_become_the_tool_message(mcp):
    failed = await mcp.call("telegram:1", "t.fail")
    assert not failed.ok and failed.text.startswith("error (from the MCP server t)")
    assert "this tool always fails" in failed.text
    added = await mcp.call("telegram:1", "t.add", {"a": 2, "b": 3})
    assert added.ok and '"sum": 5' in added.text
    long = await mcp.call("telegram:1", "t.echo", {"text": "x" * 40_000})
    assert long.ok and long.text.endswith("[cut: 40000 characters in all]") and len(long.text) < 17_000
    bad = await mcp.call("telegram:1", "t.add", {"a": "two"})
    assert bad.decision == "invalid" and "missing required argument 'b'" in bad.text


async def test_only_roles_the_server_grants_may_use_its_tools(mcp):
    denied = await mcp.call("telegram:3", "t.echo", {"text": "x"})
    assert denied.decision == "denied" and "may not use 't.echo'" in denied.text
    assert "t.echo" not in mcp.executor.available(mcp.policy.principal("telegram:3"))
    assert "t.echo" in mcp.executor.available(mcp.policy.principal("telegram:1"))
    # A role's "*" is every enabled skill, not every server's tools: servers are granted one by one.
    assert "t.echo" not in mcp.executor.available(mcp.policy.principal("telegram:1", "admin"))


async def test_a_role_naming_the_server_needs_approval_and_every_call_is_audited(mcp):
    asked = []

    async def deny(principal, skill, summary):
        asked.append((skill, summary))
        return False

    async def allow(principal, skill, summary):
        return True

    refused = await mcp.call("telegram:4", "t.echo", {"text": "hi"}, approver=deny)
    assert refused.decision == "rejected" and asked[0][0] == "t.echo" and '"hi"' in asked[0][1]
    allowed = await mcp.call("telegram:4", "t.echo", {"text": "hi"}, approver=allow)
    assert allowed.ok and allowed.text == "hi"
    rows = [r for r in await mcp.store.list_audit(user="telegram:4")]
    assert [(r.skill, r.decision) for r in reversed(rows)] == [("t.echo", "rejected"), ("t.echo", "allowed")]
    assert rows[0].arguments == {"text": "hi"}


async def test_a_server_with_network_has_it_only_where_the_role_grants_it(mcp):
    granted = await mcp.call("telegram:5", "net.read", {"path": "/proc/net/route"})
    assert granted.ok and "tap0" in granted.text, granted.text
    withheld = await mcp.call("telegram:1", "net.read", {"path": "/proc/net/route"})
    assert withheld.ok and withheld.text.startswith("READ") and "tap0" not in withheld.text
    with socket.create_server(("127.0.0.1", 0)) as listener:  # the host's loopback: never
        port = listener.getsockname()[1]
        out = await mcp.call("telegram:5", "net.connect", {"host": "127.0.0.1", "port": port})
        assert out.text.startswith("BLOCKED"), out.text
