"""`openclaw reminders ...`: every user's active reminders, for the admin to see and cancel.

A user sees and cancels only their own from the chat; the admin needs more: a reminder set in a
group keeps posting there after its owner has left it, and only they could cancel it. Like the
users commands these write the store, so they work while the daemon runs: it reads a reminder's
status again when it falls due."""

from __future__ import annotations

import argparse
import sys
from zoneinfo import ZoneInfo

from openclaw.cli.common import with_store
from openclaw.gateway import access
from openclaw.store.records import parse_user_key
from skills.base import MAX_REMINDER_NUMBER, visible

TEXT_SHOWN = 60  # characters of each reminder's text in a listing


def add_commands(sub, common_sub) -> None:
    reminders = sub.add_parser("reminders", help="everyone's active reminders; cancel them")
    _add_filters(reminders, default=None)  # `openclaw reminders --user X` lists, like `list`
    reminders.set_defaults(func=cmd_list)
    actions = common_sub(reminders.add_subparsers(dest="reminders_cmd"))
    p = actions.add_parser("list", help="active reminders, soonest first")
    _add_filters(p, default=argparse.SUPPRESS)  # so `reminders --user X list` keeps X
    p.set_defaults(func=cmd_list)
    p = actions.add_parser("cancel", help="cancel USER's reminder NUMBER, or every one in --chat")
    p.add_argument("user", nargs="?", help='"channel:id", e.g. "telegram:1001"')
    p.add_argument("number", nargs="?", type=_number, help="the number its user sees: 3 or #3")
    p.add_argument("--chat", help='every active reminder delivered to this chat ("channel:chat id")')
    p.set_defaults(func=cmd_cancel)


def _add_filters(parser: argparse.ArgumentParser, default) -> None:
    parser.add_argument("--user", default=default, help='only this user\'s, e.g. "telegram:1001"')
    parser.add_argument("--chat", default=default,
                        help='only those delivered to this chat, e.g. "telegram:-1001234567890"')


def _number(value: str) -> int:
    """A reminder's number as its user sees it ("#3") or as a number alone."""
    try:
        return int(value.removeprefix("#"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a reminder's number (3, or #3)") from None


def _chat(value: str) -> tuple[str, str]:
    try:
        return parse_user_key(value)  # a chat is written as a user is: "channel:id"
    except ValueError:
        raise ValueError('a chat is "channel:chat id", e.g. "telegram:-1001234567890"') from None


def _in_chat(channel: str, chat_id: str, chat: tuple[str, str]) -> bool:
    """Whether a reminder for (channel, chat_id) goes to `chat`. A Telegram forum topic is its
    group's id, "/", the topic's ("-100555/7", connectors/telegram.py): naming the group takes in
    its topics too, so that `cancel --chat` silences all of a group its owner left."""
    return channel == chat[0] and (chat_id == chat[1] or chat_id.startswith(chat[1] + "/"))


def cmd_list(args: argparse.Namespace) -> int:
    try:
        user = access.check_user(args.user) if args.user else None
        chat = _chat(args.chat) if args.chat else None
    except ValueError as exc:
        print(f"openclaw reminders list: {exc}", file=sys.stderr)
        return 2
    reminders = [r for r in with_store(args, lambda store: store.active_reminders(user), none_yet=[])
                 if chat is None or _in_chat(r.channel, r.chat_id, chat)]
    if not reminders:
        print("no active reminders")
    for r in reminders:
        local = r.due_at.astimezone(ZoneInfo(r.timezone))
        text = visible(r.text)
        text = text if len(text) <= TEXT_SHOWN else text[:TEXT_SHOWN - 3] + "..."
        print(f"{r.user:<24} #{r.number:<4} {local:%Y-%m-%d %H:%M} {r.timezone:<16} "
              f"{r.repeat or 'once':<9} chat {r.channel}:{r.chat_id}  {text}")
    return 0


async def _cancel_chat(store, chat: tuple[str, str]) -> list:
    """Every active reminder for `chat` and, a group's, for its forum topics (see _in_chat)."""
    chat_ids = {chat[1]} | {r.chat_id for r in await store.active_reminders()
                            if _in_chat(r.channel, r.chat_id, chat)}
    return [r for chat_id in sorted(chat_ids)
            for r in await store.cancel_chat_reminders(chat[0], chat_id)]


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        if args.chat and args.user is None:
            chat = _chat(args.chat)
            cancelled = with_store(args, lambda store: _cancel_chat(store, chat), none_yet=[])
            print(f"cancelled {len(cancelled)} reminder(s) delivered to {chat[0]}:{chat[1]}")
            return 0
        if args.chat or args.user is None or args.number is None:
            raise ValueError("give USER NUMBER, or --chat CHANNEL:CHAT_ID alone")
        user = access.check_user(args.user)
    except ValueError as exc:
        print(f"openclaw reminders cancel: {exc}", file=sys.stderr)
        return 2
    # Numbers count from 1, and none is past a database integer (the store raises OverflowError).
    done = (with_store(args, lambda store: store.cancel_reminder(user, args.number), none_yet=None)
            if 0 < args.number <= MAX_REMINDER_NUMBER else None)
    if done is None:
        print(f"openclaw reminders cancel: {user} has no active reminder #{args.number} "
              "(see openclaw reminders list)", file=sys.stderr)
        return 1
    print(f"cancelled {user}'s reminder #{done.number}: {visible(done.text)}")
    return 0
