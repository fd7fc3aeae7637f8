"""`files`: read, write, append, list, search and edit files in the caller's workspace and in the extra
folders its role grants.

Containment has two layers. First every path is resolved to where it really is (symlinks and `..`
followed, as the kernel would) and must lie inside one of the principal's folders; that check gives the
denial its wording. Then the work is done through file descriptors opened one component at a time from
the folder's own descriptor, each with O_NOFOLLOW, so a symlink swapped in after the check (the
sandboxed shell can write the same workspace) cannot lead the operation anywhere else.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import json
import os
import re
import stat
import sys
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from sandbox.policy import Principal
from sandbox.runner import SANDBOX_GID, SANDBOX_UID, WORKSPACE_MOUNT
from skills.base import Skill, SkillContext, SkillDenied, SkillError

# One read fits the executor's 16,000-character result limit, so the "[cut ...; read on with
# offset=K]" note reaches the model instead of being cut off itself.
DEFAULT_MAX_READ_BYTES = 12 * 1024
SEARCH_MAX_FILE_BYTES = 1 << 20  # search reads bigger files than one read shows
BINARY_SNIFF_BYTES = 8192  # a NUL in the first 8 KiB means binary, as git and grep decide
MAX_LIST_ENTRIES = 500
MAX_SEARCH_VISITS = 5000  # files and folders looked at by one search
DEFAULT_SEARCH_RESULTS = 50
MAX_SEARCH_RESULTS = 200
MAX_LINE_CHARS = 200  # of a matching line, in search results
SNIPPET_CHARS = 80  # of `old`/`new`, in approval prompts

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
# O_NONBLOCK: opening a FIFO someone left in the workspace must not hang the daemon.
FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK

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
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class _Root:
    real: str  # resolved; containment is checked against this
    configured: str  # as the admin wrote it, for messages
    writable: bool
    workspace: bool

    def shown(self) -> str:
        if self.workspace:
            return WORKSPACE_MOUNT
        return self.configured + ("" if self.writable else " (read-only)")


@dataclass(frozen=True)
class _Target:
    raw: str  # as the caller wrote it
    root: _Root  # the folder the resolved path lies in
    parts: tuple[str, ...]  # the resolved path below root.real, no symlinks, no dots

    def shown(self, parts: tuple[str, ...] | None = None) -> str:
        return _show(self.root, self.parts if parts is None else parts)


def _show(root: _Root, parts: tuple[str, ...]) -> str:
    """Workspace paths relative (as the model writes them), other folders' paths absolute."""
    if root.workspace:
        return _q("/".join(parts)) if parts else WORKSPACE_MOUNT
    return _q(os.path.join(root.real, *parts))


def _q(text: str) -> str:
    """A name as it may be shown: quoted when it holds newlines or other control characters, so a
    file name cannot forge extra lines in a listing or an approval prompt."""
    return text if text.isprintable() else repr(text)


def _real(path: str) -> str:
    # One seam for the test that fools the first layer and checks the second still holds.
    return os.path.realpath(path)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _roots(principal: Principal) -> list[_Root]:
    return [_Root(_real(str(path)), str(path), writable, index == 0)
            for index, (path, writable) in enumerate(principal.file_roots())]


def _listing(roots: list[_Root]) -> str:
    return ", ".join(root.shown() for root in roots)


def _root_of(path: str, roots: list[_Root]) -> _Root | None:
    """The innermost folder holding `path`: a read-only folder inside a writable one stays read-only
    (and a workspace inside a read-only folder stays writable)."""
    holding = [root for root in roots if _inside(path, root.real)]
    return max(holding, key=lambda root: len(root.real), default=None)


def _resolve(raw: str, roots: list[_Root]) -> _Target:
    if not raw.strip():
        raise SkillError("the path is empty; use \".\" for the workspace")
    if "\0" in raw:
        raise SkillError("the path contains a NUL character")
    workspace = roots[0]
    if raw == WORKSPACE_MOUNT or raw.startswith(WORKSPACE_MOUNT + "/"):
        # The shell skill shows the workspace at /workspace; the model reuses those paths here.
        joined = os.path.join(workspace.real, raw[len(WORKSPACE_MOUNT):].lstrip("/"))
    else:
        joined = os.path.join(workspace.real, raw)  # an absolute `raw` replaces the workspace
    lexical = os.path.normpath(joined)
    if not any(_inside(lexical, root.real) or _inside(lexical, os.path.normpath(root.configured))
               for root in roots):
        raise SkillDenied(f"{_q(raw)} is outside your folders ({_listing(roots)})")
    # Not realpath(lexical): "link/.." means the link's parent to the kernel, not ".".
    real = _real(joined)
    root = _root_of(real, roots)
    if root is None:
        raise SkillDenied(f"{_q(raw)} {_how_it_leaves(joined, roots, real)}, outside your folders "
                          f"({_listing(roots)})")
    return _Target(raw, root, tuple(part for part in real[len(root.real):].split("/") if part))


def _how_it_leaves(joined: str, roots: list[_Root], real: str) -> str:
    """Which symlink takes `joined` out of the folders, for the denial message."""
    parts = [part for part in joined.split("/") if part not in ("", ".")]
    current = "/"
    for index, part in enumerate(parts):
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        if os.path.islink(step):
            target = _real(step)
            if _root_of(target, roots) is None:
                pointed = _q(os.readlink(step))
                if index == len(parts) - 1:
                    return f"is a symbolic link to {pointed}"
                root = _root_of(current, roots)
                link = _show(root, tuple(os.path.relpath(step, root.real).split("/"))) if root else _q(step)
                return f"goes through {link}, a symbolic link to {pointed}"
            step = target
        current = step
    return f"resolves to {_q(real)}"


def _open_dir(target: _Target, parts: tuple[str, ...], *, create: bool = False, hint: str = "") -> int:
    """A descriptor for the folder root/parts, every component opened with O_NOFOLLOW from the one
    above it. With `create`, missing folders are made (and given to the sandbox uid in a workspace
    when we are root, so the sandboxed shell can change what we made). `hint` is added when the last
    component turns out not to be a folder."""
    chown = create and target.root.workspace and os.geteuid() == 0
    try:
        fd = os.open(target.root.real, DIR_FLAGS & ~os.O_NOFOLLOW)  # the admin's folder, as configured
    except FileNotFoundError:
        raise SkillError(f"the folder {target.root.configured} does not exist") from None
    try:
        for index, part in enumerate(parts):
            where = parts[:index + 1]
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise SkillError(f"{target.shown(where)} does not exist") from None
                made = _mkdir(fd, part)
                child = _open_or_deny(target, where, fd, part, DIR_FLAGS)
                if made and chown:
                    os.fchown(child, SANDBOX_UID, SANDBOX_GID)
            except OSError as exc:
                _deny_if_link(target, where, fd, part, exc)
                if exc.errno != errno.ENOTDIR:
                    raise
                last = hint if index == len(parts) - 1 else ""
                raise SkillError(f"{target.shown(where)} is not a folder{last}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _mkdir(fd: int, name: str) -> bool:
    try:
        os.mkdir(name, 0o777, dir_fd=fd)
        return True
    except FileExistsError:  # made meanwhile by someone else; opening it checks what it is
        return False


def _open_or_deny(target: _Target, where: tuple[str, ...], fd: int, name: str, flags: int,
                  mode: int = 0o666) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=fd)
    except OSError as exc:
        _deny_if_link(target, where, fd, name, exc)
        raise


def _deny_if_link(target: _Target, where: tuple[str, ...], fd: int, name: str, exc: OSError) -> None:
    """An O_NOFOLLOW open refused a component: if it is a symlink, the path changed after we resolved
    it (or the link loops); never follow it."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
        return
    try:
        is_link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        is_link = False
    if is_link or exc.errno == errno.ELOOP:
        raise SkillDenied(f"{_q(target.raw)}: {target.shown(where)} is a symbolic link that was not "
                          "there when the path was checked (or it loops); it is not followed") from None


def _open_file(target: _Target, flags: int, *, create: bool = False) -> tuple[int, bool]:
    """(descriptor, whether we created the file) for the target file, through _open_dir."""
    if not target.parts:
        raise SkillError(f"{target.shown()} is a folder; use action \"list\"")
    parent = _open_dir(target, target.parts[:-1], create=create)
    name = target.parts[-1]
    try:
        if create:
            try:
                return os.open(name, flags | FILE_FLAGS | os.O_CREAT | os.O_EXCL, 0o666, dir_fd=parent), True
            except FileExistsError:
                pass
        try:
            fd = _open_or_deny(target, target.parts, parent, name, flags | FILE_FLAGS)
        except FileNotFoundError:
            raise SkillError(f"{target.shown()} does not exist") from None
        except IsADirectoryError:
            raise SkillError(f"{target.shown()} is a folder; use action \"list\"") from None
        except OSError as exc:
            if exc.errno in (errno.ENXIO, errno.ENODEV):  # a pipe with no reader, a socket
                raise _not_regular(target) from None
            raise
        return fd, False
    finally:
        os.close(parent)


def _not_regular(target: _Target) -> SkillError:
    return SkillError(f"{target.shown()} is not a regular file (a device, socket or pipe)")


def _regular(target: _Target, fd: int) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise SkillError(f"{target.shown()} is a folder; use action \"list\"")
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(target)
    return st


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.pread(fd, min(left, 1 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes, offset: int | None = None) -> None:
    view = memoryview(data)
    while view:
        done = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        view = view[done:]
        if offset is not None:
            offset += done


def _give_to_sandbox(target: _Target, fd: int) -> None:
    # Only what we created, only in the workspace: the sandboxed shell runs as this uid and must be
    # able to change the files the model made for it. Never anything outside the workspace.
    if target.root.workspace and os.geteuid() == 0:
        os.fchown(fd, SANDBOX_UID, SANDBOX_GID)


def _too_big(target: _Target, size: int, limit: int, what: str) -> SkillDenied:
    return SkillDenied(f"{what} {target.shown()} would make it {size:,} bytes, over your file size limit "
                       f"of {limit:,} bytes; nothing was written")


def _require_writable(target: _Target) -> None:
    if not target.root.writable:
        raise SkillDenied(f"{_q(target.raw)} is in {target.root.configured}, which is read-only for you")


# -- search -----------------------------------------------------------------------------------------


def _search_tree(dir_fd: int, glob: str | None, pattern: str | None, regex: bool, max_results: int,
                 max_file_bytes: int) -> dict[str, Any]:
    """Matches below the folder `dir_fd`: (relative path, line number or 0, line). os.fwalk walks by
    descriptor and does not follow symlinked folders; files are opened with O_NOFOLLOW."""
    found = {"matches": [], "visited": 0, "binary": 0, "large": 0, "stopped": False, "more": False}
    matches: list[tuple[str, int, str]] = found["matches"]
    if pattern is None:
        matcher = None
    elif regex:
        matcher = re.compile(pattern).search
    else:
        def matcher(line: str) -> bool:
            return pattern in line
    for dirpath, dirnames, filenames, fd in os.fwalk(".", dir_fd=dir_fd):
        dirnames.sort()
        found["visited"] += 1
        if found["visited"] > MAX_SEARCH_VISITS:
            found["stopped"] = True
            return found
        for name in sorted(filenames):
            found["visited"] += 1
            if found["visited"] > MAX_SEARCH_VISITS:
                found["stopped"] = True
                return found
            rel = os.path.join(dirpath, name)[2:]  # no "./"
            if glob and not fnmatchcase(rel if "/" in glob else name, glob):
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # links, pipes: never followed or opened
            lines = [(0, "")] if matcher is None else _matching_lines(fd, name, st, matcher, max_file_bytes,
                                                                      found)
            for number, line in lines:
                if len(matches) == max_results:
                    found["more"] = True
                    return found
                matches.append((rel, number, line))
    return found


def _matching_lines(fd: int, name: str, st: os.stat_result, matcher: Any, max_file_bytes: int,
                    found: dict[str, Any]) -> list[tuple[int, str]]:
    if st.st_size > max_file_bytes:
        found["large"] += 1
        return []
    try:
        file_fd = os.open(name, os.O_RDONLY | FILE_FLAGS, dir_fd=fd)
    except OSError:
        return []
    try:
        data = _pread_all(file_fd, max_file_bytes, 0)
    finally:
        os.close(file_fd)
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        found["binary"] += 1
        return []
    return [(number, line[:MAX_LINE_CHARS])
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1)
            if matcher(line)]


def _search_child_main() -> None:
    """Entry point of the child process a regex search runs in (see FilesSkill._search_regex)."""
    job = json.load(sys.stdin)
    found = _search_tree(job["fd"], job["glob"], job["pattern"], True, job["max_results"],
                         job["max_file_bytes"])
    json.dump(found, sys.stdout)


_CHILD_CODE = ("import sys; sys.path.insert(0, {root!r}); "
               "from skills.builtin.files import _search_child_main; _search_child_main()")


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

    @classmethod
    def check_settings(cls, settings: dict[str, Any]) -> list[str]:
        problems = []
        for key, value in settings.items():
            if key != "max_read_bytes":
                problems.append(f"{key}: unknown setting (known: max_read_bytes)")
            elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"max_read_bytes: must be a positive integer, got {value!r}")
        return problems

    def describe(self, args: dict[str, Any]) -> str:
        action, path = args.get("action"), _q(str(args.get("path", "")))
        if action in ("write", "append"):
            size = _n(len(str(args.get("content", "")).encode()), "byte")
            return (f"files: write {size} to {path} (replacing what is there)" if action == "write"
                    else f"files: append {size} to {path}")
        if action == "edit":
            times = ("every occurrence" if args.get("all") else
                     f"{args['count']} occurrences" if "count" in args else "the one occurrence")
            return (f"files: edit {path}: replace {times} of {_snippet(args.get('old'))} with "
                    f"{_snippet(args.get('new'))}")
        if action == "search":
            what = [f"names matching {_q(str(args['glob']))}" if args.get("glob") else "",
                    f"lines with {_snippet(args.get('pattern'))}" if args.get("pattern") else ""]
            return f"files: search below {path} for " + " and ".join(w for w in what if w)
        return f"files: {action} {path}"

    async def run(self, args: dict[str, Any], ctx: SkillContext) -> str:
        action = args["action"]
        _check_args(action, args)
        try:
            target = await asyncio.to_thread(lambda: _resolve(args["path"], _roots(ctx.principal)))
            if action == "search" and args.get("regex") and args.get("pattern"):
                return await self._search_regex(target, args, ctx)
            return await asyncio.to_thread(getattr(self, f"_{action}"), target, args, ctx)
        except OSError as exc:  # no space left, permission refused by the system: the model's business
            raise SkillError(f"{action} {_q(args['path'])}: {exc.strerror or exc}") from None

    # Each action below runs in a worker thread: file work must not stall the event loop.

    def _read(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        cap = ctx.settings.get("max_read_bytes", DEFAULT_MAX_READ_BYTES)
        offset = args.get("offset", 0)
        fd, _ = _open_file(target, os.O_RDONLY)
        try:
            size = _regular(target, fd).st_size
            if b"\0" in os.pread(fd, BINARY_SNIFF_BYTES, 0):
                ctx.audit.detail = f"read {target.shown()}: binary, {size} bytes"
                return f"{target.shown()} is a binary file ({size:,} bytes); its content is not shown"
            if offset > size:
                raise SkillError(f"offset {offset} is past the end of {target.shown()} ({size:,} bytes)")
            data = _pread_all(fd, cap, offset)
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

    def _write(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        return self._put(target, args["content"].encode(), ctx, append=False)

    def _append(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        return self._put(target, args["content"].encode(), ctx, append=True)

    def _put(self, target: _Target, data: bytes, ctx: SkillContext, *, append: bool) -> str:
        _require_writable(target)
        limit = ctx.principal.limits.file_size_bytes
        verb = "appending to" if append else "writing"
        if len(data) > limit:
            raise _too_big(target, len(data), limit, verb)
        fd, created = _open_file(target, os.O_WRONLY | (os.O_APPEND if append else 0), create=True)
        try:
            before = _regular(target, fd).st_size
            if created:
                _give_to_sandbox(target, fd)
            if append and before + len(data) > limit:
                raise _too_big(target, before + len(data), limit, verb)
            if not append:
                os.ftruncate(fd, 0)
            _write_all(fd, data)
        finally:
            os.close(fd)
        new = " (a new file)" if created else ""
        if append:
            ctx.audit.detail = f"append {target.shown()} {len(data)} bytes"
            total = before + len(data)
            return f"appended {len(data):,} bytes to {target.shown()}{new}; it is now {total:,} bytes"
        ctx.audit.detail = f"write {target.shown()} {len(data)} bytes"
        return f"wrote {len(data):,} bytes to {target.shown()}{new}"

    def _edit(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        _require_writable(target)
        old, new = args["old"], args["new"]
        limit = ctx.principal.limits.file_size_bytes
        fd, _ = _open_file(target, os.O_RDWR)
        try:
            size = _regular(target, fd).st_size
            if size > limit:
                raise SkillError(f"{target.shown()} is {size:,} bytes, over your file size limit of "
                                 f"{limit:,}; it cannot be edited here")
            data = _pread_all(fd, size, 0)
            text = _decode_for_edit(target, data)
            found = text.count(old)
            _check_occurrences(target, found, args)
            updated = text.replace(old, new).encode()
            if len(updated) > limit:
                raise _too_big(target, len(updated), limit, "editing")
            # In place on the descriptor we read from: owner, mode and hard links stay as they were.
            _write_all(fd, updated, 0)
            os.ftruncate(fd, len(updated))
        finally:
            os.close(fd)
        lines = _lines_of(text, old)
        ctx.audit.detail = f"edit {target.shown()} {found} replaced"
        times = "1 occurrence" if found == 1 else f"{found} occurrences"
        where = "line" if found == 1 else "lines"
        return f"replaced {times} in {target.shown()} ({where} {lines}); it is now {len(updated):,} bytes"

    def _list(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        fd = _open_folder(target)
        try:
            with os.scandir(fd) as scan:
                entries = sorted(scan, key=lambda entry: entry.name)
            lines = [_entry_line(entry, fd) for entry in entries[:MAX_LIST_ENTRIES]]
        finally:
            os.close(fd)
        ctx.audit.detail = f"list {target.shown()} {_n(len(entries), 'entry', 'entries')}"
        if not entries:
            return f"{target.shown()} is empty"
        more = len(entries) - len(lines)
        tail = [f"[{more} more not shown]"] if more else []
        return "\n".join([f"{target.shown()}: {_n(len(entries), 'entry', 'entries')}", *lines, *tail])

    def _search(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        glob, pattern, limit, cap = _search_options(args, ctx)
        fd = _open_folder(target)
        try:
            found = _search_tree(fd, glob, pattern, False, limit, cap)
        finally:
            os.close(fd)
        return _search_report(target, args, ctx, found, cap)

    async def _search_regex(self, target: _Target, args: dict[str, Any], ctx: SkillContext) -> str:
        """A regular expression can backtrack for minutes, holding the GIL (so the whole daemon), and
        cannot be interrupted; it runs in a child process, handed the checked folder's descriptor,
        and is killed at the role's wall-clock limit."""
        glob, pattern, limit, cap = _search_options(args, ctx)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SkillError(f"pattern is not a valid regular expression: {exc}") from None
        fd = await asyncio.to_thread(_open_folder, target)
        wall = ctx.principal.limits.wall_seconds
        proc = None
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-c", _CHILD_CODE.format(root=PROJECT_ROOT),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=(fd,))
            job = {"fd": fd, "glob": glob, "pattern": pattern, "max_results": limit, "max_file_bytes": cap}
            try:
                out, err = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), wall)
            except TimeoutError:
                raise SkillError(f"the regular expression search did not finish within {wall:g} s (the "
                                 "pattern may backtrack heavily); simplify it, or search plain "
                                 "text") from None
        finally:
            os.close(fd)
            if proc is not None and proc.returncode is None:  # timed out, or we were cancelled
                proc.kill()
                await proc.wait()
        if proc.returncode != 0:
            raise SkillError(f"the search failed: {err.decode(errors='replace').strip()[-500:]}")
        return _search_report(target, args, ctx, json.loads(out), cap)


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


def _open_folder(target: _Target) -> int:
    return _open_dir(target, target.parts, hint="; use action \"read\" for a file")


def _entry_line(entry: os.DirEntry, fd: int) -> str:
    name = _q(entry.name)
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return f"{name}  (vanished)"
    if stat.S_ISLNK(st.st_mode):
        return f"{name} -> {_q(os.readlink(entry.name, dir_fd=fd))}  (symbolic link)"
    if stat.S_ISDIR(st.st_mode):
        return f"{name}/"
    if stat.S_ISREG(st.st_mode):
        return f"{name}  {_n(st.st_size, 'byte')}"
    return f"{name}  (special file)"


def _decode_for_edit(target: _Target, data: bytes) -> str:
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        raise SkillError(f"{target.shown()} is a binary file; it cannot be edited as text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Replacing bad bytes and writing back would damage the file; refuse instead.
        raise SkillError(f"{target.shown()} is not valid UTF-8 (at byte {exc.start}); edit it with the "
                         "shell instead") from None


def _check_occurrences(target: _Target, found: int, args: dict[str, Any]) -> None:
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


def _lines_of(text: str, old: str, shown: int = 10) -> str:
    lines, start = [], text.find(old)
    while start != -1 and len(lines) < shown:
        lines.append(str(text.count("\n", 0, start) + 1))
        start = text.find(old, start + len(old))
    return ", ".join(lines) + (", ..." if text.count(old) > shown else "")


def _n(count: int, word: str, words: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else words or word + 's'}"


def _snippet(text: Any) -> str:
    text = str(text or "")
    short = text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."
    return f"{json.dumps(short, ensure_ascii=False)} ({_n(len(text.encode()), 'byte')})"


def _search_options(args: dict[str, Any], ctx: SkillContext) -> tuple[str | None, str | None, int, int]:
    limit = min(args.get("max_results", DEFAULT_SEARCH_RESULTS), MAX_SEARCH_RESULTS)
    cap = ctx.settings.get("max_read_bytes", SEARCH_MAX_FILE_BYTES)
    return args.get("glob") or None, args.get("pattern") or None, limit, cap


def _search_report(target: _Target, args: dict[str, Any], ctx: SkillContext, found: dict[str, Any],
                   cap: int) -> str:
    prefix = "" if target.root.workspace and not target.parts else target.shown() + "/"
    lines = [f"{_q(prefix + path)}:{number}: {line}" if number else _q(prefix + path)
             for path, number, line in found["matches"]]
    count = len(lines)
    ctx.audit.detail = f"search {target.shown()} {count} matches"
    if not lines:
        lines.append(f"no matches below {target.shown()}")
    notes = [f"[{found['visited']} files and folders looked at]"]
    if found["more"]:
        notes.append(f"[more matches exist; showing the first {count}: narrow the search or raise "
                     f"max_results (up to {MAX_SEARCH_RESULTS})]")
    if found["stopped"]:
        notes.append(f"[stopped after {MAX_SEARCH_VISITS} files and folders; search a smaller folder or "
                     "use a glob]")
    if found["binary"] or found["large"]:
        notes.append(f"[skipped {found['binary']} binary files and {found['large']} files over "
                     f"{cap:,} bytes]")
    return "\n".join(lines + notes)
