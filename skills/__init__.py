"""Skills: what the agent can do. The API (base.py), the registry, and the built-ins."""

from skills.base import Skill, SkillContext, SkillError
from skills.registry import SkillRegistry, default_registry

__all__ = ["Skill", "SkillContext", "SkillError", "SkillRegistry", "default_registry"]
