"""File work done in the daemon as a principal's sandbox uid, so the kernel checks it as it checks
the sandboxed shell's.

The files skill reads and writes in the daemon's own threads. When the daemon is root, root's
override of file permissions would let it read what the user's commands cannot (/etc/shadow under a
read-only /etc, another user's 0600 file in a shared folder). `acting_as(uid)` makes the calling
thread's filesystem identity that uid (fsuid and fsgid, no supplementary groups) for the work inside
it, and then restores root's. Linux keeps these per thread: setfsuid and setfsgid only ever change
the caller, and setgroups is made as a raw system call, because glibc's wrapper changes every thread
of the process. `as_daemon()` steps back to the daemon's identity inside, for opening the admin's
folder itself (its parents, a 0700 home or data folder, are not the user's to walk).

When the daemon is not root, both do nothing: its commands run as its own uid, and so does this.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import threading
from collections.abc import Iterator

_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())
_libc = ctypes.CDLL(None, use_errno=True)
_state = threading.local()  # .uid: the identity this thread acts as now (None: the daemon's)


class IdentityError(OSError):
    """The thread's filesystem identity could not be changed (or changed back)."""


def _setgroups(groups: list[int]) -> None:
    if _SYS_SETGROUPS is None:
        raise IdentityError(f"no setgroups system call number for {platform.machine()}")
    array = (ctypes.c_uint * len(groups))(*groups)
    if _libc.syscall(_SYS_SETGROUPS, len(groups), array if groups else None) != 0:
        raise IdentityError(ctypes.get_errno(), "setgroups (this thread only) failed")


def _set_fs_ids(uid: int, gid: int) -> None:
    # setfsuid/setfsgid report no error; each returns the previous value, so read the new one back.
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    if _libc.setfsuid(-1) != uid or _libc.setfsgid(-1) != gid:
        raise IdentityError(f"could not take filesystem uid {uid} / gid {gid} in this thread")


def _switch(uid: int | None) -> None:
    """Act as `uid` from now on (None: the daemon's own identity, with its groups)."""
    if uid is None:  # the daemon's ids first: CAP_SETGID is usable again only then
        _set_fs_ids(os.geteuid(), os.getegid())
        _setgroups(_state.groups)
    else:
        _setgroups([])
        _set_fs_ids(uid, uid)
    _state.uid = uid


def _acting() -> int | None:
    return getattr(_state, "uid", None)


@contextlib.contextmanager
def _as(uid: int | None) -> Iterator[None]:
    before = _acting()
    if before == uid:
        yield
        return
    if before is None:
        _state.groups = os.getgroups()
    try:
        _switch(uid)
        yield
    finally:
        try:
            _switch(before)
        except IdentityError:
            # This thread cannot get back the identity it had: it must not run anything else
            # (a pool would hand it the next job with the wrong credentials).
            os.abort()


def acting_as(uid: int) -> contextlib.AbstractContextManager[None]:
    """File work in this block is the kernel's business as `uid` (gid the same number), when the
    daemon is root; nothing changes otherwise."""
    return _as(uid) if os.geteuid() == 0 else contextlib.nullcontext()


def as_daemon() -> contextlib.AbstractContextManager[None]:
    """The daemon's own identity inside `acting_as`: for what the admin, not the user, opens."""
    return _as(None)
