"""Files users send are saved into the workspace the sandbox opened, never through a link a command
put on the way: a workspace in a writable share swapped for a link to /etc must not get (and, from
a root daemon, hand the user) a file named ld.so.preload."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from connectors.attachments import create_unique
from openclaw.gateway.contract import Folder
from sandbox.bwrap import isolation_available
from sandbox.grants import open_folder
from sandbox.policy import sandbox_uid
from sandbox.runner import run_command
from tests.helpers import telegram_env
from tests.helpers.sandbox import LIMITS
from tests.helpers.scripted_model import ScriptedModel, echo
from tests.helpers.telegram_env import ADA

# The Telegram tests' fixtures: a fake Bot API server, and a daemon on it (Env).
fake, env = telegram_env.fake, telegram_env.env
PARENT = "telegram:2002"  # never writes to the bot: only their commands run here


@pytest.fixture
def base():
    if shutil.which("bwrap") is None or not isolation_available()[0]:
        pytest.fail("bubblewrap is needed to plant links with a real command: apt-get install bubblewrap")
    # Under /tmp, walkable: the sandbox uid must reach the share (pytest's tmp_path is 0700).
    path = Path(tempfile.mkdtemp(prefix="openclaw-attach-", dir="/tmp"))
    path.chmod(0o755)
    (path / "system").mkdir()  # stands for /etc
    (path / "system/passwd").write_text("root:x:0:0\n")
    (path / "family").mkdir(mode=0o777)
    (path / "family").chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def family_roles(base: Path) -> str:
    """ADA has the role "family": workspace <family>/<user>, the family share writable; the role
    "parents" may write the share too, with workspaces elsewhere."""
    family = base / "family"
    return f"""
[access.roles]
"telegram:{ADA}" = "family"
"{PARENT}" = "parents"
[roles.family]
workspace = "{family}/{{user}}"
read_write = ["{family}"]
[roles.parents]
read_write = ["{family}"]
"""


def untouched(system: Path) -> bool:
    return (sorted(os.listdir(system)) == ["passwd"] and system.stat().st_uid == os.geteuid()
            and (system / "passwd").read_text() == "root:x:0:0\n")


async def test_a_workspace_a_command_swapped_for_a_link_gets_no_file_and_the_agent_is_told(env, fake, base):
    await env.start(ScriptedModel(echo), family_roles(base))
    alice = env.config.policy().principal(f"telegram:{ADA}")
    planted = await run_command(f"cd {base / 'family'} && mv {alice.workspace.name} old && "
                                f"ln -s {base / 'system'} {alice.workspace.name} && echo ok",
                                alice.scope, LIMITS)
    assert planted.stdout == "ok\n", planted.stderr
    fake.send_document("ld.so.preload", b"/tmp/evil.so\n", caption="keep this")
    [reply] = await env.replies(ADA, 1)  # the message is still answered
    assert reply.startswith("re: keep this\n\n[The user sent a file, which was not saved: "), reply
    assert "symbolic link" in reply
    assert untouched(base / "system")
    assert os.listdir(base / "family/old") == []  # nor saved where the workspace went


async def test_a_workspace_another_roles_command_swapped_gets_no_file(env, fake, base):
    await env.start(ScriptedModel(echo), family_roles(base))
    alice = env.config.policy().principal(f"telegram:{ADA}")
    parent = env.config.policy().principal(PARENT)
    planted = await run_command(f"cd {base / 'family'} && mv {alice.workspace.name} old && "
                                f"ln -s {base / 'system'} {alice.workspace.name} && echo ok",
                                parent.scope, LIMITS)
    assert planted.stdout == "ok\n", planted.stderr
    fake.send_document("passwd", b"root::0:0\n")
    [reply] = await env.replies(ADA, 1)
    assert "not saved" in reply and "symbolic link" in reply, reply
    assert untouched(base / "system")


async def test_a_workspace_in_a_share_gets_the_file_and_a_link_under_its_name_is_not_written_through(
        env, fake, base):
    await env.start(ScriptedModel(echo), family_roles(base))
    alice = env.config.policy().principal(f"telegram:{ADA}")
    planted = await run_command(f"ln -s {base / 'system/passwd'} report.txt && echo ok", alice.scope, LIMITS)
    assert planted.stdout == "ok\n", planted.stderr
    fake.send_document("report.txt", b"the report\n", caption="read this")
    assert await env.replies(ADA, 1) == [
        "re: read this\n\n[attached files, in your workspace: report-1.txt]"]
    saved = alice.workspace / "report-1.txt"
    assert saved.read_bytes() == b"the report\n"
    assert untouched(base / "system")
    if os.geteuid() == 0:  # written by a root daemon, owned by the uid the user's commands run as
        assert (saved.stat().st_uid, saved.stat().st_gid) == (alice.scope.uid, alice.scope.uid)


@pytest.mark.parametrize("handed_over", [False, True], ids=["kept", "handed-over"])
def test_a_file_is_created_in_the_folder_opened_even_if_its_path_is_swapped_meanwhile(base, handed_over):
    if handed_over and os.geteuid() != 0:
        pytest.skip("only a root daemon hands a file to the user's uid")
    workspace = base / "family/alice"
    workspace.mkdir()
    fd = open_folder(workspace, set())
    try:
        # What a command can do between the gateway's check and the download's first byte.
        workspace.rename(base / "family/old")
        workspace.symlink_to(base / "system")
        owner = sandbox_uid("telegram:1") if handed_over else None
        name, file = create_unique(Folder(fd, owner), "ld.so.preload")
        with file:
            file.write(b"x")
    finally:
        os.close(fd)
    assert name == "ld.so.preload"
    assert untouched(base / "system")
    saved = base / "family/old/ld.so.preload"
    assert saved.read_bytes() == b"x"
    assert saved.stat().st_uid == (owner if owner is not None else os.geteuid())
