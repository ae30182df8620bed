"""Compile options of the Winograd modules (CPU only: nothing is compiled or launched)."""
from __future__ import annotations

import re

import pytest

import megawino
from megawino.gpu import nvrtc
from megawino.core.spec import LayerSpec


@pytest.mark.parametrize("gemm_math, tf32x3, bf16x3", [("3xtf32", 1, 0), ("ffma", 0, 0), ("bf16x3", 0, 1)])
def test_gemm_math_sets_the_cuda_defines(gemm_math, tf32x3, bf16x3, monkeypatch):
    monkeypatch.delenv(nvrtc.EXTRA_DEFINES_ENV, raising=False)
    opts = nvrtc.compile_options(4, "NCHW", False, gemm_math)
    assert [o for o in opts if o.startswith("-DMW_GEMM_")] == [f"-DMW_GEMM_TF32X3={tf32x3}",
                                                              f"-DMW_GEMM_BF16X3={bf16x3}"]


def test_default_gemm_math_is_3xtf32(monkeypatch):
    monkeypatch.delenv(nvrtc.EXTRA_DEFINES_ENV, raising=False)
    assert "-DMW_GEMM_TF32X3=1" in nvrtc.compile_options(4, "NCHW", False)


def test_extra_defines_are_appended(monkeypatch):
    monkeypatch.setenv(nvrtc.EXTRA_DEFINES_ENV, "-DMW_FOO -DMW_MEGA_MIN_BLOCKS=1")
    opts = nvrtc.compile_options(2, "NHWC", True, "3xtf32")
    assert opts[-2:] == ("-DMW_FOO", "-DMW_MEGA_MIN_BLOCKS=1")
    assert "-DMW_M=2" in opts and "-DMW_NHWC=1" in opts and "-DMW_TRACE" in opts


def test_owned_defines_come_from_compile_options(monkeypatch):
    monkeypatch.delenv(nvrtc.EXTRA_DEFINES_ENV, raising=False)
    traced = {nvrtc.define_name(o) for o in nvrtc.compile_options(4, "NCHW", True)} - {None}
    assert nvrtc.owned_defines() == traced | nvrtc.SOURCE_DEFINES
    assert {"MW_M", "MW_NHWC", "MW_TRACE", "MW_GEMM_TF32X3", "MW_GEMM_BF16X3"} <= nvrtc.owned_defines()
    # every owned define tells the user what to use instead
    assert nvrtc.owned_defines() <= set(nvrtc.OWNED_DEFINE_HINTS)


@pytest.mark.parametrize("option, hint", [
    ("-DMW_NHWC=1", "layout"),          # an NCHW plan would read x as NHWC: wrong results
    ("-DMW_M=2", "TaskParams"),         # an m=4 graph with an m=2 kernel: wrong results
    ("-DMW_TRACE", "trace=True"),       # tracing without a trace buffer writes through null
    ("-DMW_GEMM_TF32X3=0", "gemm_math"),
    ("-DMW_SOURCE_HASH=0", "kernel cache"),
    ("-DMW_NONFUSED_MODULE=1", "nonfused.cu"),   # a megakernel writing the non-fused module's U format
])
def test_owned_defines_are_refused(option, hint, monkeypatch):
    monkeypatch.setenv(nvrtc.EXTRA_DEFINES_ENV, f"-DMW_FOO {option}")
    name = option[2:].partition("=")[0]
    with pytest.raises(ValueError, match=rf"{nvrtc.EXTRA_DEFINES_ENV}: {option} sets {name}, "
                                         rf"which the runtime defines itself; use .*{hint}"):
        nvrtc.compile_options(4, "NCHW", False)
    with pytest.raises(ValueError, match=name):
        nvrtc.extra_defines()
    with pytest.raises(ValueError, match=name):    # before CuPy is imported or anything compiles
        nvrtc.module("megakernel", 4, "NCHW")


@pytest.mark.parametrize("bad", ["MW_FOO", "-D", "-D=1", "-D1X", "-DMW-FOO", "-UMW_FOO", "-O3",
                                 "--DMW_FOO"])
def test_malformed_extra_defines_are_refused(bad, monkeypatch):
    monkeypatch.setenv(nvrtc.EXTRA_DEFINES_ENV, f"-DMW_OK=1 {bad}")
    with pytest.raises(ValueError, match=r"-DNAME or -DNAME=VALUE options only, got " + re.escape(bad)):
        nvrtc.extra_defines()


def test_with_defines_refuses_owned_names():
    base = nvrtc.compile_options(4, "NCHW", False)
    assert nvrtc.with_defines(base, ("-DMW_X=3",)) == base + ("-DMW_X=3",)
    with pytest.raises(ValueError, match="MW_GEMM_TF32X3"):
        nvrtc.with_defines(base, ("-DMW_GEMM_TF32X3=0",))


@pytest.mark.parametrize("bad", ["tf32", "FFMA", None, 1])
def test_bad_gemm_math_is_a_value_error_before_any_launch(bad):
    with pytest.raises(ValueError, match="gemm_math"):
        nvrtc.check_gemm_math(bad)
    with pytest.raises(ValueError, match="gemm_math"):
        megawino.plan(LayerSpec(1, 8, 8, 8, 8), gemm_math=bad)
    with pytest.raises(ValueError, match="gemm_math"):
        nvrtc.module("megakernel", 4, "NCHW", gemm_math=bad)


@pytest.mark.parametrize("c_stride, entry", [(8, 0), (32, 0), (40, 1), (64, 1), (96, 2), (128, 3), (4096, 3)])
def test_gemm_smem_bytes_picks_the_depth_entry(c_stride, entry, monkeypatch):
    """A launch takes the module's entry for the GEMM's k tiles: ceil(c_stride / k per tile), the
    last entry for every depth beyond it (the module's values are faked: nothing is compiled)."""
    table = {"mw_gemm_smem_bytes_by_k_tiles": [40960, 65536, 90112, 90112], "mw_gemm_k_per_tile": [32]}
    monkeypatch.setattr(nvrtc, "module_ints", lambda mod, name, count: table[name][:count])
    assert nvrtc.gemm_smem_bytes(object(), c_stride) == table["mw_gemm_smem_bytes_by_k_tiles"][entry]
