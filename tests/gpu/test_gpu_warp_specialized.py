"""The warp-specialized GEMM (cuda/warp_specialized.cu, sm_90a) against the non-fused GEMM
stage: bitwise equal M on the plan's own V and U, poisoned output, shapes with row, channel
and column remainders, blocks of two and three consumer warpgroups; and close to float64."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from megawino.core import abi
from megawino.core.spec import LayerSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare_gemm  # noqa: E402

pytestmark = pytest.mark.gpu

# (spec, what it exercises): 64-row remainders of the 128-row tiles, odd and even counts of
# 16-channel sub-tiles (the two partial sums), the 64-column tiles (K = 48) and masked remainders
# of the 128-column tiles (K = 200, 72, 136).
SHAPES = [
    (LayerSpec(N=5, C=48, K=48, H=21, W=19), "192 rows, C = 48, K = 48"),
    (LayerSpec(N=2, C=144, K=200, H=17, W=23), "C = 144, K = 200"),
    (LayerSpec(N=1, C=3, K=72, H=9, W=9), "C = 3 (one sub-tile), K = 72"),
    (LayerSpec(N=2, C=64, K=136, H=13, W=13), "C = 64 (an even count of sub-tiles), K = 136"),
]


def _gemm(warpgroups):
    import cupy as cp
    try:
        return cp, compare_gemm.WarpSpecializedGemm(cp, warpgroups)
    except compare_gemm.NotAvailable as err:
        pytest.skip(str(err))


@pytest.mark.parametrize("warpgroups", [2, 3])
@pytest.mark.parametrize("spec,what", SHAPES, ids=[w for _, w in SHAPES])
def test_bitwise_equal_to_the_nonfused_gemm(spec, what, warpgroups):
    import megawino
    cp, ws = _gemm(warpgroups)
    plan = megawino.plan(spec, algo="nonfused")
    if plan.operand_format != "float32_u_paired":
        pytest.skip(f"the non-fused plan's U is {plan.operand_format}")
    rng = np.random.default_rng(7)
    x = cp.asarray(rng.standard_normal((spec.N, spec.C, spec.H, spec.W)).astype(np.float32))
    w = cp.asarray(rng.standard_normal(spec.weight_shape).astype(np.float32))
    plan(x, w)
    rows = plan.task_layout.tiles_padded
    assert plan.V.shape[1] >= rows
    out = cp.full(plan.M.shape, cp.nan, dtype=cp.float32)
    ws(plan.V, ws.split_u(plan.U), out, rows)
    cp.cuda.get_current_stream().synchronize()
    ws.check_report()
    check = compare_gemm.bitwise_check(cp, out[:, :rows], plan.M[:, :rows])
    assert check["bitwise_mismatches"] == 0, (what, check)
    assert not bool(cp.isnan(out[:, :rows]).any())
    u = abi.filter_matrices(plan.U, plan.operand_format)
    ref = cp.matmul(plan.V[:, :rows].astype(cp.float64), u.astype(cp.float64))
    err = float(cp.linalg.norm(out[:, :rows] - ref) / cp.linalg.norm(ref))
    assert err < 1e-5, (what, err)


def test_a_stuck_barrier_is_reported_not_a_hang():
    """Launched with the producer and one consumer warpgroup only, the empty barriers never
    complete (they wait for both consumers' warps): the kernel must end and say where it stuck."""
    import megawino
    cp, ws = _gemm(2)
    spec = SHAPES[1][0]
    plan = megawino.plan(spec, algo="nonfused")
    if plan.operand_format != "float32_u_paired":
        pytest.skip(f"the non-fused plan's U is {plan.operand_format}")
    x = cp.asarray(np.random.default_rng(3).standard_normal((spec.N, spec.C, spec.H, spec.W)).astype(np.float32))
    w = cp.asarray(np.random.default_rng(4).standard_normal(spec.weight_shape).astype(np.float32))
    plan(x, w)
    ws.threads = 256
    ws(plan.V, ws.split_u(plan.U), cp.zeros_like(plan.M), plan.task_layout.tiles_padded)
    cp.cuda.get_current_stream().synchronize()
    with pytest.raises(RuntimeError, match="stuck: block"):
        ws.check_report()
