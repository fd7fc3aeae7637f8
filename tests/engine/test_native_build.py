"""The native-kernel builder: builds once, reuses the cache, runs OpenMP on torch's runtime, and
reports a failed build instead of raising into the engine."""

import ctypes
import logging
import textwrap

import pytest
import torch

from engine.native import build

SOURCE = textwrap.dedent("""
    #include <omp.h>
    extern "C" int threads() {
        int n = 0;
        #pragma omp parallel
        {
            #pragma omp single
            n = omp_get_num_threads();
        }
        return n;
    }
    extern "C" void add_one(float* x, long n) { for (long i = 0; i < n; ++i) x[i] += 1.0f; }
""")

needs_compiler = pytest.mark.skipif(build.compiler() is None, reason="no C++ compiler here")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCLAW_KERNEL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@needs_compiler
def test_a_source_builds_once_and_its_functions_work_on_tensors(tmp_path, cache):
    source = tmp_path / "probe.cpp"
    source.write_text(SOURCE)
    library = ctypes.CDLL(str(build.build(source)))
    library.add_one.argtypes = (ctypes.c_void_p, ctypes.c_long)
    x = torch.zeros(5)
    library.add_one(build.address(x), x.numel())
    assert x.tolist() == [1.0] * 5
    # The second build finds the library in the cache: the same file, not written again.
    built = list(cache.glob("probe-*.so"))
    assert len(built) == 1
    written = built[0].stat().st_mtime_ns
    assert build.build(source) == built[0]
    assert built[0].stat().st_mtime_ns == written


@needs_compiler
def test_openmp_in_a_built_library_follows_torchs_thread_count(tmp_path, cache):
    source = tmp_path / "probe.cpp"
    source.write_text(SOURCE)
    library = ctypes.CDLL(str(build.build(source)))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert library.threads() == 1
        torch.set_num_threads(2)
        assert library.threads() == 2
    finally:
        torch.set_num_threads(before)


@needs_compiler
def test_a_changed_source_is_built_again(tmp_path, cache):
    source = tmp_path / "probe.cpp"
    source.write_text(SOURCE)
    first = build.build(source)
    source.write_text(SOURCE + "\nextern \"C\" int two() { return 2; }\n")
    second = build.build(source)
    assert first != second and second.exists()
    assert ctypes.CDLL(str(second)).two() == 2


@needs_compiler
def test_a_source_that_does_not_compile_says_why(tmp_path, cache):
    source = tmp_path / "broken.cpp"
    source.write_text("this is not C++;\n")
    with pytest.raises(build.BuildError, match="broken.cpp"):
        build.build(source)
    assert not list(cache.glob("*.so")), "no half-built library is left in the cache"


def test_load_gives_none_and_logs_when_no_compiler_is_found(cache, monkeypatch, caplog):
    monkeypatch.setattr(build, "compiler", lambda: None)
    build.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="engine.native.build"):
            assert build.load("no_such_kernels") is None
    finally:
        build.load.cache_clear()
    assert "no C++ compiler" in caplog.text


def test_native_kernels_can_be_turned_off(cache, monkeypatch):
    monkeypatch.setenv(build.DISABLE, "0")
    build.load.cache_clear()
    try:
        assert build.load("anything") is None
    finally:
        build.load.cache_clear()


def test_address_refuses_a_strided_view():
    with pytest.raises(ValueError, match="contiguous"):
        build.address(torch.zeros(4, 4).t())
