"""The whole config file as one model, `Config`, and the checks no one table can make alone."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import (
    Field,
    PrivateAttr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from engine.config import EngineConfig
from openclaw.config.engine import EngineField
from openclaw.config.fields import LOCAL_USER, ConfigPath, Section
from openclaw.config.jobs import JobsList
from openclaw.config.mcp import McpConfig, role_problems, with_mcp_grants
from openclaw.config.memory import MemoryConfig
from openclaw.config.secrets import resolve_skill_secrets
from openclaw.config.sections import (
    AccessConfig,
    AdminConfig,
    AgentConfig,
    DiscordConfig,
    RoleConfig,
    SandboxConfig,
    ServeConfig,
    SkillsConfig,
    StoreConfig,
    TelegramConfig,
)
from openclaw.config.traces import TracesConfig

if TYPE_CHECKING:
    from sandbox.policy import Policy

_ROLE_NAME = re.compile(r"[A-Za-z0-9_-]+")
T = TypeVar("T")


def default_data_dir() -> Path:
    """`~/.local/share/openclaw`: the database, workspaces and other state."""
    return Path("~/.local/share/openclaw").expanduser()


class Config(Section):
    """The whole file. Load it with `load_config`."""

    data_dir: ConfigPath = Field(default_factory=default_data_dir)
    """Where state lives: the database, user workspaces."""
    engine: EngineField = Field(default_factory=EngineConfig)
    """The model: the engine in this process, or an OpenAI-compatible server (config/engine.py)."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)
    access: AccessConfig = Field(default_factory=AccessConfig)
    admin: AdminConfig = Field(default_factory=AdminConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    telegram: TelegramConfig = Field(default_factory=TelegramConfig)
    discord: DiscordConfig = Field(default_factory=DiscordConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    skills: SkillsConfig = Field(default_factory=SkillsConfig)
    roles: dict[str, RoleConfig] = {}
    """`[roles.NAME]` tables: what each role may do (skills, paths, network, limits)."""
    mcp: McpConfig = Field(default_factory=McpConfig)
    jobs: JobsList = []
    """`[[jobs]]` entries: scheduled jobs the admin sets for users (config/jobs.py)."""

    _source: Path | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _remember_source(self, info: ValidationInfo) -> Config:
        context = info.context if isinstance(info.context, dict) else {}
        self._source = context.get("source")  # load_config's file
        return self

    @model_validator(mode="after")
    def _default_store_url(self) -> Config:
        if self.store.url is None:
            self.store.url = f"sqlite+aiosqlite:///{self.data_dir / 'openclaw.db'}"
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        problems = cross_reference_problems(self.data_dir, dict(self.roles), self.access.roles)
        problems += role_problems(self.mcp, {"admin", "user", *self.roles})
        if problems:  # one line each; load_config splits them
            raise ValueError("\n".join(problems))
        return self

    def policy(self) -> Policy:
        """The sandbox policy: built-in roles changed or extended by [roles.NAME]."""
        from sandbox.policy import BUILTIN_ROLES, Policy  # ~0.1 s to import: only when used

        roles = {name: table.to_role(name, BUILTIN_ROLES.get(name)) for name, table in self.roles.items()}
        return Policy(with_mcp_grants(self.mcp, {**BUILTIN_ROLES, **roles}), self.data_dir, self.user_role)

    def skill_settings(self, secrets: bool | Collection[str] = True) -> tuple[
            dict[str, dict[str, Any]], list[str]]:
        """Each [skills.NAME] table with its credential references resolved, and a problem for each
        that cannot be (an unset variable, an unreadable file). `secrets=False`: the references left
        as written, for what only describes the skills (the service's environment may be the only
        one to hold them); a collection of names: only those skills' resolved (the one skill a
        command runs)."""
        settings: dict[str, dict[str, Any]] = {}
        problems: list[str] = []
        base = self._source.parent if self._source else None
        for name, table in self.skills.settings.items():
            if secrets is True or (secrets is not False and name in secrets):
                settings[name], found = resolve_skill_secrets(name, table, base)
                problems += found
            else:
                settings[name] = dict(table)
        return settings, problems

    @property
    def source(self) -> Path | None:
        """The file this config was read from; None when it is all defaults."""
        return self._source

    def user_role(self, user: str) -> str:
        """The role of a "channel:id" user: access.roles, else "admin" for admins and the console's
        owner (terminal:local), else "user"."""
        if user in self.access.roles:
            return self.access.roles[user]
        return "admin" if user in self.access.admins or user == LOCAL_USER else "user"


# --- checks across sections ---------------------------------------------------------------------


def cross_reference_problems(data_dir: Path | None, roles: dict[str, RoleConfig | None],
                             access_roles: dict[str, str]) -> list[str]:
    """What no one section can check: role names, the roles `access.roles` names being defined, and
    granted folders clear of data_dir. `roles` holds every [roles.NAME], None where its table did not
    parse (the role is still defined); a None data_dir skips the folder check."""
    problems = []
    bad_names = [n for n in roles if not _ROLE_NAME.fullmatch(n)]
    if bad_names:
        problems.append(f"roles: role names are letters, digits, _ and -; got {bad_names}")
    known = {"admin", "user", *roles}
    for user, role in access_roles.items():
        if role not in known:
            problems.append(f'access.roles: {user} has the role "{role}", which is not defined; '
                            f"add a [roles.{role}] table or use one of: {', '.join(sorted(known))}")
    if data_dir is not None:
        problems += _not_a_folder(data_dir)
        problems += [p for name, role in roles.items() if role is not None
                     for p in _grants_over_data_dir(data_dir, name, role)]
    return problems


def _not_a_folder(data_dir: Path) -> list[str]:
    """data_dir, or the nearest of its parents that exists, must be a folder: a file there makes
    every start fail with an errno ("File exists") that names no key."""
    path = data_dir.expanduser()
    for there in (path, *path.parents):
        if there.exists():
            if there.is_dir():
                return []
            where = "is a file" if there == path else f"is under {there}, a file"
            return [f"data_dir = \"{data_dir}\": {where}, not a folder; name a folder (it is made "
                    "if missing)"]
    return []


def _grants_over_data_dir(data_dir: Path, name: str, role: RoleConfig) -> list[str]:
    """A folder granted to a role must not hold data_dir (the database with every conversation,
    every user's workspace) nor lie inside it: the role's skills would reach all of that."""
    data = Path(os.path.realpath(data_dir.expanduser()))
    problems = []
    for key in ("read_only", "read_write"):
        for index, path in enumerate(getattr(role, key)):
            real = Path(os.path.realpath(path.expanduser()))
            if data.is_relative_to(real) or real.is_relative_to(data):
                where = "holds" if data.is_relative_to(real) else "is inside"
                problems.append(f"roles.{name}.{key}[{index}]: {path} {where} data_dir ({data_dir}: "
                                "the database and every user's workspace); grant a folder beside it")
    return problems


def cross_references_of_what_parsed(data: dict[str, Any], base_dir: Path) -> list[str]:
    """The checks across sections on a file that failed validation: run on the parts that parse
    alone, so their problems come in the same report rather than the next one."""
    context = {"base_dir": base_dir}
    data_dir = _parsed(lambda: TypeAdapter(ConfigPath).validate_python(
        data.get("data_dir", default_data_dir()), context=context))
    raw_roles = data.get("roles", {})
    roles = {name: _parsed(lambda t=table: RoleConfig.model_validate(t, context=context))
             for name, table in raw_roles.items()} if isinstance(raw_roles, dict) else {}
    access = data.get("access", {})
    raw_access_roles = access.get("roles", {}) if isinstance(access, dict) else {}
    access_roles: dict[str, str] = {}
    if isinstance(raw_access_roles, dict):
        for user, role in raw_access_roles.items():  # each entry alone: one bad one hides no other
            parsed = _parsed(lambda u=user, r=role: AccessConfig.model_validate({"roles": {u: r}}))
            access_roles.update(parsed.roles if parsed is not None else {})
    return cross_reference_problems(data_dir, roles, access_roles)


def _parsed(validate: Callable[[], T]) -> T | None:
    """`validate()`, or None when it fails (its problems are already reported)."""
    try:
        return validate()
    except ValidationError:
        return None
