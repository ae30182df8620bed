"""GPU tests of the asynchronous runtime: per-stream workspaces under streams and threads, the
watchdog under check=False, prepared weights under weight tokens, plan-cache bounds and the
argument checks that must refuse before anything launches.  Marked ``gpu``."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import numpy as np
import pytest

from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2

pytestmark = pytest.mark.gpu

SHAPES = [LayerSpec(2, 32, 48, 17, 15), LayerSpec(1, 24, 40, 21, 21), LayerSpec(3, 16, 8, 9, 30)]
ALGOS = ("megakernel", "nonfused", "direct")


def _cp():
    import cupy
    return cupy


def _case(spec, seed):
    cp = _cp()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape).astype(np.float32) + 0.25
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    return x, w, cp.asarray(x), cp.asarray(w)


def test_streams_and_threads_give_the_single_stream_outputs():
    """Two streams and four threads hammer the same shapes with check=False for 10 s; every
    output is compared bitwise with the single-stream output of the same call."""
    import megawino
    cp = _cp()
    cases = []
    for i, spec in enumerate(SHAPES):
        x, w, xd, wd = _case(spec, 100 + i)
        for algo in ALGOS:
            ref = megawino.conv2d(xd, wd, padding=1, algo=algo)
            megawino.synchronize()
            assert rel_l2(ref.get(), direct_conv_nchw(x, w, 1, 1)) < 3e-6
            cases.append((spec, algo, xd, wd, ref))
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    failures, counts, slowest = [], [0] * 4, [0.0] * 4
    barrier = threading.Barrier(4)

    def one_round(index, rng, outs, stream, pick):
        for j in pick:
            spec, algo, xd, wd, _ = cases[j]
            outs[j].fill(np.nan)
            token = ("hammer", j) if rng.integers(2) else None
            megawino.conv2d(xd, wd, padding=1, algo=algo, out=outs[j], check=False, weight_token=token)
        stream.synchronize()
        for j in pick:
            if not bool(cp.array_equal(outs[j], cases[j][4])):
                failures.append(f"thread {index}: {cases[j][0].describe()} {cases[j][1]} differs")

    def hammer(index):
        rng = np.random.default_rng(index)
        stream = streams[index % 2]
        with stream:
            outs = [cp.full(c[0].output_shape, np.nan, dtype=cp.float32) for c in cases]
            one_round(index, rng, outs, stream, range(len(cases)))     # warm-up: kernels compiled
            barrier.wait()
            deadline = time.monotonic() + 10.0
            while time.monotonic() < deadline and not failures:
                t0 = time.monotonic()
                pick = rng.integers(len(cases), size=4)
                one_round(index, rng, outs, stream, pick)
                counts[index] += len(pick)
                slowest[index] = max(slowest[index], time.monotonic() - t0)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(hammer, range(4)))          # an exception in a thread fails the test
    megawino.synchronize()
    assert not failures, failures[:3]
    assert min(counts) > 20, (counts, slowest)     # every thread made many calls in the 10 s


def test_watchdog_under_check_false_surfaces_at_the_next_synchronize_only():
    import megawino
    cp = _cp()
    spec = LayerSpec(2, 32, 32, 16, 16)
    x, w, xd, wd = _case(spec, 7)
    p = megawino.plan(spec, timeout_s=0.5)
    good = cp.full(spec.output_shape, np.nan, dtype=cp.float32)
    p._debug_break_counter(p.task_layout.counter_inputs_done(0))
    p(xd, wd, check=False)                     # fires
    cp.cuda.Device().synchronize()             # its status has landed ...
    p(xd, wd, out=good, check=False)           # ... yet check=False calls do not report it
    with pytest.raises(RuntimeError, match=r"launch 1: ticket \d+"):
        megawino.synchronize()
    megawino.synchronize()                     # reported once, not again
    p.check()
    assert rel_l2(good.get(), direct_conv_nchw(x, w, 1, 1)) < 3e-6   # the later call was good
    # With check=True (the default) the next call of the plan reports it, naming that launch.
    p._debug_break_counter(p.task_layout.counter_inputs_done(0))
    p(xd, wd, check=False)
    cp.cuda.Device().synchronize()
    with pytest.raises(RuntimeError, match=r"launch 3: ticket"):
        p(xd, wd)
    p.check()


def test_weight_token_reuses_and_never_goes_stale():
    import megawino
    cp = _cp()
    for algo in ALGOS:
        spec = LayerSpec(2, 20, 28, 13, 13)
        x, w, xd, wd = _case(spec, 21)
        plain = megawino.conv2d(xd, wd, padding=1, algo=algo)
        first = megawino.conv2d(xd, wd, padding=1, algo=algo, weight_token=("w", 0))
        again = megawino.conv2d(xd, wd, padding=1, algo=algo, weight_token=("w", 0))
        megawino.synchronize()
        assert bool(cp.array_equal(first, plain)) and bool(cp.array_equal(again, plain)), algo
        wd += 1.0                                          # the weights change in place ...
        fresh = megawino.conv2d(xd, wd, padding=1, algo=algo, weight_token=("w", 1))   # ... new token
        megawino.synchronize()
        err = rel_l2(fresh.get(), direct_conv_nchw(x, w + 1.0, 1, 1))
        assert err < 3e-6, (algo, err)


def test_refusals_happen_before_any_plan_is_made():
    import megawino
    from megawino import runtime
    cp = _cp()
    runtime.clear_cache()
    spec = LayerSpec(1, 8, 8, 10, 10)
    _, _, xd, wd = _case(spec, 3)
    for kwargs in ({"padding": 1.7}, {"stride": 2.5}, {"padding": "2"}, {"stride": True}):
        with pytest.raises(ValueError):
            megawino.conv2d(xd, wd, **kwargs)
    with pytest.raises(ValueError, match="float32"):
        megawino.conv2d(xd.astype(cp.float64), wd)
    with pytest.raises(ValueError, match="alias"):
        megawino.conv2d(xd, wd, padding=1, out=xd)
    assert len(runtime.PLANS) == 0


def test_misaligned_and_strided_inputs_are_copied():
    import megawino
    cp = _cp()
    spec = LayerSpec(1, 8, 12, 11, 11)
    x, w, xd, wd = _case(spec, 5)
    flat = cp.empty(xd.size + 1, dtype=cp.float32)
    flat[1:] = xd.ravel()
    misaligned = flat[1:].reshape(xd.shape)
    assert misaligned.data.ptr % 16
    wide = cp.zeros((spec.N, spec.C, spec.H, spec.W * 2), dtype=cp.float32)
    wide[..., ::2] = xd
    ref = direct_conv_nchw(x, w, 1, 1)
    for arr in (misaligned, wide[..., ::2]):
        for algo in ALGOS:
            y = megawino.conv2d(arr, wd, padding=1, algo=algo)
            assert rel_l2(y.get(), ref) < 3e-6, algo


def test_plan_cache_is_bounded(monkeypatch):
    import megawino
    from megawino import runtime
    monkeypatch.setenv("MEGAWINO_PLAN_CACHE", "2")
    runtime.clear_cache()
    for h in (8, 9, 10, 11):
        spec = LayerSpec(1, 8, 8, h, h)
        _, _, xd, wd = _case(spec, h)
        megawino.conv2d(xd, wd, padding=1, algo="megakernel")
    assert len(runtime.PLANS) == 2
    runtime.clear_cache()
    assert len(runtime.PLANS) == 0


def test_a_plan_refuses_a_device_other_than_its_own():
    import megawino
    spec = LayerSpec(1, 8, 8, 10, 10)
    _, _, xd, wd = _case(spec, 11)
    for algo in ALGOS:
        p = megawino.plan(spec, algo=algo)
        p(xd, wd)
        p.device = p.device + 1                   # as if the plan had been made on another GPU
        with pytest.raises(ValueError, match="made on device"):
            p(xd, wd)


def test_choose_algo_skips_an_algorithm_whose_workspace_does_not_fit(monkeypatch):
    """algo="auto" times only the algorithms whose workspace fits: one that runs out of memory on
    its first call (here the non-fused path, made to) is dropped, and conv2d runs the fastest of
    the others; none fitting is a MemoryError that says what to do."""
    import megawino
    from megawino import runtime
    from megawino.gpu import workspace
    cp = _cp()
    real = workspace.PlanWorkspace

    def refuse_nonfused(plan, capturing):
        if plan.algo == "nonfused":
            raise cp.cuda.memory.OutOfMemoryError(1 << 40, 0, 0)
        return real(plan, capturing)
    monkeypatch.setattr(workspace, "PlanWorkspace", refuse_nonfused)
    spec = LayerSpec(2, 40, 24, 19, 13)          # a shape no other test times
    assert runtime.choose_algo(spec) in ("megakernel", "direct")
    x, w, xd, wd = _case(spec, 41)
    y = megawino.conv2d(xd, wd, padding=1)
    assert rel_l2(y.get(), direct_conv_nchw(x, w, 1, 1)) < 3e-6

    def out_of_memory(*args, **kwargs):
        raise cp.cuda.memory.OutOfMemoryError(1 << 40, 0, 0)
    from megawino.direct.plan import DirectPlan
    monkeypatch.setattr(workspace, "PlanWorkspace", out_of_memory)
    monkeypatch.setattr(DirectPlan, "__call__", out_of_memory)
    with pytest.raises(MemoryError, match="split the batch"):
        runtime.choose_algo(LayerSpec(2, 40, 24, 23, 13))


def test_choice_timing_gpu_leaves_the_host_out():
    """Two candidates: one that costs the host 300 µs a call and the GPU almost nothing, one that
    costs the GPU 100 µs and the host nothing.  Burst timing (the default) ranks the host-heavy one
    slower; GPU timing ranks it faster, so only the GPU's time was counted."""
    from megawino.gpu import algo_choice
    from megawino.gpu.timing import gpu_spin
    cp = _cp()
    tiny = cp.zeros(16, dtype=cp.float32)

    def host_heavy():
        end = time.perf_counter() + 300e-6
        while time.perf_counter() < end:
            pass
        tiny.fill(1.0)

    def gpu_heavy():
        assert gpu_spin(100_000)
    candidates = {"host_heavy": host_heavy, "gpu_heavy": gpu_heavy}
    burst = algo_choice.measure(candidates)
    gpu = algo_choice.measure(candidates, gpu_time=True)
    assert burst["host_heavy"] > 250 and burst["host_heavy"] > burst["gpu_heavy"], burst
    assert gpu["host_heavy"] < 50 and 90 < gpu["gpu_heavy"] < 200, gpu
