"""`files`: read, write, append, list, search and edit files in the caller's workspace and in the extra
folders its role grants.

This module is the skill as the model meets it: the actions, the checks on their arguments, and the
wording of what it reports. Where a path leads and how it is opened safely is in file_paths; walking
a folder for matches (and the child process regular expressions run in) is in file_search.
"""

from __future__ import annotations

import asyncio
import codecs
import heapq
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from typing import Any

from sandbox.disk import BLOCK
from sandbox.disk_budget import DiskFull, check_write
from sandbox.fs_identity import acting_as, as_daemon
from sandbox.grants import hand_over
from sandbox.policy import Principal
from sandbox.to_end import run_to_end
from skills.base import Skill, SkillContext, SkillDenied, SkillError
from skills.budget import check_call_memory, utf8_size
from skills.builtin import file_search
from skills.builtin.file_paths import (
    Target,
    folder_path,
    give_to_sandbox,
    open_file,
    open_folder,
    open_folders,
    q,
    regular,
    require_writable,
    resolve,
    stat_now,
    too_big,
)
from skills.builtin.file_search import BINARY_SNIFF_BYTES, search_in_child, search_tree
from skills.executor import MAX_RESULT_CHARS
from skills.fileio import pread_all, write_all

# One read fits the executor's 16,000-character result limit, so the "[cut ...; read on with
# offset=K]" note reaches the model instead of being cut off itself.
DEFAULT_MAX_READ_BYTES = 12 * 1024
# The most max_read_bytes may be: the executor cuts a result to 16,000 characters, so a bigger read
# would only hold more of a big file in the daemon's memory.
MAX_READ_BYTES = 1 << 20
SEARCH_MAX_FILE_BYTES = 1 << 20  # search reads bigger files than one read shows
MAX_LIST_ENTRIES = 500
# A listing or search result is cut to this many characters, so that it too fits the executor's
# limit and its closing notes ("N more not shown") reach the model instead of being cut off.
RESULT_BUDGET_CHARS = 12_000
DEFAULT_SEARCH_RESULTS = 50
MAX_SEARCH_RESULTS = 200
SNIPPET_CHARS = 80  # of `old`/`new`, in approval prompts
CHECK_CHUNK_BYTES = 1 << 20  # a file to edit is checked for UTF-8 this much at a time

# What each action takes besides `action` and `path`; anything else is refused so that a confused
# call (content given to read) fails loudly rather than being half-done.
ACTION_ARGS: dict[str, frozenset[str]] = {
    "read": frozenset({"offset"}),
    "write": frozenset({"content"}),
    "append": frozenset({"content"}),
    "list": frozenset(),
    "search": frozenset({"glob", "pattern", "regex", "max_results"}),
    "edit": frozenset({"old", "new", "count", "all"}),
}
REQUIRED_ARGS = {"write": ("content",), "append": ("content",), "edit": ("old", "new")}


class FilesSkill(Skill):
    name = "files"
    description = (
        "Read, write, append to, list, search and edit files. Paths are relative to the user's workspace "
        "(the shell skill's /workspace; \"/workspace/x\" works too), or absolute inside an extra folder "
        "the user's role grants. Symbolic links that lead outside those folders are refused. "
        "edit replaces the exact text `old` with `new`; `old` must occur once unless `count` (how many "
        "times it occurs) or `all` is given. search looks below a folder for files whose name matches "
        "`glob` and/or lines containing `pattern` (a regular expression when `regex` is true).")
    parameters = {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTION_ARGS),
                       "description": "read | write (create or replace) | append | list (a folder) | "
                                      "search (below a folder) | edit (replace exact text)"},
            "path": {"type": "string", "description": "file or folder, e.g. notes/todo.md or . for the "
                                                      "workspace"},
            "content": {"type": "string", "description": "write, append: the text"},
            "offset": {"type": "integer", "description": "read: start at this byte (to read on after a "
                                                         "cut)"},
            "old": {"type": "string", "description": "edit: the exact text to replace"},
            "new": {"type": "string", "description": "edit: the replacement text"},
            "count": {"type": "integer", "description": "edit: how many times `old` occurs; all of them "
                                                        "are replaced"},
            "all": {"type": "boolean", "description": "edit: replace every occurrence of `old`"},
            "glob": {"type": "string", "description": "search: file name pattern, e.g. *.md"},
            "pattern": {"type": "string", "description": "search: text the lines must contain"},
            "regex": {"type": "boolean", "description": "search: `pattern` is a regular expression"},
            "max_results": {"type": "integer", "description": f"search: at most this many matches "
                                                              f"(default {DEFAULT_SEARCH_RESULTS}, "
                                                              f"up to {MAX_SEARCH_RESULTS})"},
        },
        "required": ["action", "path"],
        "additionalProperties": False,
    }
    permissions = frozenset({"files.read", "files.write"})
    # Every other action (write, append, edit, and any added later) changes files.
    read_only_actions = frozenset({"read", "list", "search"})
    untrusted_output = {"read": "file {path}", "list": "the listing of folder {path}",
                        "search": "a search below folder {path}"}

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        problems = []
        for key, value in settings.items():
            if key != "max_read_bytes":
                problems.append(f"{key}: unknown setting (known: max_read_bytes)")
            elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"max_read_bytes: must be a positive integer, got {value!r}")
            elif value > MAX_READ_BYTES:
                problems.append(f"max_read_bytes: at most {MAX_READ_BYTES:,} (one read's result is cut "
                                f"to {MAX_RESULT_CHARS:,} characters anyway), got {value:,}")
        return problems

    def describe(self, args: dict[str, Any]) -> str:
        action, path = args.get("action"), q(str(args.get("path", "")))
        if action in ("write", "append"):
            size = _n(utf8_size(str(args.get("content", ""))), "byte")
            return (f"files: write {size} to {path} (replacing what is there)" if action == "write"
                    else f"files: append {size} to {path}")
        if action == "edit":
            times = ("every occurrence" if args.get("all") else
                     f"{args['count']} occurrences" if "count" in args else "the one occurrence")
            return (f"files: edit {path}: replace {times} of {_snippet(args.get('old'))} with "
                    f"{_snippet(args.get('new'))}")
        if action == "search":
            what = [f"names matching {q(str(args['glob']))}" if args.get("glob") else "",
                    f"lines with {_snippet(args.get('pattern'))}" if args.get("pattern") else ""]
            return f"files: search below {path} for " + " and ".join(w for w in what if w)
        return f"files: {action} {path}"

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        action = args["action"]
        _check_args(action, args)
        try:
            if action == "search" and args.get("regex") and args.get("pattern"):
                return await self._search_regex(args, ctx)
            return await asyncio.to_thread(_in_folders, args["path"], ctx.principal,
                                           getattr(self, f"_{action}"), args, ctx)
        except OSError as exc:  # no space left, permission refused by the system: the model's business
            raise SkillError(f"{action} {q(args['path'])}: {exc.strerror or exc}") from None

    # Each action below runs in a worker thread: file work must not stall the event loop.

    def _read(self, target: Target, args: dict[str, Any], ctx: SkillContext) -> str:
        cap = ctx.settings.get("max_read_bytes", DEFAULT_MAX_READ_BYTES)
        offset = args.get("offset", 0)
        fd, _ = open_file(target, os.O_RDONLY)
        try:
            size = regular(target, fd).st_size
            if b"\0" in os.pread(fd, BINARY_SNIFF_BYTES, 0):
                ctx.audit.detail = f"read {target.shown()}: binary, {size} bytes"
                return f"{target.shown()} is a binary file ({size:,} bytes); its content is not shown"
            if offset > size:
                raise SkillError(f"offset {offset} is past the end of {target.shown()} ({size:,} bytes)")
            data = pread_all(fd, cap, offset)
        finally:
            os.close(fd)
        cut = offset + len(data) < size
        # Decode whole characters only, so reading on at the offset we name loses nothing.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = decoder.decode(data, final=not cut)
        read_on = offset + len(data) - len(decoder.getstate()[0])
        ctx.audit.detail = f"read {target.shown()} {len(data)} bytes" + (f" of {size}" if cut else "")
        if size == 0:
            return f"({target.shown()} is empty)"
        if cut:
            text += f"\n[cut at {len(data):,} bytes of {size:,}; read on with offset={read_on}]"
        return text

    def _write(self, target: Target, args: dict[str, Any], ctx: SkillContext) -> str:
        return self._put(target, args["content"], ctx, append=False)

    def _append(self, target: Target, args: dict[str, Any], ctx: SkillContext) -> str:
        return self._put(target, args["content"], ctx, append=True)

    def _put(self, target: Target, content: str, ctx: SkillContext, *, append: bool) -> str:
        require_writable(target)
        limit = ctx.principal.limits.file_size_bytes
        verb = "appending to" if append else "writing"
        # Measured before it is encoded: a content over the limit is refused without a copy of it.
        size = utf8_size(content)
        if size > limit:
            raise too_big(target, size, limit, verb)
        check_call_memory(f"{verb} {target.shown()}", size, "Write it in parts with append.")
        data = _encoded("content", content)
        _check_room(target, ctx, len(data) if append else len(data) - _allocated(target))
        fd, created = open_file(target, os.O_WRONLY | (os.O_APPEND if append else 0), create=True)
        try:
            before = regular(target, fd).st_size
            if created:
                give_to_sandbox(target, fd)
            if append and before + len(data) > limit:
                raise too_big(target, before + len(data), limit, verb)
            if not append:
                os.ftruncate(fd, 0)
            write_all(fd, data)
        finally:
            os.close(fd)
        new = " (a new file)" if created else ""
        if append:
            ctx.audit.detail = f"append {target.shown()} {len(data)} bytes"
            total = before + len(data)
            return f"appended {len(data):,} bytes to {target.shown()}{new}; it is now {total:,} bytes"
        ctx.audit.detail = f"write {target.shown()} {len(data)} bytes"
        return f"wrote {len(data):,} bytes to {target.shown()}{new}"

    def _edit(self, target: Target, args: dict[str, Any], ctx: SkillContext) -> str:
        require_writable(target)
        old, new = _encoded("old", args["old"]), _encoded("new", args["new"])
        limit = ctx.principal.limits.file_size_bytes
        fd, _ = open_file(target, os.O_RDWR)
        try:
            size = regular(target, fd).st_size
            if size > limit:
                raise SkillError(f"{target.shown()} is {size:,} bytes, over your file size limit of "
                                 f"{limit:,}; it cannot be edited here")
            # Edited as UTF-8 bytes, never as one str (up to 4 bytes a character): `old` encoded
            # matches exactly where it occurs in the text, as UTF-8 never matches mid-character.
            data = pread_all(fd, size, 0)
            _check_text(target, data)
            found = data.count(old)
            _check_occurrences(target, found, args)
            # The result's size first, and refused before a byte of it is built: one character
            # replaced everywhere by a long text would otherwise make gigabytes of a small file.
            new_size = len(data) + found * (len(new) - len(old))
            if new_size > limit:
                raise too_big(target, new_size, limit, "editing")
            check_call_memory(f"editing {target.shown()}", len(data) + new_size,
                              "Edit it with the shell (sed) instead.")
            _check_room(target, ctx, new_size - size)
            updated = data.replace(old, new)
            # In place on the descriptor we read from: owner, mode and hard links stay as they were.
            write_all(fd, updated, 0)
            os.ftruncate(fd, len(updated))
        finally:
            os.close(fd)
        lines = _lines_of(data, old, found)
        ctx.audit.detail = f"edit {target.shown()} {found} replaced"
        times = "1 occurrence" if found == 1 else f"{found} occurrences"
        where = "line" if found == 1 else "lines"
        return f"replaced {times} in {target.shown()} ({where} {lines}); it is now {new_size:,} bytes"

    def _list(self, target: Target, args: dict[str, Any], ctx: SkillContext) -> str:
        fd = open_folder(target)
        counted = [0]
        try:
            with os.scandir(fd) as scan:
                # The first entries by name, kept MAX_LIST_ENTRIES at a time: a folder of a million
                # (empty files cost no disk) must not become a million objects in the daemon.
                entries = heapq.nsmallest(MAX_LIST_ENTRIES, _counting(scan, counted),
                                          key=lambda entry: entry.name)
            lines = _fit(_entry_line(entry, fd) for entry in entries)
        finally:
            os.close(fd)
        total = counted[0]
        ctx.audit.detail = f"list {target.shown()} {_n(total, 'entry', 'entries')}"
        if not total:
            return f"{target.shown()} is empty"
        more = total - len(lines)
        tail = [f"[{more} more not shown; search this folder with a glob to find one]"] if more else []
        return "\n".join([f"{target.shown()}: {_n(total, 'entry', 'entries')}", *lines, *tail])

    def _search(self, target: Target, args: dict[str, Any], ctx: SkillContext) -> str:
        glob, pattern, limit, cap = _search_options(args, ctx)
        fd = open_folder(target)
        try:
            found = search_tree(fd, glob, pattern, False, limit, cap)
        finally:
            os.close(fd)
        return _search_report(target, args, ctx, found, cap)

    async def _search_regex(self, args: dict[str, Any], ctx: SkillContext) -> str:
        """A regular expression search runs in a child process the daemon can kill (see
        file_search.search_in_child), handed the checked folder's descriptor: it resolves no path."""
        glob, pattern, limit, cap = _search_options(args, ctx)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SkillError(f"pattern is not a valid regular expression: {exc}") from None
        # The target is used below only for its names: its folders are closed by then.
        target, fd = await _opened_for_search(args["path"], ctx.principal)
        try:
            found = await search_in_child(fd, glob, pattern, limit, cap,
                                          ctx.principal.limits.wall_seconds, uid=target.uid)
        finally:
            os.close(fd)
        return _search_report(target, args, ctx, found, cap)


def _in_folders(raw: str, principal: Principal, work, *args):
    """`work(target, *args)` for the path `raw`, with the principal's folders open (file_paths.
    open_folders: none through a symlink a command could have put there) and the kernel checking
    every open, read and write as the user's sandbox uid (when the daemon is root), as it does for
    their shell commands: root's override of file permissions must not reach what the user's own
    commands could not."""
    with open_folders(principal) as folders:
        target = resolve(raw, folders)
        if target.root.workspace:  # the user's own, as for their shell commands
            hand_over(folders.grants.workspace.fd, principal.scope.uid)
        with acting_as(target.uid):
            return work(target, *args)


def _open_for_search(target: Target) -> tuple[Target, int]:
    """The target folder's descriptor, for the regex search's child; the caller closes it."""
    return target, open_folder(target)


async def _opened_for_search(raw: str, principal: Principal) -> tuple[Target, int]:
    """_open_for_search in a worker thread, which goes on when its caller is cancelled (/stop, a
    tool's timeout): the descriptor it then opens is closed at once, as nobody else will have it."""
    return await run_to_end(asyncio.to_thread(_in_folders, raw, principal, _open_for_search),
                            lambda opened: os.close(opened[1]))


def _check_room(target: Target, ctx: SkillContext, growth: int) -> None:
    """The disk budget (sandbox.disk_budget) before a write that adds `growth` bytes: the
    workspace's quota, and the free space kept for everyone on the folder's filesystem. Measured
    as the daemon: a folder the user made unreadable must still count."""
    root = folder_path(target.root)  # the folder open, not its path: that may lead elsewhere now
    try:
        with as_daemon():
            check_write(root, growth, workspace=root if target.root.workspace else None,
                        quota=ctx.principal.limits.disk_bytes, reserve=ctx.sandbox.min_free_disk_bytes)
    except DiskFull as exc:
        raise SkillDenied(f"nothing was written: {exc}") from None


def _allocated(target: Target) -> int:
    """What the file a write replaces holds on disk now (0: there is none yet): the write gives it
    back. Found as the write will open it (as the user, no symlink followed): a folder swapped for
    a symlink meanwhile must not tell them the size of a file only the daemon may see."""
    st = stat_now(target)
    return 0 if st is None else st.st_blocks * BLOCK


def _check_args(action: str, args: dict[str, Any]) -> None:
    if action not in ACTION_ARGS:  # the executor checks the enum; a direct caller may not have
        raise SkillError(f"unknown action {action!r}; use one of {', '.join(ACTION_ARGS)}")
    extra = sorted(set(args) - {"action", "path"} - ACTION_ARGS[action])
    if extra:
        takes = ", ".join(["path", *sorted(ACTION_ARGS[action])])
        raise SkillError(f"{', '.join(map(repr, extra))} does not apply to action {action!r} (it takes: "
                         f"{takes})")
    missing = [key for key in REQUIRED_ARGS.get(action, ()) if key not in args]
    if missing:
        raise SkillError(f"action {action!r} needs {' and '.join(map(repr, missing))}")
    if action == "read" and args.get("offset", 0) < 0:
        raise SkillError("offset must be 0 or more")
    if action == "edit":
        if not args["old"]:
            raise SkillError("'old' is empty; give the exact text to replace")
        if "count" in args and args.get("all"):
            raise SkillError("give either 'count' or 'all', not both")
        if "count" in args and args["count"] < 1:
            raise SkillError("'count' must be 1 or more")
    if action == "search":
        if not args.get("glob") and not args.get("pattern"):
            raise SkillError("search needs 'glob' (file names) and/or 'pattern' (text in lines)")
        if args.get("max_results", 1) < 1:
            raise SkillError("'max_results' must be 1 or more")


def _counting(items: Iterable[Any], counted: list[int]) -> Iterator[Any]:
    """`items`, one at a time, counting them into counted[0]."""
    for item in items:
        counted[0] += 1
        yield item


def _entry_line(entry: os.DirEntry, fd: int) -> str:
    name = q(entry.name)
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return f"{name}  (vanished)"
    if stat.S_ISLNK(st.st_mode):
        return f"{name} -> {q(os.readlink(entry.name, dir_fd=fd))}  (symbolic link)"
    if stat.S_ISDIR(st.st_mode):
        return f"{name}/"
    if stat.S_ISREG(st.st_mode):
        return f"{name}  {_n(st.st_size, 'byte')}"
    return f"{name}  (special file)"


def _check_text(target: Target, data: bytes) -> None:
    """Refuse to edit a binary file, or one that is not UTF-8: replacing bad bytes and writing back
    would damage it. Checked a piece at a time, so no str of the whole file is ever held."""
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        raise SkillError(f"{target.shown()} is a binary file; it cannot be edited as text")
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    for start in range(0, len(data) + 1, CHECK_CHUNK_BYTES):
        pending = len(decoder.getstate()[0])  # bytes of a character cut at the last piece's end
        try:
            decoder.decode(view[start:start + CHECK_CHUNK_BYTES], final=start + CHECK_CHUNK_BYTES > len(data))
        except UnicodeDecodeError as exc:
            raise SkillError(f"{target.shown()} is not valid UTF-8 (at byte {start - pending + exc.start}); "
                             "edit it with the shell instead") from None


def _encoded(name: str, value: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \\ud800 can carry
        raise SkillError(f"'{name}' is not valid text (it holds a lone surrogate)") from None


def _check_occurrences(target: Target, found: int, args: dict[str, Any]) -> None:
    where = target.shown()
    if found == 0:
        raise SkillError(f"'old' does not occur in {where} (it must match exactly, including spaces and "
                         "line breaks); nothing was changed")
    if args.get("all"):
        return
    if "count" in args:
        if found != args["count"]:
            raise SkillError(f"'old' occurs {found} times in {where}, not {args['count']}; nothing was "
                             "changed")
        return
    if found > 1:
        raise SkillError(f"'old' occurs {found} times in {where}; include more of the surrounding text "
                         f"so it occurs once, or give count={found} or all=true to replace every one; "
                         "nothing was changed")


def _lines_of(data: bytes, old: bytes, found: int, shown: int = 10) -> str:
    lines, start = [], data.find(old)
    while start != -1 and len(lines) < shown:
        lines.append(str(data.count(b"\n", 0, start) + 1))
        start = data.find(old, start + len(old))
    return ", ".join(lines) + (", ..." if found > shown else "")


def _fit(lines: Iterable[str], budget: int = RESULT_BUDGET_CHARS) -> list[str]:
    """The first of `lines` that fit in `budget` characters (at least one)."""
    kept: list[str] = []
    for line in lines:
        budget -= len(line) + 1
        if budget < 0 and kept:
            break
        kept.append(line)
    return kept


def _n(count: int, word: str, words: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else words or word + 's'}"


def _snippet(text: Any) -> str:
    text = str(text or "")
    short = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."
    return f"{json.dumps(short, ensure_ascii=False)} ({_n(utf8_size(text), 'byte')})"


def _search_options(args: dict[str, Any], ctx: SkillContext) -> tuple[str | None, str | None, int, int]:
    limit = min(args.get("max_results", DEFAULT_SEARCH_RESULTS), MAX_SEARCH_RESULTS)
    cap = ctx.settings.get("max_read_bytes", SEARCH_MAX_FILE_BYTES)
    return args.get("glob") or None, args.get("pattern") or None, limit, cap


def _search_report(target: Target, args: dict[str, Any], ctx: SkillContext, found: dict[str, Any],
                   cap: int) -> str:
    prefix = "" if target.root.workspace and not target.parts else target.shown() + "/"
    lines = _fit(f"{q(prefix + path)}:{number}: {line}" if number else q(prefix + path)
                 for path, number, line in found["matches"])
    count = len(lines)
    cut = count < len(found["matches"])  # by the budget: more would not reach the model
    ctx.audit.detail = f"search {target.shown()} {count} matches"
    if not lines:
        lines.append(f"no matches below {target.shown()}")
    notes = [f"[{found['visited']} files and folders looked at]"]
    if cut:
        notes.append(f"[more matches exist; showing the first {count}, as many as one result holds: "
                     "narrow the search with a glob, a smaller folder or a longer pattern]")
    elif found["more"]:
        notes.append(f"[more matches exist; showing the first {count}: narrow the search or raise "
                     f"max_results (up to {MAX_SEARCH_RESULTS})]")
    if found["stopped"]:
        # Read from file_search at each call: the walk stops at that number, so both say the same.
        notes.append(f"[stopped after {file_search.MAX_SEARCH_VISITS} files and folders; search a smaller "
                     "folder or use a glob]")
    if found["binary"] or found["large"]:
        notes.append(f"[skipped {found['binary']} binary files and {found['large']} files over "
                     f"{cap:,} bytes]")
    return "\n".join(lines + notes)
