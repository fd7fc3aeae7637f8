"""`openclaw skills list|run` and `doctor` as an admin runs them: real processes, real config,
real sandbox, the same audit log the daemon writes."""

from __future__ import annotations

import asyncio
import json
import shlex

from openclaw.store import Store
from tests.helpers.cli import run

# No admin port: doctor's check of it would fail these tests whenever a daemon of the machine's
# holds the default one.
CONFIG = """
data_dir = "{tmp}/data"
[admin]
enabled = false
[skills]
enabled = ["clock", "shell"]
[access]
admins = ["telegram:1"]
allow = ["telegram:5", "telegram:6", "telegram:7"]
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


def audit(tmp_path) -> list[tuple[str, str, int | None]]:
    async def rows():
        store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db")
        try:
            return [(a.user, a.decision, a.exit_status) for a in reversed(await store.list_audit())]
        finally:
            await store.close()

    return asyncio.run(rows())


async def pairing_code(tmp_path, user: str) -> str:
    """The code `user` gets when they first write to the bot."""
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path}/data/openclaw.db") as store:
        channel, external_id = user.split(":")
        await store.ensure_user(channel, external_id, "Ann")
        return await store.create_pairing_code(user)


def test_skills_list_shows_origin_permissions_and_roles(tmp_path):
    proc = run([*setup(tmp_path), "skills", "list"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    shell = proc.stdout.split("\nshell\n", 1)[1]
    assert "from: built-in" in shell and "permissions: exec" in shell
    assert "roles: admin, dev, careful (approval needed: careful)" in shell


def test_skills_show_gives_the_schema_and_an_example_that_runs(tmp_path):
    args = setup(tmp_path)
    shown = run([*args, "skills", "show", "shell"], tmp_path)
    assert shown.returncode == 0, shown.stderr
    head, rest = shown.stdout.split("arguments (JSON schema):\n", 1)
    assert head.startswith("shell: ") and "roles: admin, dev, careful (approval needed: careful)" in head
    schema_text, example = rest.split("example:\n", 1)
    assert "command" in json.loads(schema_text)["required"]
    # The example line, for a user, is a call the skill takes (whatever the command then does).
    line = shlex.split(example.strip().replace("USER", "telegram:5"))
    assert line[:3] == ["openclaw", "skills", "run"]
    ran = run([*args, *line[1:]], tmp_path)
    assert json.loads(ran.stdout)["decision"] == "allowed", ran.stdout + ran.stderr

    off = run([*args, "skills", "show", "email"], tmp_path)  # installed, not enabled
    assert off.returncode == 1 and "email is not enabled: add it to [skills] enabled" in off.stderr
    unknown = run([*args, "skills", "show", "nope"], tmp_path)
    assert unknown.returncode == 1 and "no skill named 'nope'; enabled: clock, shell" in unknown.stderr


def test_skills_list_and_another_skills_run_need_no_secret_that_only_the_service_holds(tmp_path):
    path = tmp_path / "openclaw.toml"
    path.write_text(f'data_dir = "{tmp_path}/data"\n[skills]\nenabled = ["clock", "email"]\n'
                    '[skills.email]\nsmtp_host = "127.0.0.1"\nsmtp_username = "me"\n'
                    'smtp_password = "env:OPENCLAW_TEST_SMTP"\nfrom_address = "me@example.org"\n')
    listed = run(["--config", str(path), "skills", "list"], tmp_path)  # the variable is not set
    assert listed.returncode == 0, listed.stderr
    assert "\nemail\n" in listed.stdout
    # Running the skill does need it, and says which.
    ran = run(["--config", str(path), "skills", "run", "email", "--as", "terminal:local",
               "--args", '{"action": "list"}'], tmp_path)
    assert ran.returncode == 2 and "OPENCLAW_TEST_SMTP" in ran.stderr, ran.stderr
    # Another skill does not: a test of the clock needs no mail password.
    clock = run(["--config", str(path), "skills", "run", "clock", "--as", "terminal:local"], tmp_path)
    assert clock.returncode == 0 and json.loads(clock.stdout)["decision"] == "allowed", clock.stderr


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
    refusal = json.loads(refused.stdout)
    assert refusal["decision"] == "rejected"
    assert refusal["output"] == ("error: shell needs the user's approval, which cannot be asked for: "
                                 "`openclaw skills run` has no terminal to ask on; --yes approves; "
                                 "it did not run")  # nobody denied it

    failed = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", '{"command": "exit 3"}'],
                 tmp_path)
    assert failed.returncode == 1 and "exit status 3" in json.loads(failed.stdout)["output"]

    assert audit(tmp_path) == [("telegram:5", "allowed", 0), ("telegram:7", "denied", None),
                               ("telegram:6", "rejected", None), ("telegram:5", "allowed", 3)]


def test_skills_run_rejects_bad_input_clearly(tmp_path):
    args = setup(tmp_path)
    bad_json = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", "{oops"], tmp_path)
    assert bad_json.returncode == 2 and "--args is not JSON: Expecting property name" in bad_json.stderr
    blocked = run([*args, "skills", "run", "clock", "--as", "telegram:13"], tmp_path)
    assert blocked.returncode == 2
    assert "telegram:13 is in access.blocked of the config; take them out" in blocked.stderr
    bad_user = run([*args, "skills", "run", "shell", "--as", "bob", "--args", "{}"], tmp_path)
    assert bad_user.returncode == 2 and 'expected a user "channel:id"' in bad_user.stderr
    bad_args = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", '{"cmd": "id"}'],
                   tmp_path)
    assert bad_args.returncode == 1 and "missing required argument 'command'" in bad_args.stdout


def test_skills_run_refuses_users_the_daemon_would_not_answer_and_says_how_to_admit_them(tmp_path):
    args = setup(tmp_path)
    clock = [*args, "skills", "run", "clock", "--as"]
    assert run([*args, "users", "block", "telegram:8"], tmp_path).returncode == 0
    assert run([*args, "users", "revoke", "telegram:9"], tmp_path).returncode == 0  # back to pairing

    blocked = run([*clock, "telegram:8"], tmp_path)
    assert blocked.returncode == 2 and blocked.stdout == ""
    assert blocked.stderr == ("openclaw skills run: telegram:8 is blocked (openclaw users block, or a "
                              "denied pairing request); `openclaw users allow telegram:8` admits them\n")
    pending = run([*clock, "telegram:9"], tmp_path)  # revoked: pending, but no code until they write
    assert pending.returncode == 2 and pending.stdout == ""
    assert pending.stderr == ("openclaw skills run: telegram:9 is not admitted yet (pending, no pairing "
                              "code): they get a code when they write again, or `openclaw users allow "
                              "telegram:9` admits them now\n")
    code = asyncio.run(pairing_code(tmp_path, "telegram:11"))
    asking = run([*clock, "telegram:11"], tmp_path)
    assert asking.returncode == 2 and asking.stdout == ""
    assert (f"telegram:11 is not admitted yet (pending): `openclaw pairing approve {code}` (their "
            "pairing code) or `openclaw users allow telegram:11` admits them") in asking.stderr
    unknown = run([*clock, "telegram:10"], tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""
    assert "telegram:10 is not a known user" in unknown.stderr
    assert "`openclaw users allow telegram:10` admits them" in unknown.stderr
    # Nothing ran for them: no audit row, no workspace made.
    assert audit(tmp_path) == []
    assert not any((tmp_path / "data/workspaces" / f"telegram-{n}").exists() for n in (8, 9, 10, 11))

    # Whom the store, the config or the console admits may: the daemon would answer them.
    assert run([*args, "users", "allow", "telegram:9"], tmp_path).returncode == 0
    for user in ("telegram:9", "telegram:1", "telegram:7", "terminal:local"):
        ok = run([*clock, user], tmp_path)
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["decision"] == "allowed"
    assert [user for user, *_ in audit(tmp_path)] == ["telegram:9", "telegram:1", "telegram:7",
                                                      "terminal:local"]


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


def test_skills_run_says_in_one_line_when_a_skill_is_not_enabled_or_a_reminder_has_no_chat(tmp_path):
    args = setup(tmp_path)
    for name in ("files", "reminders"):  # built-ins this config does not enable
        off = run([*args, "skills", "run", name, "--as", "telegram:1", "--args", '{"action": "list"}'],
                  tmp_path)
        assert off.returncode == 2 and off.stdout == ""
        assert off.stderr == (f"openclaw skills run: {name} is not enabled: add it to [skills] enabled "
                              f"in {tmp_path / 'openclaw.toml'}\n")
    unknown = run([*args, "skills", "run", "shel", "--as", "telegram:1"], tmp_path)  # no such skill:
    assert "there is no tool named 'shel'" in json.loads(unknown.stdout)["output"]  # as the model hears

    (tmp_path / "openclaw.toml").write_text(CONFIG.format(tmp=tmp_path).replace(
        '"clock", "shell"]', '"clock", "shell", "reminders"]', 1))
    remind = [*args, "skills", "run", "reminders", "--as", "telegram:1", "--args",
              '{"action": "add", "text": "tea", "when": "in 5 minutes"}']
    nowhere = run(remind, tmp_path)
    assert nowhere.returncode == 2 and nowhere.stdout == ""
    assert nowhere.stderr == ("openclaw skills run: a reminder needs --chat ID: the chat it is "
                              "delivered to (e.g. the Telegram chat id)\n")
    assert audit(tmp_path) == [("telegram:1", "unknown", None)]  # only "shel" reached the executor
    there = run([*remind, "--chat", "1"], tmp_path)
    assert there.returncode == 0 and "Reminder #1 set" in json.loads(there.stdout)["output"], there.stderr
    # The chat as `openclaw reminders` writes it is the same chat, not one named "telegram:1".
    written = run([*remind, "--chat", "telegram:1"], tmp_path)
    assert "Reminder #2 set" in json.loads(written.stdout)["output"], written.stderr
    both = run([*args, "reminders", "list", "--chat", "telegram:1"], tmp_path)
    assert [line.split()[1] for line in both.stdout.splitlines()] == ["#1", "#2"], both.stdout
    for chat, why in [("discord:1", "--chat discord:1 is a discord chat, and telegram:1 is on telegram"),
                      ("telegram:", "--chat telegram: names no chat")]:
        refused = run([*remind, "--chat", chat], tmp_path)
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout
        assert refused.stderr.startswith(f"openclaw skills run: {why}"), refused.stderr
    listed = run([*args, "skills", "run", "reminders", "--as", "telegram:1", "--args",
                  '{"action": "list"}'], tmp_path)  # needs no chat: it counts those set elsewhere
    assert listed.returncode == 0 and "2 more in other chats" in json.loads(listed.stdout)["output"]


def test_a_bad_slirp4netns_path_refuses_a_network_roles_command_and_names_the_path(tmp_path):
    args = setup(tmp_path)
    gone = tmp_path / "no-slirp4netns"
    (tmp_path / "openclaw.toml").write_text(CONFIG.format(tmp=tmp_path)
                                            + f'[sandbox]\nslirp4netns_path = "{gone}"\n')
    admin = run([*args, "skills", "run", "shell", "--as", "telegram:1", "--args", '{"command": "id"}'],
                tmp_path)  # admin: network granted
    assert admin.returncode == 1, admin.stderr
    assert json.loads(admin.stdout)["output"].startswith(
        f"error: cannot run commands with network: slirp4netns not found at {gone}; ")
    dev = run([*args, "skills", "run", "shell", "--as", "telegram:5", "--args", '{"command": "id -u"}'],
              tmp_path)  # no network: it never needs slirp4netns
    assert dev.returncode == 0 and json.loads(dev.stdout)["ok"], dev.stdout
