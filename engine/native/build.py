"""Builds a C++ source of this folder into a shared library once per machine, and loads it.

Plain C++ with OpenMP, no torch or Python headers: a build takes a second or two (torch's
extension builder took 30 s per source here) and needs only a compiler, not Python's headers.
The library is loaded after torch, so its OpenMP calls run on torch's own runtime (the same
`libgomp.so.1`) and obey `torch.set_num_threads`. Built with `-march=native`, so the cache key
holds the CPU's flags beside the source and the compiler; a library built on another CPU is
never loaded."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch  # noqa: F401  # loaded first: its libgomp is the one our libraries bind to

SOURCES = Path(__file__).resolve().parent
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
DISABLE = "OPENCLAW_CPU_KERNELS"

log = logging.getLogger(__name__)


class BuildError(RuntimeError):
    """A source did not build; the message holds the compiler's complaint."""


def cache_dir() -> Path:
    """Where built libraries live: $OPENCLAW_KERNEL_CACHE, else the user's cache folder."""
    if os.environ.get("OPENCLAW_KERNEL_CACHE"):
        return Path(os.environ["OPENCLAW_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "openclaw" / "kernels"


def compiler() -> str | None:
    """$CXX, else the first of g++, c++, clang++ on PATH."""
    if os.environ.get("CXX"):
        return shutil.which(os.environ["CXX"])
    return next(filter(None, map(shutil.which, ("g++", "c++", "clang++"))), None)


@functools.cache
def cpu_flags() -> str:
    """The CPU's feature flags (what -march=native compiles for); empty where /proc says nothing."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


@functools.cache
def compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def build(source: Path) -> Path:
    """The shared library of `source`, built into the cache unless already there. Raises
    BuildError with the compiler's output when it fails."""
    cxx = compiler()
    if cxx is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    key = hashlib.sha256(b"\0".join((source.read_bytes(), " ".join(FLAGS).encode(),
                                     compiler_version(cxx).encode(), cpu_flags().encode())))
    target = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: a reader never sees half a library, and two
    # processes building at once each finish their own and the last rename wins.
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{source.stem}-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, str(source), "-o", partial],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BuildError(f"{cxx} failed on {source.name}:\n{done.stderr.strip()[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The library built from `<name>.cpp` in this folder, or None (logged once, with the reason)
    when native kernels are off or it cannot be built: the caller then uses its torch path."""
    if os.environ.get(DISABLE, "1") == "0":
        return None
    try:
        return ctypes.CDLL(str(build(SOURCES / f"{name}.cpp")))
    except (BuildError, OSError) as exc:
        log.warning("native CPU kernels %r unavailable, using the torch path: %s", name, exc)
        return None


def address(tensor: torch.Tensor) -> int:
    """A contiguous tensor's data address, for a ctypes argument declared c_void_p."""
    if not tensor.is_contiguous():
        raise ValueError("native kernels take contiguous tensors")
    return tensor.data_ptr()
