"""/remember and /memory: the user's own view of and hand on their long-term memory
(openclaw/memory.py), answered by the gateway, never by the model.

    /remember TEXT               keep TEXT, pinned, in this chat's memory
    /remember --everywhere TEXT  keep it for every chat of yours, groups included
    /memory                      the entries this chat reads, numbered
    /memory forget N             forget entry N
    /memory off | on             nothing written or read while off (the entries stay)

A private chat's memory is the user's private chats'; a group's is theirs in that group only.
"""

from __future__ import annotations

from openclaw.gateway.contract import InboundMessage
from openclaw.memory import Memory

MEMORY_COMMANDS = ("/remember", "/memory")
EVERYWHERE_FLAG = "--everywhere"
REMEMBER_USAGE = ("Use /remember TEXT to keep TEXT in this chat's memory, or /remember "
                  "--everywhere TEXT for all your chats, groups included.")
MEMORY_USAGE = "Use /memory, /memory forget N, /memory off or /memory on."
MEMORY_DISABLED = "Memory is turned off for everyone on this assistant (the owner's [memory] enabled)."


async def answer_memory(memory: Memory | None, command: str, msg: InboundMessage,
                        argument: str) -> str:
    """The reply to /remember or /memory."""
    if memory is None or not memory.config.enabled:
        return MEMORY_DISABLED
    if command == "/remember":
        return await _remember(memory, msg, argument)
    words = argument.split()
    if not words:
        return await _listing(memory, msg)
    if words[0].lower() in ("off", "on") and len(words) == 1:
        on = words[0].lower() == "on"
        await memory.set_enabled(msg.user, on)
        return ("Memory is on: I keep what you ask me to and read it in our conversations." if on
                else "Memory is off: I keep nothing new and read nothing of it until /memory on. "
                     "What is kept stays (see /memory; /memory forget N deletes an entry).")
    if words[0].lower() == "forget" and len(words) == 2 and words[1].lstrip("#").isdigit():
        number = int(words[1].lstrip("#"))
        gone = await memory.forget(msg.user, msg.chat_id, msg.is_group, number) \
            if number < 2**31 else None
        if gone is None:
            return f"There is no entry #{number} in this chat's memory (see /memory)."
        return f"Forgot #{gone.number}: {gone.text}"
    return MEMORY_USAGE


async def _remember(memory: Memory, msg: InboundMessage, argument: str) -> str:
    everywhere = argument.split(maxsplit=1)[:1] == [EVERYWHERE_FLAG]
    text = argument.removeprefix(EVERYWHERE_FLAG).strip() if everywhere else argument
    if not text:
        return REMEMBER_USAGE
    try:
        kept = await memory.remember(msg.user, msg.chat_id, msg.is_group, text, pinned=True,
                                     everywhere=everywhere, source="user")
    except ValueError as exc:
        return f"Not kept: {exc}."
    if kept is None:
        return "Your memory is off: nothing was kept (/memory on turns it back on)."
    entry, new = kept
    where = "in all your chats" if everywhere else (
        "in this group" if msg.is_group else "in your private chats")
    return f"{'Remembered' if new else 'Already remembered'} {where} as #{entry.number}: {entry.text}"


async def _listing(memory: Memory, msg: InboundMessage) -> str:
    entries = await memory.entries(msg.user, msg.chat_id, msg.is_group) or []
    off = "" if await memory.enabled(msg.user) else \
        "Your memory is off (/memory on): these are kept but not read.\n"
    if not entries:
        return off + "Nothing is kept in this chat's memory. /remember TEXT keeps something."
    lines = [f"#{e.number} {'📌 ' if e.pinned else ''}({e.kind}) {e.text}" for e in entries]
    return (off + "Your memory here (/memory forget N deletes one):\n" + "\n".join(lines))
