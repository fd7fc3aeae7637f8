"""`openclaw skills list|run` and `doctor` as an admin runs them: real processes, real config,
real sandbox, the same audit log the daemon writes."""

from __future__ import annotations

import asyncio
import json

from openclaw.store import Store
from tests.openclaw.test_cli import run

CONFIG = """
data_dir = "{tmp}/data"
[skills]
enabled = ["clock", "shell"]
[access]
roles = {{ "telegram:5" = "dev", "telegram:6" = "careful" }}
blocked = ["telegram:13"]
[roles.dev]
skills = ["shell", "clock"]
[roles.careful]
skills = ["shell"]
approval = ["shell"]
"""


def setup(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(CONFIG.format(tmp=tmp_path))
    return ["--config", str(path)]


def test_skills_list_shows_origin_permissions_and_roles(tmp_path):
    proc = run([*setup(tmp_path), "skills", "list"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    shell = proc.stdout.split("\nshell\n", 1)[1]
    assert "from: built-in" in shell and "permissions: exec" in shell
    assert "roles: admin, dev, careful (approval needed: careful)" in shell


def test_skills_run_as_a_user_goes_through_policy_sandbox_and_audit(tmp_path):
    args = setup(tmp_path)
    ok = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", '{"command": "id -u; pwd"}'],
             tmp_path)
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["decision"] == "allowed" and result["ok"] and result["role"] == "dev"
    assert "/workspace" in result["output"]

    denied = run([*args, "skills", "run", "shell", "--as", "telegram:7", "--args", '{"command": "id"}'],
                 tmp_path)
    assert denied.returncode == 1
    assert json.loads(denied.stdout)["decision"] == "denied"

    # not interactive and no --yes: a call that needs approval is refused, and says why
    refused = run([*args, "skills", "run", "shell", "--as", "telegram:6", "--args", '{"command": "id"}'],
                  tmp_path)
    assert refused.returncode == 1 and "use --yes" in refused.stderr
    assert json.loads(refused.stdout)["decision"] == "rejected"

    failed = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", '{"command": "exit 3"}'],
                 tmp_path)
    assert failed.returncode == 1 and "exit status 3" in json.loads(failed.stdout)["output"]

    async def audit():
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db")
        try:
            return [(a.user, a.decision, a.exit_status) for a in reversed(await store.list_audit())]
        finally:
            await store.close()

    assert asyncio.run(audit()) == [("telegram:5", "allowed", 0), ("telegram:7", "denied", None),
                                    ("telegram:6", "rejected", None), ("telegram:5", "allowed", 3)]


def test_skills_run_rejects_bad_input_clearly(tmp_path):
    args = setup(tmp_path)
    bad_json = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", "{oops"], tmp_path)
    assert bad_json.returncode == 2 and "--args is not JSON: Expecting property name" in bad_json.stderr
    blocked = run([*args, "skills", "run", "clock", "--as", "telegram:13"], tmp_path)
    assert blocked.returncode == 2 and "telegram:13 is blocked" in blocked.stderr
    bad_user = run([*args, "skills", "run", "shell", "--as", "bob", "--args", "{}"], tmp_path)
    assert bad_user.returncode == 2 and 'expected a user "channel:id"' in bad_user.stderr
    bad_args = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", '{"cmd": "id"}'],
                   tmp_path)
    assert bad_args.returncode == 1 and "missing required argument 'command'" in bad_args.stdout


def test_doctor_reports_the_isolation_and_a_broken_skill_config(tmp_path):
    args = setup(tmp_path)
    proc = run([*args, "doctor", "--skip-model"], tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert "✓ sandbox isolation: bubblewrap" in proc.stdout and "✓ skills: clock, shell" in proc.stdout
    broken_config = CONFIG.format(tmp=tmp_path).replace('enabled = ["clock"', 'enabled = ["clocks"')
    (tmp_path / "openclaw.toml").write_text(broken_config + '[sandbox]\nbwrap_path = "/nonexistent/bwrap"\n')
    broken = run([*args, "doctor", "--skip-model"], tmp_path)
    assert broken.returncode == 1
    assert "✗ skills: skills.enabled[0] ('clocks'): no such skill" in broken.stdout
    assert "✗ sandbox isolation: unavailable: bubblewrap not found" in broken.stdout
    assert "apt-get install bubblewrap" in broken.stdout
