"""The CPU side of :mod:`megawino.sweep`: running and timing one layer on the CPU, the
float64 reference computed a batch of images at a time, and the estimate of a CPU sweep's
time and peak memory that ``megawino sweep`` shows (and asks ``--yes`` for) before it starts.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time

import numpy as np

from ..core.spec import LayerSpec

CPU_MAX_RUNS = 3       # CPU timing: best of up to this many runs ...
CPU_BUDGET_S = 0.5     # ... while they take less than this in all
REFERENCE_BUDGET = 256 << 20   # bytes the CPU direct convolution (and the float64 reference) use per batch
CONFIRM_SECONDS = 60.0         # a CPU sweep estimated to take longer than this needs --yes
CONFIRM_BYTES = 4 << 30        # ... as does one estimated to peak above this many bytes
QUICK_FLOPS = 20e9             # a CPU sweep of fewer direct FLOPs is not timed before it starts
PROBE_SIDE = 56                # the time estimate runs one image of at most this height and width


def random_inputs(spec: LayerSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Standard-normal float32 x (NCHW, whatever the spec's layout) and w (KCRS)."""
    x = rng.standard_normal((spec.N, spec.C, spec.H, spec.W), dtype=np.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
    return x, w


def _to_layout(x_nchw, layout: str, xp):
    return x_nchw if layout == "NCHW" else xp.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1))


def _from_layout(y, layout: str, xp):
    return y if layout == "NCHW" else xp.ascontiguousarray(y.transpose(0, 3, 1, 2))


def direct_conv_float32(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0) -> np.ndarray:
    """Direct convolution (cross-correlation) in float32 with NumPy, NCHW x KCRS -> NKHW:
    the CPU path for layers the Winograd executor does not take (1x1, 7x7, strided)."""
    from ..core.winograd import direct_conv_nchw
    return direct_conv_nchw(np.asarray(x, dtype=np.float32), np.asarray(w, dtype=np.float32),
                            stride, padding, np.float32)


def run_layer_cpu(spec: LayerSpec, x: np.ndarray, w: np.ndarray, task_params=None,
                  mapping_params=None) -> tuple[str, float, np.ndarray]:
    """(backend, best time in ms, y NCHW): the executor for 3x3 stride-1 layers, else the
    float32 direct convolution; both a batch of images at a time."""
    if spec.winograd_eligible:
        from ..cpu.executor import run_in_batches
        xin = _to_layout(x, spec.layout, np)
        ms, y = _cpu_time_ms(lambda: run_in_batches(spec, xin, w, task_params, mapping_params))
        return "cpu-executor", ms, _from_layout(y, spec.layout, np)
    ms, y = _cpu_time_ms(lambda: _direct_in_batches(x, w, spec, np.float32))
    return "cpu-direct", ms, y


def _reference_images(spec: LayerSpec, dtype) -> int:
    """Images per batch of the NumPy direct convolution: its padded input, one gathered
    window and its output, in ``dtype``, within REFERENCE_BUDGET bytes."""
    per_image = np.dtype(dtype).itemsize * (
        2 * spec.C * (spec.H + 2 * spec.pad_h) * (spec.W + 2 * spec.pad_w)
        + 3 * spec.K * spec.out_h * spec.out_w)
    return max(1, min(spec.N, REFERENCE_BUDGET // per_image))


def _direct_in_batches(x: np.ndarray, w: np.ndarray, spec: LayerSpec, dtype) -> np.ndarray:
    """The direct convolution (NCHW) in ``dtype``, a batch of images at a time."""
    from ..core.winograd import direct_conv_nchw
    step = _reference_images(spec, dtype)
    y = np.empty((spec.N, spec.K, spec.out_h, spec.out_w), dtype=dtype)
    for n0 in range(0, spec.N, step):
        y[n0:n0 + step] = direct_conv_nchw(x[n0:n0 + step], w, spec.stride, spec.padding, dtype)
    return y


def rel_error_cpu(y: np.ndarray, x: np.ndarray, w: np.ndarray, spec: LayerSpec) -> float:
    """Relative L2 error of ``y`` (NCHW) against the float64 direct convolution, computed
    a batch of images at a time (the float64 output of a whole large layer would not fit)."""
    from ..core.winograd import direct_conv_nchw
    step = _reference_images(spec, np.float64)
    diff = norm = 0.0
    for n0 in range(0, spec.N, step):
        ref = direct_conv_nchw(x[n0:n0 + step], w, spec.stride, spec.padding)
        diff += float(np.sum(np.square(y[n0:n0 + step] - ref)))
        norm += float(np.sum(np.square(ref)))
    return math.sqrt(diff) / (math.sqrt(norm) if norm > 0 else 1.0)


def _cpu_time_ms(fn, max_runs: int = CPU_MAX_RUNS, budget_s: float = CPU_BUDGET_S):
    """(best wall time in ms, output of the first run): runs ``fn`` again, up to
    ``max_runs`` times, while the time spent stays under ``budget_s`` (CPU timings
    on a shared machine are noisy; the minimum is the most repeatable)."""
    best, out, spent = math.inf, None, 0.0
    for i in range(max_runs):
        t0 = time.perf_counter()
        y = fn()
        elapsed = time.perf_counter() - t0
        if out is None:
            out = y
        best, spent = min(best, elapsed), spent + elapsed
        if spent + elapsed > budget_s:
            break
    return best * 1e3, out




# ---------------------------------------------------------------------------
# Estimate before a CPU sweep
# ---------------------------------------------------------------------------

def layer_peak_bytes(spec: LayerSpec) -> int:
    """Estimated peak memory of one CPU sweep layer: x, w and y (twice each for NHWC, which
    is converted), plus the larger of the executor's batch buffers and the reference's batch."""
    from ..cpu.executor import DEFAULT_MEMORY_BUDGET, _batch_layout, buffer_bytes, images_per_batch
    copies = 1 if spec.layout == "NCHW" else 2
    arrays = 4 * (copies * (math.prod(spec.input_shape) + math.prod(spec.output_shape))
                  + math.prod(spec.weight_shape))
    if spec.winograd_eligible:
        images = images_per_batch(spec)
        # an image whose buffers are more than the budget runs in bands within it
        work = min(buffer_bytes(_batch_layout(spec, images, None, 4)), DEFAULT_MEMORY_BUDGET)
    else:
        work = 0
    reference = 8 * _reference_images(spec, np.float64) * (
        2 * spec.C * (spec.H + 2 * spec.pad_h) * (spec.W + 2 * spec.pad_w)
        + 3 * spec.K * spec.out_h * spec.out_w)
    return arrays + max(work, reference)


def physical_memory_bytes() -> int | None:
    """This machine's RAM (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class CpuEstimate:
    """What a CPU sweep of some layers will take: ``seconds`` (None when the sweep is too
    small to be worth timing, inf when it cannot fit in memory) and ``peak_bytes``."""

    seconds: float | None
    peak_bytes: int

    @property
    def large(self) -> bool:
        return (self.seconds or 0.0) > CONFIRM_SECONDS or self.peak_bytes > CONFIRM_BYTES

    def describe(self) -> str:
        memory = f"{self.peak_bytes / 2**30:.1f} GiB of memory"
        if self.seconds is None:
            return memory
        if not math.isfinite(self.seconds):
            return f"{memory}, more than this machine has"
        minutes = f"{self.seconds / 60:.1f} min" if self.seconds >= 90 else f"{self.seconds:.0f} s"
        return f"about {minutes} and {memory}"


def _run_seconds(spec: LayerSpec) -> float:
    """Wall seconds of one run of ``spec`` and its float64 reference."""
    x, w = random_inputs(spec, np.random.default_rng(0))
    t0 = time.perf_counter()
    if spec.winograd_eligible:
        from ..cpu.executor import run_in_batches
        y = _from_layout(run_in_batches(spec, _to_layout(x, spec.layout, np), w), spec.layout, np)
    else:
        y = _direct_in_batches(x, w, spec, np.float32)
    rel_error_cpu(y, x, w, spec)
    return time.perf_counter() - t0


def probe_seconds(spec: LayerSpec) -> float:
    """Estimated seconds of one CPU sweep layer (one run plus the float64 reference): one and
    two images at most PROBE_SIDE pixels square are timed; the second image's time (the first
    also pays the per-layer work, the filter transform) scales with the images, and both
    scale with the output pixels."""
    small = spec.with_(N=1, H=min(spec.H, PROBE_SIDE), W=min(spec.W, PROBE_SIDE))
    one = _run_seconds(small)
    per_image = _run_seconds(small.with_(N=2)) - one if spec.N > 1 else 0.0
    per_image = max(per_image, one / 8)     # timing noise must not make images free
    pixels = (spec.out_h * spec.out_w) / (small.out_h * small.out_w)
    return (one + per_image * (spec.N - 1)) * pixels


def estimate_cpu(specs) -> CpuEstimate:
    """Peak memory (from the sizes) and time (from :func:`probe_seconds` of each distinct
    layer; not timed below QUICK_FLOPS, nor when the memory is over CONFIRM_BYTES) of a CPU sweep."""
    specs = list(specs)
    peak = max((layer_peak_bytes(s) for s in specs), default=0)
    ram = physical_memory_bytes()
    if ram is not None and peak > ram:
        return CpuEstimate(math.inf, peak)
    # Too much memory is reason enough to ask first: no layer is timed (that would take long
    # on exactly the sweeps that are refused).
    if sum(s.direct_flops for s in specs) < QUICK_FLOPS or peak > CONFIRM_BYTES:
        return CpuEstimate(None, peak)
    probe_seconds(LayerSpec(1, 8, 8, 8, 8))      # warm-up: first-use costs stay out of the estimate
    seconds: dict = {}
    for s in specs:
        key = s.with_(name="")
        if key not in seconds:
            seconds[key] = probe_seconds(key)
    return CpuEstimate(sum(seconds[s.with_(name="")] for s in specs), peak)


def smaller_batch(specs, estimate: CpuEstimate) -> int | None:
    """The largest batch, halving from the specs' own, whose estimate is not large (time
    scales with the images, memory is recomputed); None when even batch 1 is large."""
    specs = list(specs)
    batch = max((s.N for s in specs), default=1)
    while batch > 1:
        batch //= 2
        known = estimate.seconds is not None and math.isfinite(estimate.seconds)
        seconds = estimate.seconds * batch / max(s.N for s in specs) if known else None
        peak = max(layer_peak_bytes(s.with_(N=batch)) for s in specs)
        if not CpuEstimate(seconds, peak).large:
            return batch
    return None
