"""Compile Triton kernels for the H100/H200 (sm_90) without a GPU: `compile_for_sm90(body)` runs
`body` in a fresh interpreter without TRITON_INTERPRET (the calling test module interprets), where
each kernel launch is replaced by triton's own argument binding and specialisation for a CUDA
target, then triton.compile() down to a cubin (ptxas ships with triton). Catches what the
interpreter lets through and the compiler rejects. The body calls the engine's wrappers as the
engine does, on CPU tensors that are never read; each compile appends the kernel's name to
`compiled` and prints `KERNEL <name> <shared memory bytes>`. Uses triton internals present in 3.6
to 3.9; a triton without them skips the calling test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_PRELUDE = r"""
import os, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime import jit
if not (hasattr(jit, "create_function_from_signature") and hasattr(jit.JITFunction, "_pack_args")):
    print("SKIP triton", triton.__version__, "lacks the internals this check uses"); sys.exit(0)
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
compiled = []

def compile_only(self, *args, grid, warmup, **kwargs):
    kwargs["debug"] = False
    bind = jit.create_function_from_signature(self.signature, self.params, backend)
    bound, specialization, options = bind(*args, **kwargs)
    options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound, specialization, options)
    kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target,
                            options=options.__dict__)
    assert kernel.asm.get("cubin"), self.__name__
    compiled.append(self.__name__)
    print("KERNEL", self.__name__, kernel.metadata.shared)

jit.JITFunction.run = compile_only
"""


def compile_for_sm90(body: str) -> str:
    """The body's stdout; the calling test skips where triton lacks the internals or the backend."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _PRELUDE + body], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    return out.stdout
