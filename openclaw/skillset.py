"""The configured skills, ready to call: the registry built from `[skills]`, and the executor that
runs each call through the policy, the sandbox and the audit log. Shared by the daemon and the
`openclaw skills` commands, so an admin's check runs exactly what a model's call runs."""

from __future__ import annotations

from typing import Any

from openclaw.config import Config, ConfigError
from sandbox.runner import Sandbox
from skills import Executor, SkillLoadError, SkillRegistry, load_skills
from skills.base import ReminderBook


def configured_skills(config: Config) -> SkillRegistry:
    """The skills of `[skills]`; ConfigError naming the key when one cannot be loaded."""
    try:
        registry = load_skills(config.skills.enabled, config.skills.dirs, config.skill_settings())
    except SkillLoadError as exc:
        raise ConfigError(config.source, exc.problems) from None
    for name, role in config.roles.items():  # a typo in a role's list would grant nothing, silently
        unknown = sorted({s for s in role.skills + role.approval if s != "*" and s not in registry.names})
        if unknown:
            raise ConfigError(config.source, ["; ".join(filter(None, [
                f"roles.{name}: unknown skill(s) {unknown}; enabled skills: "
                f"{', '.join(registry.names) or 'none'} (enable more in [skills] enabled)",
                *map(registry.hint, unknown)]))])
    return registry


def sandbox_for(config: Config) -> Sandbox:
    section = config.sandbox
    bwrap, slirp = (str(path) if path else None for path in (section.bwrap_path, section.slirp4netns_path))
    return Sandbox(bwrap_path=bwrap, allow_unsandboxed=section.allow_unsandboxed, slirp4netns_path=slirp)


def executor_for(config: Config, registry: SkillRegistry, audit: Any,
                 reminders: ReminderBook | None = None) -> Executor:
    return Executor(registry, sandbox_for(config), audit, timeout_s=config.agent.tool_timeout_s,
                    reminders=reminders)
