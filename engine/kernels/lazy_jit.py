"""Triton kernels wrapped on first use, not at import: without a GPU (and without the interpreter)
importing and wrapping triton fails ("0 active drivers"), and the CPU never needs it.

A kernel module keeps `tl = None` at module level (its kernel sources name `tl`), and asks
`jitted(globals(), kernel)` for the wrapped kernel at launch. The wrap is made once per
TRITON_INTERPRET value, because triton reads that variable when it wraps.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any


def jitted(module_globals: dict[str, Any], kernel: Callable) -> Any:
    return _jit(kernel, os.environ.get("TRITON_INTERPRET", ""), module_globals["__name__"])


@functools.cache
def _jit(kernel: Callable, interpret_flag: str, module: str) -> Any:
    import sys

    import triton
    import triton.language

    from engine.kernels.interpreter_compat import fix_interpreter_index

    fix_interpreter_index()  # for any loop over a runtime bound under triton < 3.8's interpreter
    sys.modules[module].tl = triton.language  # the name the kernel source uses
    return triton.jit(kernel)
