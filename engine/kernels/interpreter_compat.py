"""Triton interpreter fix for loops over loaded bounds (triton < 3.8 with numpy >= 2.4).

In the interpreter (TRITON_INTERPRET=1) every scalar, a tl.load of one element or a program_id
alike, is a 1-element 1-D numpy array, and `range(start, end, BLOCK)` over such tensors calls
tl.tensor.__index__, which triton 3.6 defines as `int(self.handle.data)`. numpy 2.4 made int() of a
1-D array an error ("only 0-dimensional arrays can be converted to Python scalars", earlier a
DeprecationWarning), so every kernel loop with a runtime bound (decode's partition, the reduce's
parts, prefill's key tiles) fails there: triton-lang/triton#9171, fixed by #9172 (`.squeeze()`),
which triton 3.8 and 3.9 ship.

No rewrite of the kernels avoids it and compiles the same: every runtime scalar is such an array in
that interpreter, so a range over any of them fails, and the ways around it change the compiled
kernel (a `while` loop is not software-pipelined, a constexpr bound recompiles per length, a
reduction to a 0-d value adds ops). The fix goes into the interpreter instead: the same
`__index__` as triton's own fix, installed only under TRITON_INTERPRET and only for triton < 3.8.
Compiled kernels never reach this code; on 3.8+ or a GPU run nothing is patched.
"""

from __future__ import annotations

import os

_FIXED_IN = (3, 8)  # first release checked to carry triton-lang/triton#9172


def fix_interpreter_index() -> None:
    """Idempotent. A no-op without TRITON_INTERPRET (triton reads it when it wraps a kernel, and our
    callers wrap right after), on triton >= 3.8, or where the private hook is missing."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return
    import triton

    if _version(triton.__version__) >= _FIXED_IN:
        return
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_squeezes_index", False):
        return

    scope_type = getattr(interpreter, "_LangPatchScope", ())

    def _patch_lang_tensor(tensor, *args, **kwargs):  # the interpreter calls it at every launch
        original(tensor, *args, **kwargs)
        if args and isinstance(args[0], scope_type):  # 3.6: undone by the launch's scope.restore()
            args[0].set_attr(tensor, "__index__", _index)
        else:  # older releases set it directly, for good
            tensor.__index__ = _index

    _patch_lang_tensor._squeezes_index = True
    interpreter._patch_lang_tensor = _patch_lang_tensor


def _index(self) -> int:
    return int(self.handle.data.squeeze())  # triton-lang/triton#9172


def _version(text: str) -> tuple[int, int]:
    major, minor = (text.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
