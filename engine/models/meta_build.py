"""Build a model's modules on the meta device without running their random init.

On meta, `nn.init.normal_` and its kin go through torch's Python reference ops, whose first use
imports torch._dynamo: 1.5-4 s of every start for values the checkpoint overwrites anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

M = TypeVar("M", bound=nn.Module)


class _SkipInit(TorchFunctionMode):
    """Turns every `torch.nn.init` function into a no-op (they dispatch to torch-function modes
    themselves); anything else runs as it would. Modes are per thread: other threads unaffected."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


def build_on_meta(build: Callable[[], M]) -> M:
    """`build()`'s module with every parameter on the meta device, not initialised: it is to be
    materialised (`to_empty`) and every value loaded."""
    with torch.device("meta"), _SkipInit():
        return build()
