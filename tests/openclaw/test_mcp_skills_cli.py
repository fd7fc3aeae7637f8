"""`openclaw skills list`, `skills run SERVER.TOOL --as USER` and `doctor` with an MCP server
configured: real processes, the real test server (tests/fakes/mcp_server.py) in the real sandbox,
the same audit log the daemon writes."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.cli import run
from tests.helpers.mcp import config_folder, stdio_server


@pytest.fixture
def config():
    root, path = config_folder(
        '[access]\nallow = ["telegram:5", "telegram:6"]\nroles = { "telegram:5" = "dev" }\n'
        '[roles.dev]\nskills = ["clock"]\n'
        + stdio_server("t", 'per_user = true\nroles = ["dev"]\ntools = ["echo", "whoami"]\n'))
    yield ["--config", str(path)], root
    shutil.rmtree(root, ignore_errors=True)


def test_skills_list_run_and_doctor_start_the_server_and_show_its_tools(config):
    args, root = config
    listed = run([*args, "skills", "list"], root)
    assert listed.returncode == 0, listed.stderr
    assert "t.echo\n  Echo the text back. (tool of the MCP server t)\n  from: MCP server t (" in listed.stdout
    assert "t.whoami" in listed.stdout and "t.crash" not in listed.stdout  # the allow-list
    assert "roles: dev" in listed.stdout.split("t.echo", 1)[1]

    ran = run([*args, "skills", "run", "t.echo", "--as", "telegram:5", "--args", '{"text": "hi"}'], root)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) | {"output": "hi"} == {
        "skill": "t.echo", "user": "telegram:5", "role": "dev", "decision": "allowed", "ok": True,
        "output": "hi"}
    assert json.loads(ran.stdout)["output"] == "hi"

    doctor = run([*args, "doctor", "--skip-model"], root)
    line = next(line for line in doctor.stdout.splitlines() if "mcp server t" in line)
    assert line.startswith("✓") and line.endswith("tools echo, whoami"), doctor.stdout
