"""The configured skills, ready to call: the registry built from `[skills]`, and the executor that
runs each call through the policy, the sandbox and the audit log. Shared by the daemon and the
`openclaw skills` commands, so an admin's check runs exactly what a model's call runs."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING, Any

from openclaw.config import Config, ConfigError, model_file_problems
from openclaw.config.mcp import server_specs
from sandbox.policy import MCP_GRANT, mcp_server_of
from sandbox.runner import Sandbox
from skills import Executor, SkillLoadError, SkillRegistry, load_skills
from skills.base import JobBook, MemoryBook, ReminderBook
from skills.executor import AuditSink

if TYPE_CHECKING:  # the MCP SDK takes a while to import: only where servers are configured
    from skills.mcp.servers import McpServers
    from skills.mcp.trust import PinStore
from skills.zones import one_zone


def configured_skills(config: Config, secrets: bool | Collection[str] = True) -> SkillRegistry:
    """The skills of `[skills]`; ConfigError naming the key when one cannot be loaded, with every
    problem of [skills] and of the roles' skill lists in one report. `secrets=False`: the skills'
    `env:`/`file:` settings unread (Config.skill_settings), for a registry that is only listed; a
    collection of names: only those skills' read, for a registry that runs only them."""
    path_problems = add_python_paths(config)
    try:
        registry = load_skills(config.skills.enabled, config.skills.dirs,
                               _skill_settings(config, secrets))
        problems: list[str] = path_problems
        unresolved: list[str] = []
    except SkillLoadError as exc:
        problems, unresolved = path_problems + exc.problems, exc.unresolved
        if exc.registry is None:  # nothing to check the roles against
            raise ConfigError(config.source, problems) from None
        registry = exc.registry
    problems += _unknown_role_skills(config, registry, unresolved)
    if problems:
        raise ConfigError(config.source, problems)
    return registry


def add_python_paths(config: Config) -> list[str]:
    """Put `[skills] python_paths` on this process's import path, for "module:Class" skills kept
    outside site-packages; the problems (a path that is no folder), each naming its key.

    Appended, after site-packages: a skill folder's `json.py` or `yaml.py` cannot replace what the
    daemon imports. The import system reads sys.path, so this is the one place it is changed; a
    path taken out of the config stays until the process ends (its modules are loaded anyway)."""
    problems = []
    for index, path in enumerate(config.skills.python_paths):
        if not path.is_dir():
            problems.append(f"skills.python_paths[{index}]: {path} is not a folder")
        elif (folder := os.path.normpath(path)) not in sys.path:  # "conf/../skills" as "skills"
            sys.path.append(folder)
            importlib.invalidate_caches()  # a folder the import system looked in before, now filled
    return problems


def _skill_settings(config: Config, secrets: bool | Collection[str]) -> dict[str, dict[str, Any]]:
    """Each [skills.NAME] table as its skill gets it: credentials resolved (Config.skill_settings)
    and the one zone the clock and reminders share; ConfigError naming every key that is wrong."""
    settings, problems = config.skill_settings(secrets)
    problems += one_zone(settings, config.skills.enabled)
    if problems:
        raise ConfigError(config.source, problems)
    return settings


def _unknown_role_skills(config: Config, registry: SkillRegistry, unresolved: list[str]) -> list[str]:
    """A typo in a role's list would grant nothing, silently. A name enabled but failing to load
    is reported once, in [skills], not again for each role naming it."""
    problems = []
    for name, role in config.roles.items():
        for key, listed in (("skills", role.skills), ("approval", role.approval)):
            unknown = sorted({s for s in listed
                              if s != "*" and s not in registry.names and s not in unresolved
                              and s not in registry.skipped_names  # left out: said once, why
                              and not mcp_name_known(config, s)})
            if unknown:
                problems.append("; ".join(filter(None, [
                    f"roles.{name}.{key}: unknown skill(s) {unknown}; enabled skills: "
                    f"{', '.join(registry.names) or 'none'} (enable more in [skills] enabled)",
                    *map(registry.hint, unknown)])))
    return problems


def mcp_name_known(config: Config, name: str) -> bool:
    """Whether a role's "mcp:NAME" or "NAME.TOOL" names a configured MCP server (its tools are
    known only once it has started)."""
    server = name.removeprefix(MCP_GRANT) if name.startswith(MCP_GRANT) else mcp_server_of(name)
    return server is not None and server in config.mcp.servers


def mcp_servers(config: Config, pins: PinStore) -> McpServers:
    """The [mcp.servers.*] ready to discover and call; ConfigError naming a header that
    cannot be read."""
    base = config.source.parent if config.source else None
    specs, problems = server_specs(config.mcp, config.data_dir, base)
    if problems:
        raise ConfigError(config.source, problems)
    from skills.mcp.servers import McpServers, Sandboxing

    section = config.sandbox
    bwrap, slirp = (str(path) if path else None for path in (section.bwrap_path, section.slirp4netns_path))
    return McpServers(specs, pins, Sandboxing(bwrap, section.allow_unsandboxed, slirp))


async def mcp_for(config: Config, registry: SkillRegistry, pins: PinStore) -> McpServers | None:
    """The configured MCP servers, their tools found and added to `registry`; None without any."""
    if not config.mcp.servers:
        return None
    servers = mcp_servers(config, pins)
    await servers.discover_all()  # each started once to list its tools, then stopped
    add_mcp_tools(registry, servers)
    return servers


@contextlib.asynccontextmanager
async def mcp_session(config: Config, registry: SkillRegistry) -> AsyncIterator[McpServers | None]:
    """For a command outside the daemon (doctor, skills list): the servers' tools added to
    `registry`, reviewed against the store's pins as the daemon would; stopped when it ends."""
    from openclaw.store import Store
    from openclaw.store.mcp_pins import McpPins

    if not config.mcp.servers:
        yield None
        return
    config.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # the owner's alone
    store = await Store.open(config.store.url)
    try:
        servers = await mcp_for(config, registry, McpPins(store))
        try:
            yield servers
        finally:
            if servers is not None:
                await servers.close()
    finally:
        await store.close()


def add_mcp_tools(registry: SkillRegistry, servers: McpServers) -> None:
    """Put the servers' tools, as their discovery found them, in `registry` as SERVER.TOOL."""
    from skills.mcp.skill import add_tools

    add_tools(registry, servers)


def skill_problems(config: Config) -> list[str]:
    """What configured_skills would refuse in `config`, as lines ([] when nothing)."""
    try:
        configured_skills(config)
    except ConfigError as exc:
        return exc.problems
    return []


def problems_after_validation(config: Config) -> list[str]:
    """What the start checks once the file validates: the skills and roles, and the model file (a
    local engine's, without loading it): said with the file's own problems, in one report."""
    return skill_problems(config) + model_file_problems(config.engine)


def sandbox_for(config: Config) -> Sandbox:
    section = config.sandbox
    bwrap, slirp = (str(path) if path else None for path in (section.bwrap_path, section.slirp4netns_path))
    return Sandbox(bwrap_path=bwrap, allow_unsandboxed=section.allow_unsandboxed, slirp4netns_path=slirp,
                   min_free_disk_bytes=section.min_free_disk_mb << 20, data_dir=config.data_dir)


def executor_for(config: Config, registry: SkillRegistry, audit: AuditSink,
                 reminders: ReminderBook | None = None, jobs: JobBook | None = None,
                 memory: MemoryBook | None = None) -> Executor:
    return Executor(registry, sandbox_for(config), audit, timeout_s=config.agent.tool_timeout_s,
                    reminders=reminders, jobs=jobs, memory=memory)
