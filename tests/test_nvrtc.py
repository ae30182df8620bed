"""Compile options of the Winograd modules (CPU only: nothing is compiled or launched)."""
from __future__ import annotations

import pytest

import megawino
from megawino import nvrtc
from megawino.spec import LayerSpec


@pytest.mark.parametrize("gemm_math, value", [("3xtf32", 1), ("ffma", 0)])
def test_gemm_math_sets_the_cuda_define(gemm_math, value, monkeypatch):
    monkeypatch.delenv(nvrtc.EXTRA_DEFINES_ENV, raising=False)
    opts = nvrtc.compile_options(4, "NCHW", False, gemm_math)
    assert [o for o in opts if o.startswith("-DMW_GEMM_TF32X3")] == [f"-DMW_GEMM_TF32X3={value}"]


def test_default_gemm_math_is_3xtf32(monkeypatch):
    monkeypatch.delenv(nvrtc.EXTRA_DEFINES_ENV, raising=False)
    assert "-DMW_GEMM_TF32X3=1" in nvrtc.compile_options(4, "NCHW", False)


def test_extra_defines_replace_same_name(monkeypatch):
    monkeypatch.setenv(nvrtc.EXTRA_DEFINES_ENV, "-DMW_GEMM_TF32X3=0 -DMW_FOO")
    opts = nvrtc.compile_options(2, "NHWC", True, "3xtf32")
    assert [o for o in opts if o.startswith("-DMW_GEMM_TF32X3")] == ["-DMW_GEMM_TF32X3=0"]
    assert opts[-1] == "-DMW_FOO" and "-DMW_M=2" in opts and "-DMW_TRACE" in opts


@pytest.mark.parametrize("bad", ["tf32", "FFMA", None, 1])
def test_bad_gemm_math_is_a_value_error_before_any_launch(bad):
    with pytest.raises(ValueError, match="gemm_math"):
        nvrtc.check_gemm_math(bad)
    with pytest.raises(ValueError, match="gemm_math"):
        megawino.plan(LayerSpec(1, 8, 8, 8, 8), gemm_math=bad)
    with pytest.raises(ValueError, match="gemm_math"):
        nvrtc.module("megakernel", 4, "NCHW", gemm_math=bad)
