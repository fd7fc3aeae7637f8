"""`reminders`: the user's own reminders, delivered into the chat they were set from at the time
they meant: once, or daily, on weekdays or weekly. The daemon keeps and delivers them (the context's
ReminderBook); this skill turns what the model wrote ("in 20 minutes", "17:30", "2026-12-24 09:00")
into an exact time (skills.builtin.spoken_time) and says it back, with its zone, so a
misunderstanding shows at once. A person may also type the call as a chat command (/remind,
/reminders): `typed_command` reads it."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from skills.base import MAX_REMINDER_NUMBER, ReminderBook, Skill, SkillContext, SkillError, visible
from skills.builtin.spoken_time import WHEN_HELP, local_time, parse_when, split_repeat, split_request
from skills.zones import TIMEZONE_PARAMETER, timezone_setting_problems
from skills.zones import zone_name as zone_name_of

MAX_TEXT_CHARS = 1000
REMIND_USAGE = ("Tell me when and what, e.g. /remind in 20 minutes stretch, /remind tomorrow 9:00 "
                "dentist, /remind every weekday at 8:00 pills.")
REMINDERS_USAGE = ("/reminders lists your reminders in this chat; /reminders cancel N cancels one, N "
                   "as the list numbers it (e.g. /reminders cancel 2).")


class RemindersSkill(Skill):
    name = "reminders"
    description = ("Remind the user of something later, in this chat: add a reminder (once or "
                   "repeating), list the user's reminders, or cancel one by its number.")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["add", "list", "cancel"]},
            "text": {"type": "string", "description": "add: what to remind the user of"},
            # The user's words, not a date the model worked out: a model's idea of "now" is
            # often wrong, and the skill says the exact time back.
            "when": {"type": "string", "description": "add: the user's own words for the time: "
                                                      + WHEN_HELP.removeprefix("use ")},
            "repeat": {"type": "string", "enum": ["none", "daily", "weekdays", "weekly"]},
            "number": {"type": "integer", "description": "cancel: the reminder's number (#N)"},
            "timezone": TIMEZONE_PARAMETER,
        },
        "required": ["action"],
    }
    # add and cancel change what the daemon will send; a listing shows the user's own reminders.
    read_only_actions = frozenset({"list"})
    untrusted_output = False

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        return timezone_setting_problems(cls.name, settings)

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        book = ctx.reminders
        if book is None:
            raise SkillError("reminders need the running daemon, which delivers them")
        action = args["action"]
        if action == "list":
            return await _list(book, ctx)
        if action == "cancel":
            number = args.get("number")
            if not isinstance(number, int):
                raise SkillError("cancel needs the reminder's number (list shows them)")
            # Numbers count from 1; one past a 64-bit integer would make the store raise
            # OverflowError: no reminder has it.
            done = await book.cancel(ctx.user, number) if 0 < number <= MAX_REMINDER_NUMBER else None
            if done is None:
                raise SkillError(f"you have no active reminder #{number}; list shows them")
            if done.chat_id != ctx.chat_id:  # this chat may be a group: not the text of another's
                return f"Cancelled reminder #{done.number} (set in another chat)."
            return f"Cancelled reminder #{done.number}: {done.text}"
        return await _add(book, args, ctx)

    def typed_command(self, command: str, argument: str) -> dict[str, Any] | str:
        """`/remind WHEN TEXT` (the time first or last) and `/reminders [cancel N]` as this skill's
        call; or how to write them, when `argument` is not that."""
        if command == "/reminders":
            cancel = re.fullmatch(r"cancel\s+#?(\d+)", argument, re.IGNORECASE)
            if cancel is None and argument:  # "/reminders cancel", "... cancel abc": no list
                return REMINDERS_USAGE
            return {"action": "cancel", "number": int(cancel[1])} if cancel else {"action": "list"}
        request = split_request(argument)
        if request is None:
            return REMIND_USAGE
        return {"action": "add", "when": request[0], "text": request[1]}

    def describe(self, args: dict[str, Any]) -> str:
        if args.get("action") != "add":
            return super().describe(args)
        # An approval prompt: escaped, so the model's text cannot add a line to it.
        return f"remind you {visible(str(args.get('when', '?')))}: {visible(str(args.get('text', '')))}"


async def _add(book: ReminderBook, args: dict[str, Any], ctx: SkillContext) -> str:
    text = str(args.get("text") or "").strip()
    if not text:
        raise SkillError("add needs the text of the reminder")
    if len(text) > MAX_TEXT_CHARS:
        raise SkillError(f"the text is {len(text)} characters; at most {MAX_TEXT_CHARS}")
    if not ctx.chat_id:
        raise SkillError("a reminder needs a chat to be delivered to, and this call has none")
    zone_name = zone_name_of(args, ctx.settings)
    zone = ZoneInfo(zone_name)
    now = book.now()
    spoken_repeat, when = split_repeat(str(args.get("when") or ""))
    repeat = args.get("repeat") or "none"
    if repeat == "none" and spoken_repeat:
        repeat = spoken_repeat
    elif spoken_repeat and repeat != spoken_repeat:
        # The user's words ("every monday at 9am") and the model's repeat=daily disagree: which
        # one the user meant is theirs to say, not ours to pick.
        raise SkillError(f"when={args.get('when')!r} repeats {spoken_repeat} but repeat={repeat}: "
                         f"give the repeat the user asked for once, in when or in repeat")
    due = parse_when(when, now, zone)
    moved = ""
    if repeat == "weekdays" and due.astimezone(zone).weekday() >= 5:  # starts on the next Monday
        local = due if due.tzinfo is zone else due.astimezone(zone)
        monday = local.date() + timedelta(days=7 - local.weekday())
        due = datetime.combine(monday, local.time(), tzinfo=zone)
        moved = " (moved to Monday: it repeats on weekdays)"
    reminder = await book.add(ctx.user, ctx.chat_id, text, due,
                              repeat=None if repeat == "none" else repeat, timezone=zone_name)
    if reminder is None:
        raise SkillError("you have too many active reminders; cancel some first")
    every = "" if repeat == "none" else f", then {repeat}"
    return (f"Reminder #{reminder.number} set for {local_time(due, zone)} {zone_name}{moved} "
            f"(in {_span(due - now)}){every}: {text}")


async def _list(book: ReminderBook, ctx: SkillContext) -> str:
    """The user's reminders for this chat. Those set elsewhere are only counted: this chat may be
    a group, and a reminder set in a private chat is nobody else's business."""
    zone_name = zone_name_of({}, ctx.settings)
    now = book.now()
    lines = [f"Now: {local_time(now, ZoneInfo(zone_name))} {zone_name}."]
    reminders = await book.pending(ctx.user)
    here = [r for r in reminders if r.chat_id == ctx.chat_id]
    for r in here:
        every = f" (repeats {r.repeat})" if r.repeat else ""
        due = local_time(r.due_at, ZoneInfo(r.timezone))
        lines.append(f"#{r.number} {due} {r.timezone}{every}: {r.text}")
    if not here:
        lines[0] += " You have no reminders in this chat."
    if elsewhere := len(reminders) - len(here):
        lines.append(f"({elsewhere} more in other chats: ask there to see them.)")
    return "\n".join(lines)


def _span(delta: timedelta) -> str:
    minutes = round(delta.total_seconds() / 60)
    if minutes < 1:
        return f"{max(round(delta.total_seconds()), 1)} s"
    days, rest = divmod(minutes, 1440)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} d" if days else "", f"{hours} h" if hours else "", f"{minutes} min" if minutes else ""]
    return " ".join(p for p in parts if p)
