"""`memory`: the user's long-term memory, kept by the daemon (the context's MemoryBook): remember
a fact, a preference or a standing instruction, recall entries by words, list them, forget one by
its number. In a private chat it is the user's private memory, in a group the group's; never
another user's. Entries the model keeps are never pinned: pinning is the user's (/remember)."""

from __future__ import annotations

from typing import Any

from skills.base import MemoryBook, Skill, SkillContext, SkillError, visible

KINDS = ["fact", "preference", "instruction"]  # "summary" is compaction's and consolidation's


class MemorySkill(Skill):
    name = "memory"
    description = ("The user's long-term memory, kept across conversations: remember something "
                   "the user wants kept (a fact, a preference, a standing instruction), recall "
                   "entries by words, list them, or forget one by its number.")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": ["remember", "recall", "list", "forget"]},
            "text": {"type": "string", "description": "remember: the entry, short and complete; "
                                                      "recall: words to look for"},
            "kind": {"type": "string", "enum": KINDS},
            "number": {"type": "integer", "description": "forget: the entry's number (#N)"},
        },
        "required": ["action"],
    }
    # remember and forget change what later turns read; recall and list only show the user's own.
    read_only_actions = frozenset({"recall", "list"})
    untrusted_output = False

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        book = ctx.memory
        if book is None:
            raise SkillError("memory needs the running daemon, which keeps it")
        if ctx.in_group is None or not ctx.chat_id:
            # Not knowing whether this is a group, a private entry could be read out there.
            raise SkillError("memory needs to know which chat this is, and this call has none")
        where = (ctx.user, ctx.chat_id, ctx.in_group)
        action = args["action"]
        if action == "remember":
            return await _remember(book, where, args)
        if action == "forget":
            number = args.get("number")
            if not isinstance(number, int):
                raise SkillError("forget needs the entry's number (list shows them)")
            gone = await book.forget(*where, number)
            if gone is None:
                raise SkillError(f"there is no entry #{number} in this chat's memory; list shows them")
            return f"Forgot #{gone.number}: {gone.text}"
        if action == "recall":
            found = await book.search(*where, str(args.get("text") or ""))
            if found is None:
                return "The user turned their memory off (/memory on turns it back on)."
            return _lines(found) if found else "Nothing in memory holds those words."
        entries = await book.entries(*where)
        return _lines(entries or []) if entries else "Nothing is kept in this chat's memory."

    def describe(self, args: dict[str, Any]) -> str:
        if args.get("action") != "remember":
            return super().describe(args)
        return f"remember: {visible(str(args.get('text', '')))}"


async def _remember(book: MemoryBook, where: tuple[str, str, bool], args: dict[str, Any]) -> str:
    text = str(args.get("text") or "").strip()
    if not text:
        raise SkillError("remember needs the text to keep")
    try:
        kept = await book.remember(*where, text, kind=str(args.get("kind") or "fact"))
    except ValueError as exc:  # too long, or every entry kept is pinned
        raise SkillError(str(exc)) from None
    if kept is None:
        return "Not kept: the user turned their memory off (/memory on turns it back on)."
    entry, new = kept
    return f"{'Remembered' if new else 'Already remembered'} as #{entry.number}: {entry.text}"


def _lines(entries: list[Any]) -> str:
    return "\n".join(f"#{e.number} ({e.kind}{', pinned' if e.pinned else ''}) {e.text}"
                     for e in entries)
