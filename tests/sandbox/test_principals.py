"""Policy.principal keeps each (user, role) principal it made (sandbox/policy.py): the same one
again, its workspace made again (mode 0o700) if it was deleted since, and a reloaded config (a new
Policy) with a role's workspace template changed gives the new folder."""

from __future__ import annotations

import shutil
import stat

from sandbox.policy import Policy, Role


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_principal_is_kept_and_its_deleted_workspace_made_again(tmp_path) -> None:
    roles = {"r": Role("r", skills=frozenset({"clock"}))}
    policy = Policy(roles, tmp_path / "data", lambda user: "r")
    first = policy.principal("telegram:1")
    assert policy.principal("telegram:1") is first
    assert policy.principal("telegram:1", "r") is first
    assert policy.principal("telegram:2") is not first
    assert policy.principal("telegram:1", "user").role.name == "user"  # another role, its own
    assert first.workspace.is_dir() and _mode(first.workspace) == 0o700
    shutil.rmtree(first.workspace)
    again = policy.principal("telegram:1")
    assert again is first
    assert again.workspace.is_dir() and _mode(again.workspace) == 0o700
    shutil.rmtree(tmp_path / "data")  # the folders above it too
    assert policy.principal("telegram:1").workspace.is_dir()


def test_a_reloaded_config_with_a_changed_workspace_template_gives_the_new_folder(tmp_path) -> None:
    old = Policy({"r": Role("r", workspace=str(tmp_path / "old" / "{user}"))}, tmp_path / "data",
                 lambda user: "r")
    assert old.principal("telegram:1").workspace.parent == tmp_path / "old"
    new = Policy({"r": Role("r", workspace=str(tmp_path / "new" / "{user}"))}, tmp_path / "data",
                 lambda user: "r")
    principal = new.principal("telegram:1")
    assert principal.workspace.parent == tmp_path / "new"
    assert principal.workspace.is_dir() and _mode(principal.workspace) == 0o700
    assert old.principal("telegram:1").workspace.parent == tmp_path / "old"  # the old one's own
