"""An MCP server over streamable HTTP on loopback (tests/fakes/mcp_server.py, not sandboxed: it
stands for a service elsewhere), its header read from the environment; and the config's errors
for [mcp.servers.NAME], each naming the key."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from openclaw.config import ConfigError, load_config
from openclaw.skillset import add_mcp_tools, configured_skills, executor_for, mcp_servers

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"


class Pins:
    def __init__(self) -> None:
        self.pins: dict[str, dict[str, str]] = {}

    async def get(self, server):
        return self.pins.get(server)

    async def put(self, server, pins):
        self.pins[server] = pins

    async def saw(self, server, seen, notes):
        pass


@pytest.fixture
def http_server():
    # Listening before the server starts: it takes connections at once, no ready line to wait for.
    listener = socket.create_server(("127.0.0.1", 0))
    proc = subprocess.Popen([sys.executable, str(FAKE), "--http-fd", str(listener.fileno())],
                            pass_fds=(listener.fileno(),))
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
    proc.kill()
    proc.wait()
    listener.close()


async def test_a_streamable_http_server_is_called_with_its_header_from_the_environment(
        http_server, tmp_path, monkeypatch):
    monkeypatch.setenv("M27_SEARCH_TOKEN", "Bearer sekrit-42")
    config_file = tmp_path / "openclaw.toml"
    config_file.write_text(f'data_dir = "{tmp_path}/data"\n[access.roles]\n"telegram:1" = "dev"\n'
                           f'[roles.dev]\nskills = ["mcp:web"]\n'
                           f'[mcp.servers.web]\nurl = "{http_server}"\n'
                           'headers = { Authorization = "env:M27_SEARCH_TOKEN" }\n')
    config = load_config(config_file)
    registry = configured_skills(config)
    servers = mcp_servers(config, Pins())
    try:
        await add_mcp_tools(registry, servers)
        assert "web.echo" in registry.names and "network" in registry.get("web.echo").permissions
        executor = executor_for(config, registry, None)
        principal = config.policy().principal("telegram:1")
        out = await executor.call("web.echo", {"text": "over http"}, principal)
        assert (out.ok, out.text) == (True, "over http")
        auth = await executor.call("web.authorization", {}, principal)
        assert auth.text == "Bearer sekrit-42"
    finally:
        await servers.close()
    assert "sekrit" not in repr(servers.specs["web"])  # a spec logged never shows it


@pytest.mark.parametrize(("table", "wanted"), [
    ('command = ["x"]\nurl = "http://127.0.0.1:1/mcp"', "mcp.servers.git = a table: give either command"),
    ("", "mcp.servers.git = a table: give either command"),
    ('url = "ftp://example.org"', "expected a URL starting with http:// or https://"),
    ('url = "http://127.0.0.1:1/mcp"\nper_user = true', "per_user, network, read_only and env are for"),
    ('command = ["x"]\nroles = ["nobody"]', "mcp.servers.git.roles: unknown role 'nobody'"),
    ('command = ["x"]\nidle_s = 0', "mcp.servers.git.idle_s"),
    ('command = ["x"]\ntypo = 1', "mcp.servers.git.typo"),
])
def test_a_bad_server_table_is_refused_naming_the_key(tmp_path, table, wanted):
    config_file = tmp_path / "openclaw.toml"
    config_file.write_text(f'data_dir = "{tmp_path}/data"\n[mcp.servers.git]\n{table}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config_file)
    assert wanted in str(caught.value), str(caught.value)


def test_an_unset_header_variable_names_the_header_and_never_a_value(tmp_path, monkeypatch):
    monkeypatch.delenv("M27_UNSET_TOKEN", raising=False)
    config_file = tmp_path / "openclaw.toml"
    config_file.write_text(f'data_dir = "{tmp_path}/data"\n[mcp.servers.web]\n'
                           'url = "http://127.0.0.1:1/mcp"\n'
                           'headers = { Authorization = "env:M27_UNSET_TOKEN" }\n')
    with pytest.raises(ConfigError) as caught:
        mcp_servers(load_config(config_file), Pins())
    assert "mcp.servers.web.headers.Authorization: environment variable M27_UNSET_TOKEN is not set" \
        in str(caught.value)


def test_a_role_naming_an_unknown_server_is_refused(tmp_path):
    config_file = tmp_path / "openclaw.toml"
    config_file.write_text(f'data_dir = "{tmp_path}/data"\n[roles.dev]\nskills = ["mcp:nope"]\n')
    with pytest.raises(ConfigError) as caught:
        configured_skills(load_config(config_file))
    assert "roles.dev.skills: unknown skill(s) ['mcp:nope']" in str(caught.value)
