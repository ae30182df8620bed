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

def _batched_shape(bench, spec):
    """The heuristic plan's alpha2 x (T x C)(C x K) GEMM shape (a2, tiles_padded, c_stride,
    k_stride), the bytes of one operand set and the rotation sets that keep the L2 from serving
    repeats, for the cuBLAS columns."""
    if not spec.winograd_eligible:
        raise NotAvailable("not a Winograd layer")
    lay = Layout(spec, default_params(spec))
    a2, tp, cs, ks = lay.alpha2, lay.tiles_padded, lay.c_stride, lay.k_stride
    per_set = 4 * a2 * (tp * cs + cs * ks + tp * ks)
    return (a2, tp, cs, ks), per_set, rotation_sets(per_set, bench.l2, min_sets=1, budget_bytes=bench._budget())


def gemm_cublas(bench, spec, st) -> dict:
    """cuBLAS (cupy.matmul, batched, TF32 off) on the same alpha2 x (T x C)(C x K) shape."""
    cp = bench.cp
    (a2, tp, cs, ks), per_set, n = _batched_shape(bench, spec)
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


# ---- the warp-specialized GEMM (cuda/warp_specialized.cu): the Hopper block shape's GEMM side ----
# The H200's dense TF32 tensor rate; 3xTF32 spends three products on each useful multiply-add.
TF32_DENSE_TFLOPS = 494.7
TF32X3_PEAK_TFLOPS = TF32_DENSE_TFLOPS / 3


class WarpSpecializedGemm:
    """The sm_90a warp-specialized batched GEMM: M[a] = V[a] @ U[a] for every position a, U in
    the non-fused module's paired format ("float32_u_paired"), split once into its TF32 parts
    (:meth:`split_u`, which the producer copies whole rows of), one 384-thread block per SM.  Compiled with the runtime's own options;
    a stuck mbarrier wait comes back as a RuntimeError naming the block, role and stage."""

    def __init__(self, cp, consumer_warpgroups: int = 2):
        from megawino.gpu import nvrtc
        capability = cp.cuda.Device().compute_capability
        if nvrtc.arch_options(capability) != ("-arch=sm_90a",):
            raise NotAvailable(f"the warp-specialized GEMM needs sm_90a, not compute capability {capability}")
        self.cp = cp
        code = (nvrtc.cuda_dir() / "warp_specialized.cu").read_text()
        options = nvrtc.compile_options(4, "NCHW", False) + nvrtc.arch_options(capability)
        self.mod = cp.RawModule(code=code, options=options + (f"-DWS_CONSUMER_WARPGROUPS={int(consumer_warpgroups)}",))
        self.fn = self.mod.get_function("mw_gemm_warp_specialized_kernel")
        self.smem = nvrtc.module_int(self.mod, "mw_ws_smem_bytes")
        self.threads = nvrtc.module_int(self.mod, "mw_ws_threads")
        self.fn.max_dynamic_shared_size_bytes = self.smem
        self.blocks = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.report = cp.zeros(1, dtype=cp.uint32)

    def split_u(self, U):
        """U's big and small TF32 parts, as the kernel's producer copies them: big rounds to nearest
        (ties away), small = U - big truncated (cuda/gemm_arithmetic.cuh Tf32x3::split, bit for bit):
        done once, as preparing the weights is."""
        cp = self.cp
        big = (U.view(cp.uint32) + cp.uint32(0x1000)) & cp.uint32(0xFFFFE000)
        small = (U - big.view(cp.float32)).view(cp.uint32) & cp.uint32(0xFFFFE000)
        return big.view(cp.float32), small.view(cp.float32)

    def __call__(self, V, U_parts, M, rows: int) -> None:
        """M[:, :rows] = V[:, :rows] @ U, U given as split_u's parts (their data [alpha2][k_stride][c_stride], paired)."""
        import numpy as np
        alpha2, _, c_stride = V.shape
        k_stride = M.shape[2]
        U_big, U_small = U_parts
        # The paired U keeps Layout.u_shape, its rows transposed inside: only its size tells.
        if (U_big.size != alpha2 * k_stride * c_stride or U_small.shape != U_big.shape or M.shape[0] != alpha2
                or min(V.shape[1], M.shape[1]) < rows):
            raise ValueError(f"shapes V {V.shape}, U {U_big.shape}, M {M.shape} do not make a batched GEMM of {rows} rows")
        self.fn((self.blocks,), (self.threads,),
                (V, U_big, U_small, M, np.int32(alpha2), np.int32(rows), np.int32(c_stride), np.int32(k_stride),
                 np.int64(V.shape[1] * c_stride), np.int64(M.shape[1] * k_stride), self.report),
                shared_mem=self.smem)

    def check_report(self) -> None:
        word = int(self.report.get()[0])
        if word == 0xFFFFFFFF:
            raise RuntimeError("the warp-specialized GEMM was built without wgmma (not sm_90a)")
        if word:
            role = {1: "producer (empty barrier)", 2: "consumer (full barrier)"}.get((word >> 4) & 15, "?")
            raise RuntimeError(f"warp-specialized GEMM stuck: block {(word >> 8) & 0x7FFFFF}, {role}, stage {word & 15}")


def bitwise_check(cp, out, ref) -> dict:
    """Mismatching words of two float32 arrays, and their largest absolute difference."""
    diff = out.view(cp.uint32) != ref.view(cp.uint32)
    mismatches = int(diff.sum())
    max_abs = float(cp.nan_to_num(cp.abs(out - ref), nan=cp.inf).max()) if mismatches else 0.0
    return {"bitwise_mismatches": mismatches, "max_abs_diff": max_abs, "bitwise_equal": mismatches == 0}


def _peak_fields(layer_gemm: dict, us: float | None) -> dict:
    useful = layer_gemm.get("useful_flops")
    tflops = useful / us / 1e6 if useful and us else None
    return {"useful_tflops": tflops, "fraction_of_3xtf32_peak": tflops / TF32X3_PEAK_TFLOPS if tflops else None}


def consumer_warpgroups(rows: int) -> int:
    """Three consumer warpgroups (192-row tiles: more MMAs in flight, measured faster on the wide
    layers) unless their last row tile pads the rows by over 10% more than 128-row tiles do."""
    padded = {w: -(-rows // (64 * w)) * 64 * w for w in (2, 3)}
    return 3 if padded[3] <= 1.1 * padded[2] else 2


def gemm_warp_specialized(bench, spec, st) -> dict:
    """The warp-specialized GEMM on the non-fused plan's own V and U (real data from a random
    input), bitwise against the plan's M, timed rotating among whole plans as ``gemm_ours``."""
    cp = bench.cp
    if bench.primary != "megakernel":
        raise NotAvailable("not a Winograd layer")
    params = None
    plan = bench._make_plan(spec, "nonfused")
    if getattr(getattr(plan, "params", None), "fused_output", False):
        params = default_params(spec, plan.params.m)
        plan = bench._make_plan(spec, "nonfused", params)
    if plan.operand_format != "float32_u_paired":
        raise NotAvailable(f"the non-fused plan's U is {plan.operand_format!r}, not the paired format")
    lay = plan.task_layout
    rows = min(lay.tiles_padded, plan.V.shape[1])   # a ring's V holds fewer rows than the layer's tiles
    warpgroups = consumer_warpgroups(rows)
    modules = bench.__dict__.setdefault("ws_gemm", {})              # compiled once a run per block shape
    ws = modules.get(warpgroups) or modules.setdefault(warpgroups, WarpSpecializedGemm(cp, warpgroups))
    # V and M, and U three times: the plan's, and its two TF32 parts the kernel reads.
    per_set = 4 * lay.alpha2 * (lay.tiles_padded * (lay.c_stride + lay.k_stride) + 3 * lay.c_stride * lay.k_stride)
    n = rotation_sets(per_set, bench.l2, min_sets=1, budget_bytes=bench._budget())
    plans = [plan] + [bench._make_plan(spec, "nonfused", params) for _ in range(n - 1)]
    for p in plans:
        p(st["xs"][0], st["w"], check=True)
    parts = [ws.split_u(p.U) for p in plans]                 # once per plan, outside the timing
    out = cp.full(plan.M.shape, cp.nan, dtype=cp.float32)    # poisoned: every row it owns must be written
    ws(plan.V, parts[0], out, rows)
    cp.cuda.get_current_stream().synchronize()
    ws.check_report()
    entry = {"rotation_sets": n, "bytes_per_set": per_set, "rows": rows, "consumer_warpgroups": warpgroups,
             **bitwise_check(cp, out[:, :rows], plan.M[:, :rows])}
    sample = min(rows, 1024)
    u0 = abi.filter_matrices(plan.U, plan.operand_format)[0]
    ref = cp.matmul(plan.V[0, :sample].astype(cp.float64), u0.astype(cp.float64))
    entry["rel_err_sample_vs_f64"] = gpu_rel_l2(out[0, :sample], ref)
    del out
    entry.update(bench._time(lambda i: ws(plans[i].V, parts[i], plans[i].M, rows), list(range(n)),
                             check=ws.check_report))
    gemm = {"useful_flops": 2 * lay.alpha2 * lay.tiles * spec.C * spec.K}
    entry.update(_peak_fields(gemm, entry.get("median_us")))
    return entry


def gemm_cublas_tf32(bench, spec, st) -> dict:
    """PyTorch's batched matmul with TF32 allowed (cuBLAS, one TF32 product per multiply-add) on
    the alpha2 x (T x C)(C x K) shape: the per-product yardstick of the tensor cores."""
    torch = bench.torch
    if torch is None:
        raise NotAvailable("PyTorch did not import")
    (a2, tp, cs, ks), per_set, n = _batched_shape(bench, spec)
    gen = torch.Generator(device="cuda").manual_seed(bench.args.seed + 11)
    sets = [(torch.randn((a2, tp, cs), device="cuda", generator=gen), torch.randn((a2, cs, ks), device="cuda", generator=gen),
             torch.empty((a2, tp, ks), device="cuda")) for _ in range(n)]
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        fn = lambda s: torch.bmm(s[0], s[1], out=s[2])  # noqa: E731
        fn(sets[0])
        torch.cuda.synchronize()
        sample = min(tp, 1024)
        a, b, c = sets[0]
        ref = (a[0, :sample].double() @ b[0].double())
        entry = {"rotation_sets": n, "bytes_per_set": per_set,
                 "rel_err_sample_vs_f64": float((c[0, :sample].double() - ref).norm() / ref.norm())}
        entry.update(bench._time(fn, sets))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return entry
