"""`email`: send plain-text mail over SMTP to recipients the caller's role allows, and list or read
messages over IMAP without changing the mailbox: the skill's schema, its approval prompt, and the
dispatch to smtp.py and imap.py."""

from __future__ import annotations

from typing import Any

from skills.base import Skill, SkillContext, SkillDenied, SkillError, visible
from skills.builtin.email.imap import LIST_DEFAULT, LIST_MAX, list_messages, read_message
from skills.builtin.email.settings import problems
from skills.builtin.email.smtp import send

PREVIEW_CHARS = 200  # of the body, in approval prompts


class EmailSkill(Skill):
    name = "email"
    description = (
        "Send a plain-text email (action send: to, optional cc, subject, body) to recipients the "
        "user's role allows; list recent messages of a mailbox (action list: uid, from, subject, "
        "date; optional unseen_only and search text); or read one message by uid (action read: "
        "headers and text, attachments named). Reading never marks messages as read.")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["send", "list", "read"]},
            "to": {"type": ["array", "string"], "items": {"type": "string"},
                   "description": "send: recipient address(es), e.g. [\"ann@example.org\"]"},
            "cc": {"type": ["array", "string"], "items": {"type": "string"},
                   "description": "send: copy recipient address(es)"},
            "subject": {"type": "string", "description": "send: one line"},
            "body": {"type": "string", "description": "send: the plain-text message"},
            "mailbox": {"type": "string", "description": "list/read: default INBOX"},
            "count": {"type": "integer",
                      "description": f"list: how many recent messages (default {LIST_DEFAULT}, "
                                     f"at most {LIST_MAX})"},
            "unseen_only": {"type": "boolean", "description": "list: only messages not yet read"},
            "search": {"type": "string", "description": "list: only messages containing this text"},
            "uid": {"type": "integer", "description": "read: the message's uid, as list shows it"},
        },
        "required": ["action"],
        "additionalProperties": False,
    }
    permissions = frozenset({"email.send", "email.read", "network"})
    read_only_actions = frozenset({"list", "read"})
    untrusted_output = {"list": "the list of mails", "read": "email #{uid}"}

    _ARGS = {"send": ({"to", "subject", "body"}, {"cc"}),
             "list": (set(), {"mailbox", "count", "unseen_only", "search"}),
             "read": ({"uid"}, {"mailbox"})}

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        return problems(settings)

    def describe(self, args: dict[str, Any]) -> str:
        # An approval prompt: every field escaped (skills.base.visible), so a model-written subject
        # or body cannot add lines or reorder text to make the prompt read as something else.
        action = args.get("action")
        mailbox = visible(str(args.get("mailbox") or "INBOX"))
        if action == "list":
            count = args.get("count", LIST_DEFAULT)
            which = " unseen" if args.get("unseen_only") else ""
            search = f" containing {visible(str(args['search']))!r}" if args.get("search") else ""
            return f"list the {count} most recent{which} messages{search} in {mailbox}"
        if action == "read":
            return f"read the message with uid {visible(str(args.get('uid')))} in {mailbox}"
        body = str(args.get("body", ""))
        # The body keeps its line breaks (it is a letter) between markers: the closing one repeats
        # the length, so a forged "end of body" line inside it does not match, and every other
        # control or format character is escaped.
        shown = "\n".join(visible(line) for line in body[:PREVIEW_CHARS].split("\n"))
        first = f"first {PREVIEW_CHARS} of " if len(body) > PREVIEW_CHARS else ""
        lines = ["send an email", f"to: {_show_list(args.get('to'))}"]
        if args.get("cc"):
            lines.append(f"cc: {_show_list(args.get('cc'))}")
        lines += [f"subject: {visible(str(args.get('subject', '')))}",
                  f"body ({first}{len(body)} characters) >>>", shown,
                  f"<<< end of body ({len(body)} characters)"]
        return "\n".join(lines)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        action = args["action"]
        required, optional = self._ARGS[action]
        missing = sorted(required - set(args))
        if missing:
            raise SkillError(f"action {action} needs {', '.join(map(repr, missing))}")
        extra = sorted(set(args) - required - optional - {"action"})
        if extra:
            raise SkillError(f"action {action} does not take {', '.join(map(repr, extra))} "
                             f"(it takes: {', '.join(sorted(required | optional))})")
        problems = self.check_settings(ctx.settings)
        if problems:
            raise SkillError("the [skills.email] settings are invalid (an admin must fix them): "
                             + "; ".join(problems))
        if action == "send":
            return await send(args, ctx)
        role = ctx.principal.role
        if not role.email_read:
            raise SkillDenied(f"the role {role.name!r} may send mail but not list or read the "
                              "mailbox (it is shared by everyone who uses this assistant); an admin "
                              f"can allow it with email_read = true in [roles.{role.name}]")
        if action == "list":
            return await list_messages(args, ctx)
        return await read_message(args, ctx)


def _show_list(value: Any) -> str:
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else [value]
    return ", ".join(visible(str(i)) for i in items)
