"""What a principal may do. Roles come from the admin's config; a principal is one user with one
role, resolved to concrete scopes (workspace, extra paths, network, limits, email recipients).

Every decision here is a function of the config and the user's identity, which the gateway takes
from the messaging service, never of anything the model or a tool's output wrote.
"""

from __future__ import annotations

import functools
import os
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.scope import Limits, Scope

ANY = "*"
# Per-user sandbox uids (when the daemon is root), far above login users and the subordinate ranges
# container tools hand out; no passwd entry needed.
SANDBOX_UID_BASE = 1_500_000_000
SANDBOX_UID_SPAN = 100_000_000


def sandbox_uid(user: str) -> int:
    """The uid `user`'s commands run as: stable across restarts (their files keep their owner) and
    different for different users, so one user's processes never count against another's limit."""
    return SANDBOX_UID_BASE + zlib.crc32(user.encode()) % SANDBOX_UID_SPAN


@dataclass(frozen=True)
class Role:
    name: str
    skills: frozenset[str] = frozenset()  # {"*"}: every enabled skill
    workspace: str | None = None  # a folder, "{user}" replaced; None: <data_dir>/workspaces/<user>
    read_only: tuple[Path, ...] = ()
    read_write: tuple[Path, ...] = ()
    network: bool = False
    limits: Limits = field(default_factory=Limits)
    email_recipients: frozenset[str] = frozenset()  # exact addresses (lower case); "*": anyone
    email_domains: frozenset[str] = frozenset()  # "example.org" allows anyone@example.org
    # Listing and reading the mailbox of [skills.email]: one account for the whole install, so
    # sending to some addresses must not also open everything anyone ever mailed it.
    email_read: bool = False
    approval: frozenset[str] = frozenset()  # skills whose every call the user must approve
    approval_timeout_s: float = 300.0
    # After untrusted content (a file, a mail, a command's output) in a turn's prompt, every call
    # that may act needs the user's approval: see openclaw.agent.untrusted.
    approve_after_untrusted: bool = True
    daily_tokens: int = 0  # model tokens per user and UTC day; 0: no limit

    def grants(self, skill: str) -> bool:
        if server := mcp_server_of(skill):  # granted per server, never by "*"
            return f"{MCP_GRANT}{server}" in self.skills or skill in self.skills
        return ANY in self.skills or skill in self.skills

    def requires_approval(self, skill: str) -> bool:
        server = mcp_server_of(skill)
        return (ANY in self.approval or skill in self.approval
                or (server is not None and f"{MCP_GRANT}{server}" in self.approval))


MAX_PRINCIPALS = 4096  # (user, role) principals a Policy keeps made
MCP_GRANT = "mcp:"  # "mcp:git" in a role's skills or approval: every tool of the MCP server git


def mcp_server_of(skill: str) -> str | None:
    """The MCP server whose tool `skill` is ("git" for "git.git_status"); None for any other
    skill (their names have no dot)."""
    server, dot, _ = skill.partition(".")
    return server if dot else None


# The two roles every install has. An admin may redefine either with [roles.admin] / [roles.user].
BUILTIN_ROLES = {
    "admin": Role("admin", skills=frozenset({ANY}), network=True, email_recipients=frozenset({ANY}),
                  email_read=True,
                  # No disk quota: an admin's workspace is often a real home folder, already full
                  # of their files. The free-space reserve ([sandbox] min_free_disk_mb) still holds.
                  limits=Limits(cpu_seconds=120, memory_bytes=4 << 30, wall_seconds=300, disk_bytes=0)),
    # Paired users get harmless skills and their own workspace; shell, email and the network are
    # opt-in per role.
    "user": Role("user", skills=frozenset({"clock", "files", "reminders", "schedule", "memory"})),
}


def safe_user_dir(user: str) -> str:
    """A folder name for a "channel:id" user: no separators, no dot tricks, readable."""
    name = re.sub(r"[^A-Za-z0-9_.@-]", "_", user.replace(":", "-"))
    return name.lstrip(".") or "_"


@dataclass(frozen=True)
class Principal:
    """One user acting with one role: what every skill call is checked against."""

    user: str  # "channel:id"
    role: Role
    workspace: Path
    shared_writable: tuple[Path, ...] = ()  # Policy.shared_writable: what any principal may write

    @property
    def scope(self) -> Scope:
        return Scope(workspace=self.workspace, read_only=self.role.read_only,
                     read_write=self.role.read_write, network=self.role.network, uid=sandbox_uid(self.user),
                     others_writable=self.shared_writable)

    @property
    def limits(self) -> Limits:
        return self.role.limits

    def may_use(self, skill: str) -> bool:
        return self.role.grants(skill)

    def needs_approval(self, skill: str) -> bool:
        return self.role.requires_approval(skill)

    def may_email(self, address: str) -> bool:
        address = address.strip().lower()
        if ANY in self.role.email_recipients or address in self.role.email_recipients:
            return True
        domain = address.rpartition("@")[2]
        return bool(domain) and domain in self.role.email_domains

    def file_roots(self) -> list[tuple[Path, bool]]:
        """Folders the file skills may touch, each with whether it is writable; workspace first."""
        return ([(self.workspace, True)] + [(p, True) for p in self.role.read_write]
                + [(p, False) for p in self.role.read_only])


class UnknownRole(LookupError):
    pass


class Policy:
    """Roles by name, and the resolution of a user to a Principal."""

    def __init__(self, roles: dict[str, Role], data_dir: Path, role_of: Callable[[str], str]) -> None:
        self.roles = {**BUILTIN_ROLES, **roles}
        self.data_dir = Path(data_dir)
        self._role_of = role_of
        # (user, role name): the principal, made once (a reload makes a new Policy).
        self._principals: dict[tuple[str, str], Principal] = {}

    def role(self, name: str) -> Role:
        try:
            return self.roles[name]
        except KeyError:
            raise UnknownRole(f"role {name!r} is not defined (roles: {', '.join(self.roles)})") from None

    def principal(self, user: str, role: str | None = None) -> Principal:
        """`user` with its configured role (or `role`), its workspace created on first use (and
        again if it went since)."""
        name = role or self._role_of(user)
        resolved = self.role(name)
        found = self._principals.get((user, name))
        if found is None or found.role is not resolved:  # `roles` may have changed since
            found = Principal(user, resolved, self.workspace_path(user, resolved),
                              self.shared_writable)
            if len(self._principals) >= MAX_PRINCIPALS:
                self._principals.clear()
            self._principals[(user, name)] = found
        if not os.path.isdir(found.workspace):  # one stat where it is there: every turn but one
            found.workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
        return found

    @functools.cached_property
    def shared_writable(self) -> tuple[Path, ...]:
        """Every folder some principal's commands may write, as far as the config can say: each
        role's read_write, and where workspaces live (the folder holding per-user ones: the
        default <data_dir>/workspaces, a template's folder above its {user} part; a role's one
        fixed workspace). A grant reached through a link in one of them may have been redirected
        by another user's command, not only by this principal's (sandbox.grants)."""
        found = [self.data_dir / "workspaces"]
        for role in self.roles.values():
            found += role.read_write
            if role.workspace:
                template = Path(role.workspace).expanduser()
                parts = template.parts
                user_part = next((i for i, part in enumerate(parts) if "{user}" in part), None)
                found.append(template if user_part is None else Path(*parts[:user_part]))
        return tuple(dict.fromkeys(found))

    def workspace_path(self, user: str, role: Role | None = None) -> Path:
        role = role or self.role(self._role_of(user))
        if role.workspace:
            return Path(role.workspace.replace("{user}", safe_user_dir(user))).expanduser()
        return self.data_dir / "workspaces" / safe_user_dir(user)

    def roles_granting(self, skill: str) -> list[str]:
        return [name for name, role in self.roles.items() if role.grants(skill)]
