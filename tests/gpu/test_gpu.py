"""GPU tests of the runtime: correctness against the float64 direct convolution,
bitwise agreement of the megakernel with itself (any valid mapping) and with the
non-fused path, back-to-back launches, the watchdog, the CPU executor and
CUDA-graph capture.  Every test is marked ``gpu`` (skipped without a GPU)."""
from __future__ import annotations

import time
import zlib

import numpy as np
import pytest

from megawino.cpu import executor
from megawino.schedule import mapping as mapping_mod
from megawino.core import abi, suite
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.tasks import TaskParams
from megawino.core.winograd import direct_conv_nchw, rel_l2

pytestmark = pytest.mark.gpu

TOL = {4: 3e-6, 2: 1e-6}


def _tol(spec, m):
    """float32 rounding grows with the reduction length: the base tolerance holds up
    to C = 512 (every suite layer); beyond it, scale by sqrt(C / 512) (C = 1000, m = 4
    measured 4.0e-6 on the H100)."""
    return TOL[m] * max(1.0, (spec.C / 512) ** 0.5)


def _cp():
    import cupy
    return cupy


def _rng(seed):
    return np.random.default_rng(seed)


def _inputs(spec: LayerSpec, seed: int):
    """Fresh random normal inputs (host float32: NCHW-ordered x, w) and device copies in
    the layer's layout."""
    rng = _rng(seed)
    x = rng.standard_normal((spec.N, spec.C, spec.H, spec.W)).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    xl = x if spec.layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    cp = _cp()
    return x, w, cp.asarray(xl), cp.asarray(w)


def _to_nchw(spec, y):
    y = y.get() if hasattr(y, "get") else np.asarray(y)
    return y if spec.layout == "NCHW" else y.transpose(0, 3, 1, 2)


def _poisoned(spec):
    cp = _cp()
    return cp.full(spec.output_shape, np.nan, dtype=cp.float32)


def _poison_buffers(plan):
    for buf in (plan.U, plan.V, plan.M):
        buf.fill(np.nan)


def _run(plan, xd, wd):
    out = _poisoned(plan.spec)
    _poison_buffers(plan)
    plan(xd, wd, out=out)
    return out


_PLANS = {}


def _plan(spec, m=4, algo="megakernel", params=None, **kw):
    import megawino
    key = (spec, m, algo, params, tuple(sorted(kw.items())))
    if key not in _PLANS:
        p = params if params is not None else default_params(spec, m=m)
        _PLANS[key] = megawino.plan(spec, params=p, algo=algo, **kw)
    return _PLANS[key]


def _check_layer(spec, m, seed=0, nonfused=True):
    x, w, xd, wd = _inputs(spec, seed)
    mega = _plan(spec, m)
    y = _run(mega, xd, wd)
    ref = direct_conv_nchw(x, w, 1, spec.padding)
    got = _to_nchw(spec, y)
    assert not np.isnan(got).any(), "unwritten (NaN) outputs"
    err = rel_l2(got, ref)
    assert err < _tol(spec, m), f"{spec.describe()} m={m}: rel L2 {err:.3g} >= {_tol(spec, m):.3g}"
    if nonfused:
        y2 = _run(_plan(spec, m, "nonfused"), xd, wd)
        assert bool((y2 == y).all()), "megakernel and non-fused results differ bitwise"
    return err


# ---- suite layers at batch 2 ------------------------------------------------

def _suite():
    try:
        return suite.load_suite(suite="winograd", batch=2)
    except FileNotFoundError:
        return []


SUITE = _suite()


@pytest.mark.skipif(not SUITE, reason="suite layers.json not found (set MEGAWINO_SUITE)")
@pytest.mark.parametrize("index", range(len(SUITE)), ids=[s.name for s in SUITE])
def test_suite_layer(index):
    _check_layer(SUITE[index], 4, seed=index)


# ---- odd shapes ------------------------------------------------------------------

ODD = [
    LayerSpec(1, 3, 5, 13, 13),
    LayerSpec(2, 5, 3, 10, 17, padding=0),
    LayerSpec(3, 1, 1, 9, 6, padding=2),
    LayerSpec(1, 16, 24, 7, 30),
    LayerSpec(5, 8, 12, 6, 6, padding=0),
    LayerSpec(2, 1000, 20, 5, 5),
    LayerSpec(1, 40, 100, 11, 19, padding=2),
    LayerSpec(2, 64, 72, 15, 14),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("spec", ODD, ids=lambda s: s.shape_string)
def test_odd_shapes(spec, m, layout):
    _check_layer(spec.with_(layout=layout), m, seed=zlib.crc32(f"{spec.shape_string}{m}{layout}".encode()) % 1000)


def test_odd_task_params():
    """Task sizes that split channels, K blocks and pairs unevenly."""
    spec = LayerSpec(2, 44, 52, 17, 15)
    params = TaskParams(m=4, tiles_per_group=192, input_channels_per_task=20, gemm_k_per_task=36,
                        output_k_per_task=7, filter_pairs_per_task=300)
    x, w, xd, wd = _inputs(spec, 7)
    y = _run(_plan(spec, params=params), xd, wd)
    assert rel_l2(_to_nchw(spec, y), direct_conv_nchw(x, w, 1, 1)) < TOL[4]
    y2 = _run(_plan(spec, params=params, algo="nonfused"), xd, wd)
    assert bool((y2 == y).all())


GEMM_MATH_SHAPES = [LayerSpec(2, 512, 64, 14, 14), LayerSpec(3, 5, 3, 10, 17, padding=0),
                    LayerSpec(2, 64, 72, 15, 14, layout="NHWC")]


@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("spec", GEMM_MATH_SHAPES, ids=lambda s: s.shape_string + s.layout)
def test_gemm_math_ffma_and_3xtf32(spec, m):
    """Both GEMM arithmetics (nvrtc.GEMM_MATHS) meet the fp32 bars, the megakernel equals the
    non-fused path bitwise in each, and the two are different code (not bitwise equal on C=512)."""
    x, w, xd, wd = _inputs(spec, 23)
    ref = direct_conv_nchw(x, w, 1, spec.padding)
    params = default_params(spec, m=m)
    outs = {}
    for gm in ("ffma", "3xtf32"):
        y = _run(_plan(spec, m, params=params, gemm_math=gm), xd, wd)
        assert rel_l2(_to_nchw(spec, y), ref) < _tol(spec, m), gm
        y2 = _run(_plan(spec, m, "nonfused", params=params, gemm_math=gm), xd, wd)
        assert bool((y2 == y).all()), f"{gm}: megakernel and non-fused differ bitwise"
        outs[gm] = y
    if spec.C >= 512:
        assert not bool((outs["ffma"] == outs["3xtf32"]).all()), "gemm_math did not change the GEMM"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("m", [4, 2])
def test_tile_split_transforms_bitwise(m, layout):
    """Transform tasks covering part of a group's tiles (input_tiles_per_task /
    output_tiles_per_task) give the same bits as whole-group tasks, fused and non-fused."""
    spec = LayerSpec(3, 44, 52, 17, 15, layout=layout)
    base = dict(m=m, tiles_per_group=128, input_channels_per_task=20, gemm_k_per_task=36,
                output_k_per_task=40)
    x, w, xd, wd = _inputs(spec, 13)
    ref = _run(_plan(spec, params=TaskParams(**base)), xd, wd)
    assert rel_l2(_to_nchw(spec, ref), direct_conv_nchw(x, w, 1, 1)) < TOL[m]
    for tiles_in, tiles_out in ((16, 32), (64, 16)):
        params = TaskParams(**base, input_tiles_per_task=tiles_in, output_tiles_per_task=tiles_out)
        for algo in ("megakernel", "nonfused"):
            y = _run(_plan(spec, params=params, algo=algo), xd, wd)
            assert bool((y == ref).all()), (tiles_in, tiles_out, algo)


# ---- bitwise identity across mappings ------------------------------------------

def random_topological_order(graph, rng) -> np.ndarray:
    """A uniformly random ready task at each step (Kahn): parents before children."""
    rec = graph.records
    n = graph.num_tasks
    missing = np.zeros(n, dtype=np.int64)
    waiters = [[] for _ in range(graph.layout.num_counters)]
    for t in range(n):
        for wc, nc in ((3, 4), (5, 6)):
            if rec[t, wc] >= 0:
                missing[t] += rec[t, nc]
                waiters[rec[t, wc]].append(t)
    ready = [t for t in range(n) if missing[t] == 0]
    order = []
    while ready:
        i = int(rng.integers(len(ready)))
        ready[i], ready[-1] = ready[-1], ready[i]
        t = ready.pop()
        order.append(t)
        sig = rec[t, 7]
        if sig >= 0:
            for child in waiters[sig]:
                missing[child] -= 1
                if missing[child] == 0:
                    ready.append(child)
    assert len(order) == n
    return np.asarray(order, dtype=np.int32)


def test_bitwise_across_mappings():
    import megawino
    spec = LayerSpec(2, 48, 136, 23, 21)
    params = TaskParams(m=4, tiles_per_group=64, input_channels_per_task=16, gemm_k_per_task=64,
                        output_k_per_task=32)
    graph = build_graph(spec, params)
    x, w, xd, wd = _inputs(spec, 11)
    ref = _run(megawino.plan(spec, params=params, algo="nonfused"), xd, wd)
    assert rel_l2(_to_nchw(spec, ref), direct_conv_nchw(x, w, 1, 1)) < TOL[4]
    rng = _rng(5)
    orders = [mapping_mod.sequential_mapping(graph)]
    for _ in range(6):
        mp = mapping_mod.MappingParams(int(rng.integers(0, 200)), int(rng.integers(0, 300)),
                                       int(rng.integers(1, 9)))
        orders.append(mp)
    orders += [random_topological_order(graph, rng) for _ in range(6)]
    for i, order in enumerate(orders):
        p = megawino.plan(spec, params=params, mapping=order)
        y = _run(p, xd, wd)
        assert bool((y == ref).all()), f"mapping #{i} ({order if i < 7 else 'random order'}) differs"
        y = _run(p, xd, wd)   # and again with the same plan (state reset in-kernel)
        assert bool((y == ref).all()), f"mapping #{i}: second launch differs"


@pytest.mark.parametrize("gemm_math", ["3xtf32", "bf16x3"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_ring_buffers_bitwise(layout, gemm_math, monkeypatch):
    """V and M as a ring of fewer slots than groups (TaskParams.buffer_groups) give the same bits
    as whole buffers: the interleaved order with the fewest slots it allows, random orders of the
    ring's graph on two slots, a second launch, and the prepared-weight variant (no filter tasks);
    the non-fused path refuses a ring."""
    import dataclasses
    import megawino
    spec = LayerSpec(4, 24, 40, 47, 44, layout=layout)
    params = TaskParams(m=4, tiles_per_group=64, input_channels_per_task=16, gemm_k_per_task=24,
                        output_k_per_task=32, input_tiles_per_task=32, output_tiles_per_task=16)
    x, w, xd, wd = _inputs(spec, 17)
    ref = _run(megawino.plan(spec, params=params, gemm_math=gemm_math), xd, wd)
    if gemm_math == "3xtf32":
        assert rel_l2(_to_nchw(spec, ref), direct_conv_nchw(x, w, 1, 1)) < TOL[4]
    graph = build_graph(spec, params)
    mp = mapping_mod.MappingParams(8, 24, 1)
    ring = mapping_mod.ring_buffer_groups(graph, mapping_mod.build_interleaved(graph, mp).order)
    assert 1 < ring < graph.layout.num_groups
    cases = [(dataclasses.replace(params, buffer_groups=ring), mp)]
    two = dataclasses.replace(params, buffer_groups=2)
    rng = _rng(29)
    cases += [(two, random_topological_order(build_graph(spec, two), rng)) for _ in range(3)]
    for i, (par, order) in enumerate(cases):
        p = megawino.plan(spec, params=par, mapping=order, gemm_math=gemm_math)
        assert p.V.shape[1] == p.task_layout.buffer_tiles < p.task_layout.tiles_padded
        for launch in range(2):
            y = _run(p, xd, wd)
            assert bool((y == ref).all()), f"ring case {i}, launch {launch} differs"
        for launch in range(2):   # the first call prepares U, the second runs without filter tasks
            y = _poisoned(spec)
            p.V.fill(np.nan)
            p.M.fill(np.nan)
            p(xd, wd, out=y, weight_token=("ring", i, layout, gemm_math))
            assert bool((y == ref).all()), f"ring case {i}, prepared weights, launch {launch} differs"
    with pytest.raises(ValueError, match="megakernel"):
        megawino.plan(spec, params=cases[0][0], mapping=mp, algo="nonfused", gemm_math=gemm_math)
    p = megawino.plan(spec, params=params, mapping=mp, gemm_math=gemm_math, ring_buffers=True)
    assert p.params.buffer_groups == ring and "ring of" in repr(p)
    assert bool((_run(p, xd, wd) == ref).all()), "plan(ring_buffers=True) differs"
    # Automatic (the default): a ring only where whole V and M would crowd the GPU's memory.
    from megawino.gpu import workspace
    assert not megawino.plan(spec, params=params, mapping=mp, gemm_math=gemm_math).task_layout.ring
    monkeypatch.setattr(workspace, "RING_MEMORY_SHARE", 1e-9)
    auto = megawino.plan(spec, params=params, mapping=mp, gemm_math=gemm_math)
    assert auto.task_layout.buffer_groups == ring and bool((_run(auto, xd, wd) == ref).all())
    assert not megawino.plan(spec, params=params, mapping=mp, gemm_math=gemm_math,
                             ring_buffers=False).task_layout.ring
    assert not megawino.plan(spec, params=params, mapping=mp, algo="nonfused", gemm_math=gemm_math).task_layout.ring
    for algo in ("nonfused", "direct"):
        with pytest.raises(ValueError, match="megakernel"):
            megawino.plan(spec, algo=algo, ring_buffers=True)


def test_invalid_mapping_never_launched():
    import megawino
    spec = LayerSpec(1, 8, 8, 8, 8)
    graph = build_graph(spec)
    order = mapping_mod.sequential_mapping(graph)[::-1].copy()
    with pytest.raises(ValueError):
        megawino.plan(spec, mapping=order)
    with pytest.raises(ValueError):
        megawino.plan(spec, mapping=order[:-1])


# ---- robustness ----------------------------------------------------------------------

def test_thousand_launches():
    cp = _cp()
    spec = LayerSpec(2, 32, 32, 16, 16)
    x, w, xd, wd = _inputs(spec, 3)
    p = _plan(spec)
    out = _poisoned(spec)
    for _ in range(1000):
        p(xd, wd, out=out, check=False)
    cp.cuda.get_current_stream().synchronize()
    p.check()
    assert rel_l2(_to_nchw(spec, out), direct_conv_nchw(x, w, 1, 1)) < TOL[4]


def test_watchdog_fires_and_recovers():
    import megawino
    spec = LayerSpec(2, 32, 32, 16, 16)
    x, w, xd, wd = _inputs(spec, 4)
    p = megawino.plan(spec, timeout_s=2.0)
    p._debug_break_counter(p.task_layout.counter_inputs_done(0))
    t0 = time.perf_counter()
    p(xd, wd)                         # asynchronous: the report comes at the next check
    # The first waiter to time out wins: a GEMM of group 0 (on counter 1) or an
    # OUTPUT of group 0 (on counter 2, whose GEMMs never ran).
    with pytest.raises(RuntimeError, match=r"megakernel watchdog .*limit 2.0 s per wait\): launch \d+: "
                                           r"ticket \d+ \((GEMM g=0 j=\d+|OUTPUT g=0 #\d+ \(tiles \d+\.\.\d+, "
                                           r"channels \d+\.\.\d+\))\) waited on counter \d+ \(value \d+, need \d+\)"):
        p.check()
    assert time.perf_counter() - t0 < 5.0
    y = _run(p, xd, wd)
    p.check()
    assert rel_l2(_to_nchw(spec, y), direct_conv_nchw(x, w, 1, 1)) < TOL[4]


def test_cpu_executor_agrees():
    spec = LayerSpec(2, 12, 20, 11, 9)
    params = TaskParams(m=4, tiles_per_group=64, input_channels_per_task=8, gemm_k_per_task=12,
                        output_k_per_task=8, filter_pairs_per_task=100)
    p = _plan(spec, params=params)
    x, w, xd, wd = _inputs(spec, 9)
    y = _run(p, xd, wd)
    host = executor.execute(p.graph, p.order, x, w)
    u = abi.filter_matrices(p.U.get(), p.operand_format)   # the CPU executor keeps U in channel order
    for name, g, cpu in (("U", u, host.U), ("V", p.V.get(), host.V), ("M", p.M.get(), host.M), ("y", y.get(), host.y)):
        assert not np.isnan(g).any(), f"{name}: unwritten elements"
        scale = float(np.abs(cpu).max()) or 1.0
        np.testing.assert_allclose(g, cpu, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_cuda_graph_capture_replays():
    cp = _cp()
    spec = LayerSpec(2, 24, 40, 14, 14)
    x, w, xd, wd = _inputs(spec, 12)
    p = _plan(spec)
    p(xd, wd)   # warm: modules loaded
    ref = direct_conv_nchw(x, w, 1, 1)
    out = _poisoned(spec)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        p(xd, wd, out=out, check=False)
        graph = stream.end_capture()
    for _ in range(2):
        out.fill(np.nan)
        cp.cuda.get_current_stream().synchronize()
        graph.launch(stream)
        stream.synchronize()
        p.check()
        assert rel_l2(_to_nchw(spec, out), ref) < TOL[4]


def test_trace_records_every_ticket():
    spec = LayerSpec(2, 32, 48, 20, 20)
    p = _plan(spec, trace=True)
    _, _, xd, wd = _inputs(spec, 2)
    _run(p, xd, wd)
    tr = p.trace()
    assert tr.shape == (p.graph.num_tasks, 4)
    assert (tr[:, 1] > 0).all()
    assert (tr[:, 2] >= tr[:, 1]).all() and (tr[:, 3] >= tr[:, 2]).all()


# ---- conv2d API ---------------------------------------------------------------------

def test_conv2d_api():
    import megawino
    cp = _cp()
    spec = LayerSpec(2, 16, 8, 12, 12)
    x, w, xd, wd = _inputs(spec, 1)
    y = megawino.conv2d(xd, wd, padding=1)
    assert isinstance(y, cp.ndarray) and y.shape == spec.output_shape
    assert rel_l2(y.get(), direct_conv_nchw(x, w, 1, 1)) < TOL[4]
    y2 = megawino.conv2d(xd, wd, padding=1, algo="nonfused")
    assert bool((y2 == y).all())
    y3 = megawino.conv2d(xd, wd, stride=2)          # auto: not Winograd -> the direct path
    assert rel_l2(y3.get(), direct_conv_nchw(x, w, 2, 1)) < 1e-6
    with pytest.raises(ValueError):
        megawino.conv2d(xd.astype(cp.float64), wd)
    with pytest.raises(ValueError):
        megawino.plan(spec)(xd[:, :, :, :-1], wd)
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        yt = megawino.conv2d(torch.from_dlpack(xd), torch.from_dlpack(wd), padding=1)
        assert bool((yt == y).all())


@pytest.mark.parametrize("spec", [LayerSpec(2, 512, 72, 14, 14),
                                  LayerSpec(2, 48, 40, 9, 11),     # the last 32-k stage's second sub-tile is past C
                                  LayerSpec(3, 20, 24, 10, 13)],   # a partial sub-tile; 24 of 64 columns
                         ids=lambda spec: f"c{spec.C}k{spec.K}")
def test_gemm_runs_wgmma_on_sm90(monkeypatch, spec):
    """On compute capability 9.0 both Winograd modules are built for sm_90a and their GEMM runs
    on warpgroup MMAs; -DMW_GEMM_WGMMA=0 keeps mma.sync.  Both meet the fp32 bar and agree
    bitwise between megakernel and non-fused, and with each other: the tensor cores sum each
    16-term k tile the same way whichever instruction feeds them (the wgmma tile's 32-k stages
    as two 16-k sub-tiles, the mma.sync tile's as one 16-k stage each)."""
    import megawino
    from megawino.gpu import nvrtc
    cp = _cp()
    capability = cp.cuda.Device().compute_capability
    x, w, xd, wd = _inputs(spec, 31)
    ref = direct_conv_nchw(x, w, 1, spec.padding)
    outs = {}
    for wgmma_define in ("", "-DMW_GEMM_WGMMA=0"):
        monkeypatch.setenv(nvrtc.EXTRA_DEFINES_ENV, wgmma_define)
        expect = capability == "90" and not wgmma_define
        for algo in nvrtc.WINOGRAD_ALGOS:
            assert nvrtc.gemm_uses_wgmma(nvrtc.module(algo, 4, "NCHW")) == expect, (algo, wgmma_define)
        params = default_params(spec, m=4)
        y = _run(megawino.plan(spec, params=params), xd, wd)
        assert rel_l2(_to_nchw(spec, y), ref) < _tol(spec, 4), wgmma_define
        y2 = _run(megawino.plan(spec, params=params, algo="nonfused"), xd, wd)
        assert bool((y2 == y).all()), f"{wgmma_define or 'default'}: megakernel and non-fused differ bitwise"
        outs[wgmma_define] = y
    if capability == "90":
        assert bool((outs[""] == outs["-DMW_GEMM_WGMMA=0"]).all()), "wgmma and mma.sync GEMMs differ bitwise"


@pytest.mark.parametrize("channels", [8, 32, 64, 96, 200])
def test_gemm_shared_memory_by_depth(channels):
    """A plan launches with the shared memory its GEMM's depth uses (a ring of fewer k tiles than
    stages leaves the rest to the L1; nvrtc.gemm_smem_bytes), never less than the transforms'
    scratch, and computes the same bits as with all of it, megakernel and non-fused alike."""
    import megawino
    from megawino.core.tasks import TaskType
    from megawino.gpu import nvrtc
    spec = LayerSpec(3, channels, 40, 19, 22)
    x, w, xd, wd = _inputs(spec, 41 + channels)
    params = default_params(spec, m=4)
    scratch = 36 * nvrtc.BLOCK_THREADS * 4
    outs = []
    for algo in ("megakernel", "nonfused"):
        mod = nvrtc.module(algo, 4, "NCHW")   # each module its own ring (the non-fused one deeper)
        whole = nvrtc.module_int(mod, "mw_gemm_smem_bytes")
        k_tiles = -(-channels // nvrtc.module_int(mod, "mw_gemm_k_per_tile"))
        stages = nvrtc.module_int(mod, "mw_gemm_stages")
        plan = megawino.plan(spec, params=params, algo=algo)
        kernel = plan._mega if algo == "megakernel" else plan._kernels[TaskType.GEMM]
        assert scratch <= kernel.shared_bytes <= whole
        if nvrtc.gemm_uses_wgmma(mod) and nvrtc.operand_format(mod) != "split_bf16" and k_tiles < stages:
            assert kernel.shared_bytes < whole, (algo, channels, kernel.shared_bytes)
        for shared_bytes in (kernel.shared_bytes, whole):
            kernel.shared_bytes = shared_bytes
            outs.append(_run(plan, xd, wd))
    assert rel_l2(_to_nchw(spec, outs[0]), direct_conv_nchw(x, w, 1, 1)) < TOL[4]
    for i, y in enumerate(outs[1:], 1):
        assert bool((y == outs[0]).all()), f"launch {i} of (megakernel, non-fused) x (by depth, whole) differs"


def test_tune_cli_writes_a_table(tmp_path):
    """`megawino tune` on a small layer runs end to end on the GPU and writes a valid table entry
    whose parameters plan and run that layer correctly."""
    import megawino
    from megawino.cli import main
    from megawino.tuning import table as tuning
    out = tmp_path / "tuned.json"
    assert main(["tune", "n2c32k40h14w14", "--batch", "2", "--budget", "30", "--top", "2", "--reps", "2",
                 "--out", str(out)]) == 0
    layers = tuning.read_table(out)["layers"]
    assert list(layers) == ["n2c32k40h14w14"]
    spec, params, mapping = tuning.entry_objects("n2c32k40h14w14", layers["n2c32k40h14w14"])
    assert layers["n2c32k40h14w14"]["time_us"] > 0
    x, w, xd, wd = _inputs(spec, 41)
    y = _run(megawino.plan(spec, params=params, mapping=mapping), xd, wd)
    assert rel_l2(_to_nchw(spec, y), direct_conv_nchw(x, w, 1, spec.padding)) < _tol(spec, 4)
