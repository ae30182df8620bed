"""Every cuda/*.cu compiles standalone with nvcc for sm_90, and no kernel uses local memory
(no spills, no stack frame).  CPU only; skipped without nvcc."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from megawino.core.resources import cuda_dir

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

SOURCES = sorted(p.name for p in cuda_dir().glob("*.cu"))
VARIANTS = [("-DMW_M=4",), ("-DMW_M=2",), ("-DMW_M=4", "-DMW_TRACE"),   # NCHW: the lanes input map
            ("-DMW_M=2", "-DMW_NHWC=1"), ("-DMW_M=4", "-DMW_NHWC=1", "-DMW_TRACE"),
            ("-DMW_M=4", "-DMW_GEMM_TF32X3=0"), ("-DMW_M=2", "-DMW_NHWC=1", "-DMW_GEMM_TF32X3=0"),  # FFMA GEMM
            ("-DMW_M=2", "-DMW_GEMM_TF32X3=0", "-DMW_TRACE"),
            ("-DMW_M=4", "-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=1"),   # the TF32-grade BF16x3 GEMM
            ("-DMW_M=2", "-DMW_NHWC=1", "-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=1")]


# The architecture-specific sm_90a build the runtime makes on an H100 (warpgroup-MMA GEMM).
SM90A = ("-gencode=arch=compute_90a,code=sm_90a",)
VARIANTS += [SM90A + ("-DMW_M=4",), SM90A + ("-DMW_M=2", "-DMW_NHWC=1"), SM90A + ("-DMW_M=4", "-DMW_TRACE"),
             SM90A + ("-DMW_M=4", "-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=1"),   # split operands
             SM90A + ("-DMW_M=2", "-DMW_NHWC=1", "-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=1")]


def _ptxas_report(source: str, defines, tmp_path) -> dict[str, tuple[int, int, int]]:
    """function -> (stack frame, spill stores, spill loads) bytes."""
    out = tmp_path / (source + ".cubin")
    arch = () if any(d.startswith("-gencode") for d in defines) else ("-arch=sm_90",)
    cmd = [NVCC, *arch, "-cubin", "-Xptxas", "-v", "-I", str(cuda_dir()), *defines,
           str(cuda_dir() / source), "-o", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stderr}"
    report = {}
    current = None
    for line in (res.stdout + res.stderr).splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            report[current] = tuple(int(v) for v in m.groups())
            current = None
    return report


def test_sources_found():
    assert "megakernel.cu" in SOURCES and "nonfused.cu" in SOURCES


@pytest.mark.parametrize("defines", VARIANTS, ids=lambda d: " ".join(d))
@pytest.mark.parametrize("source", SOURCES)
def test_compiles_without_spills(source, defines, tmp_path):
    report = _ptxas_report(source, defines, tmp_path)
    assert report, f"no ptxas report for {source}"
    for fn, (stack, spill_st, spill_ld) in report.items():
        assert spill_st == 0 and spill_ld == 0, f"{fn} spills ({spill_st} B stores, {spill_ld} B loads)"
        assert stack == 0, f"{fn} uses a {stack}-byte stack frame (local memory)"


def test_params_struct_is_generated_from_abi():
    from megawino.core import abi
    text = (cuda_dir() / "generated_tasks.cuh").read_text()
    body = text[text.index("struct Params"):]
    body = body[body.index("{") + 1:body.index("};")]
    members = [ln.split("//")[0].strip() for ln in body.splitlines()]
    members = [m for m in members if m]
    assert members == [f"long long {name};" for name, _ in abi.PARAM_FIELDS]
    assert abi.STATE_WORDS >= abi.state_offset("STATUS") + len(abi.STATUS_FIELDS)


@pytest.mark.parametrize("source", ["megakernel.cu", "nonfused.cu"])
def test_sm90a_build_uses_wgmma(source, tmp_path):
    """The sm_90a build's GEMM is on warpgroup MMAs (and says so in mw_gemm_wgmma); sm_90's is not."""
    def ptx(arch):
        out = tmp_path / f"{source}.{arch[-1][-3:]}.ptx"
        cmd = [NVCC, *arch, "-ptx", "-I", str(cuda_dir()), str(cuda_dir() / source), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stderr}"
        return out.read_text()
    wgmma, plain = ptx(SM90A), ptx(("-arch=sm_90",))
    assert "wgmma.mma_async" in wgmma and "mw_gemm_wgmma = 1" in wgmma
    assert "wgmma.mma_async" not in plain and re.search(r"\.u32 mw_gemm_wgmma( = 0)?;", plain)


@pytest.mark.parametrize("source", ["megakernel.cu", "nonfused.cu"])
def test_sm90a_bf16x3_build_multiplies_split_operands(source, tmp_path):
    """The sm_90a BF16x3 build runs BF16 warpgroup MMAs on split operands (mw_split_operands = 1:
    the transforms store BF16 parts); its sm_90 build keeps float32 operands and mma.sync."""
    def ptx(arch):
        out = tmp_path / f"{source}.{arch[-1][-3:]}.ptx"
        cmd = [NVCC, *arch, "-ptx", "-I", str(cuda_dir()), "-DMW_GEMM_TF32X3=0", "-DMW_GEMM_BF16X3=1",
               str(cuda_dir() / source), "-o", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stderr}"
        return out.read_text()
    split, plain = ptx(SM90A), ptx(("-arch=sm_90",))
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in split and "mw_split_operands = 1" in split
    assert "st.global.b16" in split
    assert "wgmma.mma_async" not in plain and re.search(r"\.u32 mw_split_operands( = 0)?;", plain)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in plain


# The diagnostic builds (timed with bench/ab.py; wrong outputs by design) keep compiling.
DIAGNOSTIC_VARIANTS = [SM90A + ("-DMW_M=4", "-DMW_GEMM_FREE=2"), SM90A + ("-DMW_M=4", "-DMW_TRANSFORMS_FREE"),
                       SM90A + ("-DMW_M=4", "-DMW_NHWC=1", "-DMW_GEMM_FREE=1", "-DMW_TRANSFORMS_FREE")]


@pytest.mark.parametrize("defines", DIAGNOSTIC_VARIANTS, ids=lambda d: " ".join(d[1:]))
@pytest.mark.parametrize("source", ["megakernel.cu", "nonfused.cu"])
def test_diagnostic_builds_compile(source, defines, tmp_path):
    assert _ptxas_report(source, defines, tmp_path), f"no ptxas report for {source}"
