"""CUDA-event timing shared by ``megawino sweep``, ``megawino tune`` and the bench
scripts, so that their numbers agree: warm-up, inputs rotated among enough sets
that the L2 cannot serve repeats, median of per-call event timings.

Nothing here imports CuPy at import time.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

MiB = 1 << 20
L2_BYTES_DEFAULT = 50 * MiB      # H100 SXM; the device's own value is used when known


def l2_bytes() -> int:
    """The current device's L2 size (the H100's when unknown)."""
    try:
        import cupy
        return int(cupy.cuda.Device().attributes["L2CacheSize"]) or L2_BYTES_DEFAULT
    except Exception:
        return L2_BYTES_DEFAULT


def device_rotation_sets(bytes_per_set: int, budget_bytes: int = 2 << 30) -> int:
    """:func:`rotation_sets` for the current device: its L2 size, and at most
    ``budget_bytes`` or an eighth of the free memory for all the sets."""
    import cupy
    free = cupy.cuda.Device().mem_info[0]
    return rotation_sets(bytes_per_set, l2_bytes(), budget_bytes=min(budget_bytes, free // 8))


def rotated_inputs(spec, rng, budget_bytes: int = 2 << 30):
    """(xs, w) on the GPU: :func:`device_rotation_sets` standard-normal float32 inputs of
    ``spec`` (so the L2 cannot serve repeats) and one filter, drawn from ``rng`` in that order."""
    import cupy
    import numpy as np
    sets = device_rotation_sets(4 * int(np.prod(spec.input_shape)), budget_bytes=budget_bytes)
    xs = [cupy.asarray(rng.standard_normal(spec.input_shape, dtype=np.float32)) for _ in range(sets)]
    w = cupy.asarray(rng.standard_normal(spec.weight_shape, dtype=np.float32))
    return xs, w


def suite_layer_inputs(batch, layers, seed: int = 0, budget_bytes: int = 1 << 30):
    """(spec, xs, w, out) for each selected Winograd suite layer (``layers``: comma-separated
    names or None for all): :func:`rotated_inputs` from one generator seeded ``seed`` and an
    uninitialised float32 output."""
    import cupy
    import numpy as np
    from ..core.suite import load_suite, select_specs
    rng = np.random.default_rng(seed)
    for spec in select_specs(load_suite(suite="winograd", batch=batch), layers):
        xs, w = rotated_inputs(spec, rng, budget_bytes=budget_bytes)
        yield spec, xs, w, cupy.empty(spec.output_shape, dtype=cupy.float32)


def rotation_sets(bytes_per_set: int, l2_bytes: int = L2_BYTES_DEFAULT, factor: float = 3.0,
                  min_sets: int = 2, max_sets: int = 64, budget_bytes: int | None = None) -> int:
    """How many input sets to rotate among so that the L2 cannot serve repeats.

    ceil(factor * L2 / bytes_per_set), capped by ``max_sets`` and by what fits in
    ``budget_bytes``, and never fewer than ``min_sets``.
    """
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    n = math.ceil(factor * l2_bytes / bytes_per_set)
    n = min(n, max_sets)
    if budget_bytes is not None:
        n = min(n, budget_bytes // bytes_per_set)
    return int(max(min_sets, n))


# ---------------------------------------------------------------------------
# CUDA-event timing (CuPy events on CuPy's current stream)
# ---------------------------------------------------------------------------

_SPIN_SOURCE = r"""
extern "C" __global__ void bench_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
"""
_spin_kernel = None


def gpu_spin(ns: int) -> bool:
    """Enqueue a one-thread kernel that keeps the stream busy for ``ns`` ns, so the
    host can queue the timed launches behind it and the GPU then runs them back to
    back (no launch gaps in the numbers). False when the kernel is not available."""
    global _spin_kernel
    if _spin_kernel is False:
        return False
    try:
        import cupy
        if _spin_kernel is None:
            _spin_kernel = cupy.RawKernel(_SPIN_SOURCE, "bench_spin")
        _spin_kernel((1,), (1,), (cupy.uint64(int(ns)),))
        return True
    except Exception:            # no NVRTC, or compilation failed: time without it
        _spin_kernel = False
        return False


def time_cuda_stats(fn: Callable, inputs_list: Sequence, warmup: int = 5, reps: int = 20,
                    spin_us_per_rep: float = 100.0, check: Callable | None = None) -> dict:
    """Time ``fn(inputs)`` with CUDA events, rotating through ``inputs_list``.

    ``warmup`` untimed calls first (module load, autotuning, compilation), then
    ``reps`` calls, each between its own pair of events on CuPy's current stream
    (PyTorch and cuDNN must run on that stream too: both use the legacy default
    stream unless told otherwise). A spin kernel queued in front lets the host
    run ahead of the GPU. Returns median / min / max / mean microseconds, the host
    enqueue time per call and ``host_bound`` (the host could not stay ahead).
    ``check()`` (e.g. a plan's watchdog check) runs after the warm-up and at the end.
    """
    import cupy
    if not inputs_list:
        raise ValueError("inputs_list is empty")
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    n = len(inputs_list)
    for i in range(warmup):
        fn(inputs_list[i % n])
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    if check is not None:
        check()
    starts = [cupy.cuda.Event() for _ in range(reps)]
    ends = [cupy.cuda.Event() for _ in range(reps)]
    spin_ns = int(min(50e6, 1e6 + reps * spin_us_per_rep * 1e3))
    spun = gpu_spin(spin_ns)
    host0 = time.perf_counter()
    for i in range(reps):
        starts[i].record(stream)
        fn(inputs_list[(warmup + i) % n])
        ends[i].record(stream)
    host_s = time.perf_counter() - host0
    ends[-1].synchronize()
    times = [cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in zip(starts, ends)]
    total = cupy.cuda.get_elapsed_time(starts[0], ends[-1]) * 1e3
    if check is not None:
        check()
    return {
        "median_us": statistics.median(times),
        "min_us": min(times),
        "max_us": max(times),
        "mean_us": total / reps,          # back-to-back throughput, gaps included
        "reps": reps,
        "warmup": warmup,
        "sets": n,
        "host_enqueue_us": host_s * 1e6 / reps,
        "host_bound": (not spun) or host_s * 1e9 > spin_ns,
    }


def time_cuda(fn: Callable, inputs_list: Sequence, warmup: int = 5, reps: int = 20) -> float:
    """Median microseconds of ``fn(inputs)`` (see :func:`time_cuda_stats`)."""
    return time_cuda_stats(fn, inputs_list, warmup, reps)["median_us"]


def gpu_rel_l2(out, ref, chunks: int = 8) -> float:
    """||out - ref|| / ||ref|| in float64 on the GPU (CuPy arrays of one shape),
    chunked along axis 0 to bound the float64 temporaries. NaN if out has NaN."""
    import cupy
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"shapes differ: {tuple(out.shape)} vs {tuple(ref.shape)}")
    num = den = 0.0
    step = max(1, -(-out.shape[0] // chunks))
    for i in range(0, out.shape[0], step):
        o = out[i:i + step].astype(cupy.float64)
        r = ref[i:i + step].astype(cupy.float64)
        num += float(cupy.sum((o - r) ** 2))
        den += float(cupy.sum(r * r))
    return math.sqrt(num) / (math.sqrt(den) if den > 0 else 1.0)


def host_time_per_call(call: Callable, calls: int, synchronize: Callable, warmup: int = 20) -> tuple[float, float]:
    """(host µs, total µs) per call of ``calls`` back-to-back calls: the time to issue them
    without waiting, and the time until ``synchronize()`` returned after them."""
    for _ in range(warmup):
        call()
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    issued = time.perf_counter()
    synchronize()
    done = time.perf_counter()
    return (issued - start) / calls * 1e6, (done - start) / calls * 1e6
