"""The Winograd GEMM stage columns of bench/compare.py: the non-fused plan's GEMM kernel alone
(``gemm_ours``) and batched cuBLAS SGEMM on the same shape (``gemm_cublas``), each rotating
among enough operand sets that the L2 holds none of them, with a float64 check of a sample.
Both take the running :class:`compare_backends.Bench` (its CuPy, plans, timing and budget)."""
from __future__ import annotations

from common import NotAvailable, gpu_rel_l2, rotation_sets
from megawino.core import abi
from megawino.core.task_sizes import default_params
from megawino.core.tasks import Layout, TaskType


def gemm_ours(bench, spec, st) -> dict:
    """The non-fused GEMM stage alone, rotating among whole plans (U, V, M each)."""
    cp = bench.cp
    if bench.primary != "megakernel":
        raise NotAvailable("not a Winograd layer")
    plan = st.pop("plan_nonfused", None) or bench._make_plan(spec, "nonfused")
    params = None   # GEMM_OUTPUT tasks keep no M: their layer's stage is the heuristic GEMM graph's
    if getattr(getattr(plan, "params", None), "fused_output", False):
        params = default_params(spec, plan.params.m)
        plan = bench._make_plan(spec, "nonfused", params)
    if getattr(plan, "launch_stage", None) is None:
        raise NotAvailable("the non-fused plan exposes no launch_stage")
    lay = plan.task_layout
    per_set = 4 * lay.alpha2 * (lay.tiles_padded * (lay.c_stride + lay.k_stride) + lay.c_stride * lay.k_stride)
    n = rotation_sets(per_set, bench.l2, min_sets=1, budget_bytes=bench._budget())
    plans = [plan] + [bench._make_plan(spec, "nonfused", params) for _ in range(n - 1)]
    for p in plans:
        p(st["xs"][0], st["w"], check=True)
    sample = min(lay.tiles_padded, 1024)            # rows of position 0 against float64
    u0 = abi.filter_matrices(plan.U, plan.operand_format)[0]     # U in channel order, whatever its format
    ref = cp.matmul(plan.V[0, :sample].astype(cp.float64), u0.astype(cp.float64))
    entry = {"rotation_sets": n, "bytes_per_set": per_set,
             "rel_err_sample_vs_f64": gpu_rel_l2(plan.M[0, :sample], ref)}
    entry.update(bench._time(lambda p: p.launch_stage(TaskType.GEMM), plans))
    return entry

def gemm_cublas(bench, spec, st) -> dict:
    """cuBLAS (cupy.matmul, batched, TF32 off) on the same alpha2 x (T x C)(C x K) shape."""
    cp = bench.cp
    if not spec.winograd_eligible:
        raise NotAvailable("not a Winograd layer")
    lay = Layout(spec, default_params(spec))
    a2, tp, cs, ks = lay.alpha2, lay.tiles_padded, lay.c_stride, lay.k_stride
    per_set = 4 * a2 * (tp * cs + cs * ks + tp * ks)
    n = rotation_sets(per_set, bench.l2, min_sets=1, budget_bytes=bench._budget())
    rng = cp.random.RandomState(bench.args.seed + 7)
    sets = [(rng.standard_normal((a2, tp, cs), dtype=cp.float32),
             rng.standard_normal((a2, cs, ks), dtype=cp.float32),
             cp.empty((a2, tp, ks), dtype=cp.float32)) for _ in range(n)]
    fn = lambda s: cp.matmul(s[0], s[1], out=s[2])  # noqa: E731
    fn(sets[0])
    sample = min(tp, 1024)
    a, bm, c = sets[0]
    ref = cp.matmul(a[0, :sample].astype(cp.float64), bm[0].astype(cp.float64))
    entry = {"rotation_sets": n, "bytes_per_set": per_set,
             "rel_err_sample_vs_f64": gpu_rel_l2(c[0, :sample], ref)}
    entry.update(bench._time(fn, sets))
    return entry
