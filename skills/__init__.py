"""Skills: what the agent can do. The API (base.py), the registry, the executor that runs a call
through policy, approval and audit, and the built-ins."""

from skills.base import AuditNote, Skill, SkillContext, SkillDenied, SkillError
from skills.executor import Executor, Outcome
from skills.registry import SkillLoadError, SkillRegistry, load_skills

__all__ = ["AuditNote", "Executor", "Outcome", "Skill", "SkillContext", "SkillDenied", "SkillError",
           "SkillLoadError", "SkillRegistry", "load_skills"]
