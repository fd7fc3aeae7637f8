"""The skill API: a name, a description, a JSON schema for the arguments, the permissions it needs,
and an async run(args, ctx). The context says who is calling with which scopes; it is built by the
daemon from the config, never from anything the model wrote."""

from __future__ import annotations

import json
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

from sandbox.policy import Principal
from sandbox.runner import Sandbox
from sandbox.scope import Result


class SkillError(Exception):
    """A failure to report back to the model as the tool's result (not a crash)."""


class SkillDenied(SkillError):
    """The principal's scopes forbid this particular call (a path outside its roots, a recipient
    not allowed). Audited as "denied"; the message says what was denied and why."""


@dataclass
class AuditNote:
    """What a run adds to its audit row beyond who/what/decision/duration, filled by the skill."""

    exit_status: int | None = None
    detail: str | None = None
    failed: bool = False  # the skill returned output (for the model) but did not succeed


class ReminderBook(Protocol):
    """Where reminders are kept and who delivers them: the daemon's store and scheduler. Returned
    reminders have number (the user's own #1, #2, ...), text, due_at (aware UTC), repeat and
    timezone."""

    def now(self) -> datetime: ...

    async def add(self, user: str, chat_id: str, text: str, due_at: datetime, *,
                  repeat: str | None, timezone: str) -> Any | None: ...  # None: the user has too many

    async def pending(self, user: str) -> list[Any]: ...

    async def cancel(self, user: str, number: int) -> Any | None: ...


class JobBook(Protocol):
    """The user's scheduled jobs, kept and fired by the daemon (openclaw.scheduler.book.Jobs).
    Every call is on the given user's own jobs only; errors in what was asked are ValueError."""

    def now(self) -> datetime: ...

    async def add(self, user: str, chat_id: str, *, kind: str, schedule: str, text: str,
                  timezone: str, options: dict[str, Any] | None = None) -> Any: ...

    async def list_for(self, user: str) -> list[Any]: ...  # each with .job and .next_run

    async def pause(self, user: str, number: int) -> Any | None: ...

    async def resume(self, user: str, number: int) -> Any | None: ...

    async def cancel(self, user: str, number: int) -> Any | None: ...


class MemoryBook(Protocol):
    """The user's long-term memory, kept by the daemon (openclaw.memory): in a private chat the
    user's private entries, in a group the group's, and with both those they keep everywhere.
    Returned entries have number, kind, text, pinned. None where the user's memory is off."""

    async def remember(self, user: str, chat_id: str, in_group: bool, text: str, *, kind: str,
                       pinned: bool = False, everywhere: bool = False) -> tuple[Any, bool] | None:
        """(the entry, whether it is new rather than merged into the same one kept); ValueError,
        saying why, for a text it cannot keep (empty, too long, every entry kept pinned)."""

    async def search(self, user: str, chat_id: str, in_group: bool, query: str) -> list[Any] | None: ...

    async def entries(self, user: str, chat_id: str, in_group: bool) -> list[Any] | None: ...

    async def forget(self, user: str, chat_id: str, in_group: bool, number: int) -> Any | None:
        """The entry forgotten, or None: no such entry in this chat's memory."""


MAX_REMINDER_NUMBER = 2**63 - 1  # numbers count from 1; no database integer column holds more


@dataclass
class SkillContext:
    principal: Principal
    sandbox: Sandbox = field(default_factory=Sandbox)
    chat_id: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # this skill's [skills.NAME] table
    audit: AuditNote = field(default_factory=AuditNote)
    reminders: ReminderBook | None = None  # set by a daemon that delivers reminders
    jobs: JobBook | None = None  # set by a daemon that runs scheduled jobs
    memory: MemoryBook | None = None  # set by a daemon that keeps its users' memory
    in_group: bool | None = None  # whether chat_id is a group chat; None: not known

    @property
    def user(self) -> str:
        return self.principal.user

    @property
    def role(self) -> str:
        return self.principal.role.name

    async def run(self, command: str) -> Result:
        """A shell command in the sandbox, with this principal's scope and limits."""
        return await self.sandbox.run(command, self.principal.scope, self.principal.limits)


class Skill(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}
    # What the skill touches, for `openclaw skills list` and the admin's judgement: "exec" (runs
    # programs in the sandbox), "files.read", "files.write", "network", "email.send", "email.read".
    permissions: ClassVar[frozenset[str]] = frozenset()
    # True for a skill that keeps to the role's wall_seconds itself and leaves nothing running
    # when cancelled (the shell kills the command's process group): the executor then gives it
    # that long, not agent.tool_timeout_s, and can say an abandoned call did not go on.
    keeps_wall_clock: ClassVar[bool] = False
    # Whether a call may change anything (run a program, write a file, send mail, schedule a
    # message); `read_only_actions`: the values of its "action" argument that never do. After
    # untrusted content, a call that may needs the user's approval (openclaw.agent.untrusted).
    # A skill that declares nothing (third-party, SKILL.md) is taken to act: the safe guess.
    side_effects: ClassVar[bool] = True
    read_only_actions: ClassVar[frozenset[str]] = frozenset()
    # Whether a call's result holds text nobody vouches for (a file, a mail, a command's output, a
    # fetched page), which may be written to steer the model. A mapping: the actions whose result
    # does, each to how an approval prompt names the source, filled from the call's arguments
    # ("file {path}"); True: every call, named "<skill> output". Undeclared: True.
    untrusted_output: ClassVar[bool | Mapping[str, str]] = True

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        """Problems with this skill's [skills.NAME] table, each naming the key. A skill that takes
        settings overrides this; one that takes none refuses any, so a typo is not ignored."""
        return [f"{key}: unknown setting ({cls.name} takes none)" for key in settings]

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        """Do the work; return the text the model reads. Raise SkillError for expected failures."""

    def typed_command(self, command: str, argument: str) -> dict[str, Any] | str:
        """The arguments of this skill's call for a chat command a person typed ("/remind" and
        its `argument`), or the text to answer instead (how to write the command)."""
        return f"The {self.name} skill takes no typed commands: ask me in a message instead."

    def describe(self, args: dict[str, Any]) -> str:
        """What a call will do, shown to the user when it needs approval: the exact command or
        file. Default: the arguments as JSON."""
        return visible(f"{self.name} {json.dumps(args, ensure_ascii=False)}")

    def acts(self, args: dict[str, Any]) -> bool:
        """Whether this call may change something (see `side_effects`)."""
        return self.side_effects and str(args.get("action")) not in self.read_only_actions

    def untrusted_source(self, args: dict[str, Any]) -> str | None:
        """What this call's result came from, as an approval prompt names it ("file notes.txt"),
        when it holds untrusted text (see `untrusted_output`); None when it does not."""
        if self.untrusted_output is True:
            return f"{self.name} output"
        if not self.untrusted_output:
            return None
        label = self.untrusted_output.get(str(args.get("action")))
        if label is None:
            return None
        filled = label.format_map(_Arguments(args))
        if len(filled) > MAX_SOURCE_CHARS:
            filled = filled[:MAX_SOURCE_CHARS] + "..."
        return visible(filled)

    def spec(self) -> dict[str, Any]:
        """The tool as the chat template lists it (OpenAI function format)."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


MAX_SOURCE_CHARS = 120  # of an untrusted source's name, in an approval prompt


class _Arguments(dict):
    """A call's arguments for str.format_map: one the call left out reads as "?"."""

    def __missing__(self, key: str) -> str:
        return "?"


# Letters that show as blank space (Hangul fillers) and the combining grapheme joiner: invisible,
# though their categories say otherwise.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u034f")


def visible(text: str) -> str:
    """`text` as an approval prompt must show it: every character a reader cannot see or that
    moves what they read (controls, line and paragraph separators, bidi controls, zero-width and
    TAG characters, private-use and unassigned code points, spaces other than " ") becomes an
    escape (\\u202e; \\U000e0041 past U+FFFF), so what is shown is what runs."""
    return "".join(_escape(c) if _hidden(c) else c for c in text)


def _hidden(char: str) -> bool:
    category = unicodedata.category(char)
    return (category[0] == "C" or (category[0] == "Z" and char != " ")
            or char in _BLANK_LETTERS)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
