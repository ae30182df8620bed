"""cuda/warp_specialized.cu compiles with nvcc for sm_90a into the warp-specialized kernel it
claims (register reallocation, mbarriers, m64n128k8 warpgroup MMAs) without local memory, and
for sm_80 into the kernel that only reports it cannot run.  CPU only; skipped without nvcc."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from megawino.core.resources import cuda_dir

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
SOURCE = cuda_dir() / "warp_specialized.cu"


def _nvcc(tmp_path, arch: str, kind: str, warpgroups: int = 2) -> subprocess.CompletedProcess:
    out = tmp_path / f"ws.{kind}"
    return subprocess.run([NVCC, f"-arch={arch}", f"-{kind}", "-Xptxas", "-v", "-I", str(cuda_dir()), "-o", str(out),
                           f"-DWS_CONSUMER_WARPGROUPS={warpgroups}", str(SOURCE)], capture_output=True, text=True, check=True)


@pytest.mark.parametrize("warpgroups", [2, 3])
def test_sm90a_cubin_has_no_spills(tmp_path, warpgroups):
    log = _nvcc(tmp_path, "sm_90a", "cubin", warpgroups).stderr
    assert "mw_gemm_warp_specialized_kernel" in log
    frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
    assert frames and all(f == ("0", "0", "0") for f in frames), log


def test_sm90a_ptx_is_warp_specialized(tmp_path):
    _nvcc(tmp_path, "sm_90a", "ptx")
    ptx = (tmp_path / "ws.ptx").read_text()
    for needle in ("setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32", "mbarrier.try_wait.parity",
                   "cp.async.cg.shared.global", "cp.async.mbarrier.arrive.noinc.shared::cta.b64"):
        assert needle in ptx, needle
    # A from registers (four), B from a shared-memory descriptor; 128- and 64-column tiles.
    for n in (128, 64):
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k8\.f32\.tf32\.tf32 \{{[^}}]*\}}, \{{%r\d+, %r\d+, %r\d+, %r\d+\}}, %rd\d+", ptx), n
    dec = int(re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32 (\d+)", ptx).group(1))
    inc = int(re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32 (\d+)", ptx).group(1))
    assert 128 * dec + 256 * inc <= 65536 and inc >= 200, (dec, inc)   # two consumer warpgroups


def test_sm80_builds_the_reporting_kernel(tmp_path):
    _nvcc(tmp_path, "sm_80", "ptx")
    ptx = (tmp_path / "ws.ptx").read_text()
    assert "mw_gemm_warp_specialized_kernel" in ptx and "wgmma" not in ptx and "setmaxnreg" not in ptx
