"""The skill API: a name, a description, a JSON schema for the arguments, and an async run()."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar


class SkillError(Exception):
    """A failure to report back to the model as the tool's result (not a crash)."""


@dataclass
class SkillContext:
    """Who is calling and with which scopes. Built by the daemon from config, never by the model."""

    user: str  # "channel:id"
    role: str
    chat_id: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # this skill's [skills.NAME] table


class Skill(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        """Do the work; return the text the model reads. Raise SkillError for expected failures."""

    def spec(self) -> dict[str, Any]:
        """The tool as the chat template lists it (OpenAI function format)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}
