"""Search below a folder for the files skill: walking the tree by descriptor, matching file names and
lines, and running regular expressions in a child process the daemon can kill.

The folder comes in as a descriptor already opened safely (file_paths.open_folder); nothing here
resolves paths or follows symlinks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from sandbox.fs_identity import acting_as
from skills.base import SkillError
from skills.fileio import DIR_FLAGS, FILE_FLAGS, pread_all

BINARY_SNIFF_BYTES = 8192  # a NUL in the first 8 KiB means binary, as git and grep decide
MAX_SEARCH_VISITS = 5000  # files and folders looked at by one search
MAX_LINE_CHARS = 200  # of a matching line, in search results
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
# The child's start (an interpreter and this package's imports: 0.1 s idle, over 1 s on a loaded
# machine) is not the pattern's time, so the wall limit counts from the line the child writes once
# it is ready; the start has its own bound, far above any start, and well inside the executor's
# limit on the whole call (agent.tool_timeout_s, 60 s by default), which would abandon the call
# saying that what it started may still run.
READY_LINE = "ready\n"
CHILD_START_S = 15
# All the search child is given of the daemon's environment, whose other variables hold bot tokens
# and store passwords. It runs no programs and, started with -I, reads no PYTHON* variable; the
# locale keeps its file names decoded as the daemon's are, and LD_LIBRARY_PATH is for a Python that
# finds its libpython only through it.
CHILD_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LD_LIBRARY_PATH")


def search_tree(dir_fd: int, glob: str | None, pattern: str | None, regex: bool, max_results: int,
                max_file_bytes: int) -> dict[str, Any]:
    """Matches below the folder `dir_fd`: (relative path, line number or 0, line). Folders are
    opened by descriptor with O_NOFOLLOW (a symlinked folder is never entered) and files with
    O_NOFOLLOW; folders and files in name order, each folder's files before its subfolders."""
    found = {"matches": [], "visited": 0, "binary": 0, "large": 0, "stopped": False, "more": False}
    if pattern is None:
        matcher = None
    elif regex:
        matcher = re.compile(pattern).search
    else:
        def matcher(line: str) -> bool:
            return pattern in line
    _search_folder(dir_fd, "", found, glob, matcher, max_results, max_file_bytes)
    return found


def _search_folder(fd: int, prefix: str, found: dict[str, Any], glob: str | None, matcher: Any,
                   max_results: int, max_file_bytes: int) -> bool:
    """search_tree's work in the folder `fd` (named `prefix` from the top); False once it must stop."""
    matches: list[tuple[str, int, str]] = found["matches"]
    found["visited"] += 1
    if found["visited"] > MAX_SEARCH_VISITS:
        found["stopped"] = True
        return False
    files, folders = _entries(fd, MAX_SEARCH_VISITS - found["visited"] + 1)
    for name in files:
        found["visited"] += 1
        if found["visited"] > MAX_SEARCH_VISITS:
            found["stopped"] = True
            return False
        rel = prefix + name
        if glob and not fnmatchcase(rel if "/" in glob else name, glob):
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue  # links, pipes: never followed or opened
        lines = iter([(0, "")]) if matcher is None else _matching_lines(fd, name, st, matcher,
                                                                        max_file_bytes, found)
        for number, line in lines:
            if len(matches) == max_results:
                found["more"] = True
                return False
            matches.append((rel, number, line))
    for name in folders:
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except OSError:  # gone, unreadable, or a symlink put there since it was listed
            continue
        try:
            if not _search_folder(child, f"{prefix}{name}/", found, glob, matcher, max_results,
                                  max_file_bytes):
                return False
        finally:
            os.close(child)
    return True


def _entries(fd: int, most: int) -> tuple[list[str], list[str]]:
    """(files, folders) of the folder `fd`, each sorted by name, from at most `most` of its entries:
    a search looks at MAX_SEARCH_VISITS in all, so a folder of a million is not read whole."""
    files, folders = [], []
    with os.scandir(fd) as entries:
        for entry in itertools.islice(entries, max(most, 0)):
            (folders if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
    return sorted(files), sorted(folders)


def _matching_lines(fd: int, name: str, st: os.stat_result, matcher: Any, max_file_bytes: int,
                    found: dict[str, Any]) -> Iterator[tuple[int, str]]:
    """The file's matching lines, one at a time: the caller stops at max_results, so a file of a
    million matching lines costs no more than the matches it reports."""
    if st.st_size > max_file_bytes:
        found["large"] += 1
        return
    try:
        file_fd = os.open(name, os.O_RDONLY | FILE_FLAGS, dir_fd=fd)
    except OSError:
        return
    try:
        data = pread_all(file_fd, max_file_bytes, 0)
    finally:
        os.close(file_fd)
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        found["binary"] += 1
        return
    for number, line in enumerate(_lines(data), 1):
        if matcher(line):
            yield number, line[:MAX_LINE_CHARS]


def _lines(data: bytes) -> Iterator[str]:
    """The file's lines as editors, grep and the edit action number them: only "\n" ends one (a
    CRLF's CR is dropped). str.splitlines would also split at form feeds, lone CRs and U+2028,
    and every line number after one would be off. One at a time, not a list of them all."""
    text = data.decode("utf-8", errors="replace")
    start = 0
    while start < len(text):  # the text after the final newline is no line of its own
        end = text.find("\n", start)
        end = len(text) if end == -1 else end
        yield text[start:end].removesuffix("\r")
        start = end + 1


def search_child_main() -> None:
    """Entry point of the child process a regex search runs in (see search_in_child)."""
    job = json.load(sys.stdin)
    sys.stdout.write(READY_LINE)  # the wall-clock limit starts here, not at the interpreter's start
    sys.stdout.flush()
    with acting_as(job["uid"]):  # as the files skill's own threads do: see files._as_user
        found = search_tree(job["fd"], job["glob"], job["pattern"], True, job["max_results"],
                            job["max_file_bytes"])
    json.dump(found, sys.stdout)


_CHILD_CODE = ("import sys; sys.path.insert(0, {root!r}); "
               "from skills.builtin.file_search import search_child_main; search_child_main()")


def _child_env() -> dict[str, str]:
    return {key: os.environ[key] for key in CHILD_ENV_KEYS if key in os.environ}


async def search_in_child(fd: int, glob: str | None, pattern: str, max_results: int, max_file_bytes: int,
                          wall: float, uid: int) -> dict[str, Any]:
    """search_tree with `pattern` as a regular expression. A regular expression can backtrack for
    minutes, holding the GIL (so the whole daemon), and cannot be interrupted; it runs in a child
    process, handed the checked folder's descriptor `fd` (which stays the caller's to close), and is
    killed at `wall` seconds (the role's wall-clock limit)."""
    proc = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", _CHILD_CODE.format(root=PROJECT_ROOT),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, pass_fds=(fd,), env=_child_env())
        job = {"fd": fd, "glob": glob, "pattern": pattern, "max_results": max_results,
               "max_file_bytes": max_file_bytes, "uid": uid}
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can lose a /stop that comes as
        # the child answers.
        try:
            async with asyncio.timeout(CHILD_START_S):
                ready = await proc.stdout.readline()
        except TimeoutError:
            raise SkillError(f"the search could not start within {CHILD_START_S:g} s") from None
        try:
            async with asyncio.timeout(wall):
                out, err = await proc.communicate()
        except TimeoutError:
            raise SkillError(f"the regular expression search did not finish within {wall:g} s (the "
                             "pattern may backtrack heavily); simplify it, or search plain "
                             "text") from None
    finally:
        if proc is not None and proc.returncode is None:  # timed out, or we were cancelled
            proc.kill()
            await proc.wait()
    if proc.returncode != 0 or ready != READY_LINE.encode():
        raise SkillError(f"the search failed: {err.decode(errors='replace').strip()[-500:]}")
    return json.loads(out)
