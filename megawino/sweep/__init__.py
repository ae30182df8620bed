"""Run the conv layers of a network (or any list of layers) and check them.

The sweep logic behind ``megawino sweep``, usable from bench scripts:

>>> from megawino import sweep
>>> layers = sweep.select_layers("resnet50", batch=1)
>>> result = sweep.run_sweep(layers, backend="cpu")
>>> result.failures, result.total_ms

Per layer: fresh float32 inputs (NumPy ``default_rng(seed)`` standard normal,
never zeros), the layer run on the chosen backend (timed), and the relative
L2 error of the output against the float64 direct convolution
(:func:`megawino.core.winograd.direct_conv_nchw`) of the same float32 inputs.

Backends:

``cpu``  3x3 stride-1 layers run through the CPU executor (task list in the
         interleaved mapping, default task and mapping parameters:
         ``"cpu-executor"``); other layers through a NumPy float32 direct
         convolution (``"cpu-direct"``).  Timings are CPU timings.
``gpu``  3x3 stride-1 layers through ``runtime.plan`` (``"megakernel"``); other
         layers through ``runtime.plan(spec, algo="direct")`` (``"gpu-direct"``).  Times are
         CUDA-event medians after a warm-up run; the float64 reference is
         computed on the GPU (same loop as ``direct_conv_nchw``).
``auto`` ``gpu`` when the runtime imports and finds a GPU, else ``cpu``.

GPU detection and the GPU runs: :mod:`megawino.sweep.gpu`; the CPU runs, the batched float64
reference and the CPU time / memory estimate: :mod:`megawino.sweep.cpu` (re-exported here).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from ..core.networks import NetworkLayer, network_layers
from ..core.spec import LayerSpec
from .cpu import (CPU_MAX_RUNS, CpuEstimate, direct_conv_float32, estimate_cpu, random_inputs, rel_error_cpu,
                        run_layer_cpu)
from .gpu import gpu_info, gpu_runtime, gpu_status, run_layer_gpu

__all__ = [
    "CPU_TOLERANCE", "GPU_TOLERANCE", "LayerResult", "SweepResult", "gpu_runtime", "gpu_status",
    "resolve_backend", "select_layers", "random_inputs", "direct_conv_float32", "run_layer",
    "run_sweep", "machine_info", "megawino_version", "CpuEstimate", "estimate_cpu",
]

CPU_TOLERANCE = 1e-5   # F(4x4, 3x3) float32 on the CPU executor (and the float32 direct conv)
GPU_TOLERANCE = 3e-6   # on the GPU
SKIPPED_DIRECT = "skipped: direct path not built"
BACKENDS = ("auto", "cpu", "gpu")


# ---------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------

def megawino_version() -> str:
    from .. import __version__
    return __version__


def resolve_backend(backend: str = "auto") -> str:
    """``"cpu"`` or ``"gpu"``; ValueError for an unknown name or ``gpu`` without a GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "cpu":
        return "cpu"
    available = gpu_runtime() is not None
    if backend == "gpu" and not available:
        raise ValueError("backend gpu: no GPU found (or the GPU runtime is not available); "
                         "use --backend cpu or auto")
    return "gpu" if available else "cpu"


def machine_info(backend: str | None = None) -> dict:
    """What ran the sweep: OS, CPU, Python and library versions, and the GPU when used."""
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    if backend == "gpu":
        info.update(gpu_info())
    return info


# ---------------------------------------------------------------------------
# Layer selection
# ---------------------------------------------------------------------------

def select_layers(network: str, batch: int = 1, resolution: int | None = None,
                  all_layers: bool = False, names: Sequence[str] | None = None,
                  layout: str = "NCHW") -> list[NetworkLayer]:
    """Layers of ``network`` to sweep, in network order.

    Default: the 3x3 stride-1 (Winograd) layers; ``all_layers``: every conv layer.
    ``names`` picks layers by name, full (``resnet50.conv2_x``) or without the
    network prefix (``conv2_x``), from all conv layers; ValueError (with close
    matches) for a name the network lacks.
    """
    everything = network_layers(network, batch, resolution, winograd_only=False, layout=layout)
    if not names:
        return [l for l in everything if all_layers or l.spec.winograd_eligible]
    by_name = {l.name: l for l in everything}
    prefix = everything[0].name.split(".", 1)[0] + "." if everything else ""
    wanted: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if not name:
            continue
        full = name if name.startswith(prefix) else prefix + name
        if full not in by_name:
            import difflib
            close = difflib.get_close_matches(full, list(by_name), n=4, cutoff=0.6)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise ValueError(f"{prefix[:-1]} has no layer {raw.strip()!r}{hint} "
                             f"(`megawino layers {prefix[:-1]}` lists them)")
        if full not in wanted:
            wanted.append(full)
    if not wanted:
        raise ValueError("no layer names given")
    return [by_name[n] for n in by_name if n in wanted]


# ---------------------------------------------------------------------------
# Inputs and direct convolution
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class LayerResult:
    name: str
    spec: LayerSpec
    count: int
    backend: str                 # "megakernel", "gpu-direct", "cpu-executor", "cpu-direct", "skipped: ..."
    time_ms: float | None        # best CPU run or median GPU run; None when skipped
    rel_error: float | None      # rel. L2 error vs the float64 reference; None when skipped
    tolerance: float | None
    note: str = ""
    error: str = ""              # the exception text when the layer failed to run
    cudnn_ms: float | None = None   # cuDNN float32 best (NCHW / channels_last), --compare cudnn
    parameters_from: dict | None = None   # the table (or heuristic) of a Winograd plan's parameters

    @property
    def speedup(self) -> float | None:
        """cuDNN time over ours (> 1: we are faster)."""
        return self.cudnn_ms / self.time_ms if self.cudnn_ms and self.time_ms else None

    @property
    def skipped(self) -> bool:
        return self.time_ms is None and not self.error

    @property
    def passed(self) -> bool | None:
        """None when skipped; False when it failed to run or its error is above the
        tolerance (or NaN)."""
        if self.error:
            return False
        if self.rel_error is None or self.tolerance is None:
            return None
        return bool(math.isfinite(self.rel_error) and self.rel_error <= self.tolerance)

    @property
    def tflops(self) -> float | None:
        """Direct-equivalent TFLOP/s (direct FLOPs over the measured time)."""
        if not self.time_ms:
            return None
        return self.spec.direct_flops / (self.time_ms * 1e-3) / 1e12

    @property
    def total_ms(self) -> float | None:
        return None if self.time_ms is None else self.time_ms * self.count

    def to_dict(self) -> dict:
        s = self.spec
        return {
            "name": self.name, "count": self.count,
            "N": s.N, "C": s.C, "K": s.K, "H": s.H, "W": s.W, "R": s.R, "S": s.S,
            "stride": s.stride, "padding": s.padding, "layout": s.layout, "dtype": s.dtype,
            "shape": s.shape_string, "direct_flops": s.direct_flops,
            "backend": self.backend, "time_ms": _finite(self.time_ms),
            "total_ms": _finite(self.total_ms), "rel_error": _finite(self.rel_error),
            "tolerance": self.tolerance, "passed": self.passed, "tflops": _finite(self.tflops),
            "note": self.note, "error": self.error or None,
            "cudnn_ms": _finite(self.cudnn_ms), "speedup_vs_cudnn": _finite(self.speedup),
            "parameters_from": self.parameters_from,
        }


def _finite(value):
    """JSON has no NaN / Infinity: those become null (``passed`` says false)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclasses.dataclass
class SweepResult:
    layers: list[LayerResult]
    backend: str                                  # "cpu" or "gpu"
    network: str | None = None
    batch: int | None = None
    resolution: int | None = None
    seed: int = 0
    machine: dict = dataclasses.field(default_factory=dict)
    version: str = dataclasses.field(default_factory=megawino_version)
    date: str = dataclasses.field(default_factory=lambda: datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds"))
    wall_s: float = 0.0

    @property
    def failures(self) -> list[LayerResult]:
        return [r for r in self.layers if r.passed is False]

    @property
    def skipped(self) -> list[LayerResult]:
        return [r for r in self.layers if r.skipped]

    @property
    def total_ms(self) -> float:
        """Sum over the layers run of time x count (one pass of those layers)."""
        return float(sum(r.total_ms for r in self.layers if r.total_ms is not None))

    @property
    def geomean_speedup(self) -> float | None:
        """Geometric mean over the layers of cuDNN time / our time (--compare cudnn)."""
        ratios = [r.speedup for r in self.layers if r.speedup]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None

    @property
    def total_flops(self) -> int:
        return sum(r.spec.direct_flops * r.count for r in self.layers if not r.skipped)

    def to_dict(self) -> dict:
        return {
            "megawino_version": self.version, "date": self.date, "machine": self.machine,
            "network": self.network, "batch": self.batch, "resolution": self.resolution,
            "backend": self.backend, "seed": self.seed,
            "reference": "float64 direct convolution of the same float32 inputs",
            "time": f"CPU wall time, best of up to {CPU_MAX_RUNS} runs" if self.backend == "cpu"
                    else "median of CUDA-event timed runs after a warm-up",
            "layers": [r.to_dict() for r in self.layers],
            "total_ms": self.total_ms, "total_direct_flops": self.total_flops,
            "geomean_speedup_vs_cudnn": self.geomean_speedup,
            "failures": [r.name for r in self.failures],
            "skipped": [r.name for r in self.skipped],
            "wall_s": round(self.wall_s, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def write_json(self, path) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

def _as_layer(layer) -> NetworkLayer:
    if isinstance(layer, NetworkLayer):
        return layer
    if isinstance(layer, LayerSpec):
        return NetworkLayer(layer, 1)
    raise TypeError(f"expected a NetworkLayer or LayerSpec, got {type(layer).__name__}")


def run_layer(layer, backend: str = "cpu", seed: int | np.random.Generator = 0,
              task_params=None, mapping_params=None, compare: str | None = None) -> LayerResult:
    """Run one layer (NetworkLayer or LayerSpec) on ``backend`` ("cpu" or "gpu";
    "auto" resolves first) and check it against the float64 reference."""
    layer = _as_layer(layer)
    spec = layer.spec
    backend = resolve_backend(backend)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    x, w = random_inputs(spec, rng)
    name = spec.name or spec.shape_string
    if backend == "cpu":
        used, ms, y = run_layer_cpu(spec, x, w, task_params, mapping_params)
        return LayerResult(name, spec, layer.count, used, ms, rel_error_cpu(y, x, w, spec), CPU_TOLERANCE)
    used, ms, err, cudnn_ms, source = run_layer_gpu(gpu_runtime(), spec, x, w, rng, compare)
    tolerance = None if ms is None else GPU_TOLERANCE     # None: skipped
    return LayerResult(name, spec, layer.count, used, ms, err, tolerance, cudnn_ms=cudnn_ms, parameters_from=source)


def run_sweep(layers: Iterable, backend: str = "auto", seed: int = 0,
              on_start: Callable[[int, NetworkLayer], None] | None = None,
              on_done: Callable[[int, LayerResult], None] | None = None,
              network: str | None = None, batch: int | None = None,
              resolution: int | None = None, keep_going: bool = True,
              compare: str | None = None) -> SweepResult:
    """Run every layer (each with inputs from ``default_rng(seed + i)``); callbacks
    get the layer's position before and after it runs (for progress bars).
    ``keep_going``: a layer that raises is recorded (backend "error", ``error`` set,
    failed) and the sweep goes on; False re-raises."""
    resolved = resolve_backend(backend)
    layers = [_as_layer(l) for l in layers]
    results = []
    t0 = time.perf_counter()
    for i, layer in enumerate(layers):
        if on_start is not None:
            on_start(i, layer)
        try:
            result = run_layer(layer, resolved, np.random.default_rng(seed + i), compare=compare)
        except (KeyboardInterrupt, MemoryError):
            raise
        except Exception as exc:   # one broken layer must not lose the rest of the sweep
            if not keep_going:
                raise
            result = LayerResult(layer.name, layer.spec, layer.count, "error", None, None, None,
                                 error=f"{type(exc).__name__}: {exc}")
        results.append(result)
        if on_done is not None:
            on_done(i, result)
    return SweepResult(layers=results, backend=resolved, network=network, batch=batch,
                       resolution=resolution, seed=seed, machine=machine_info(resolved),
                       wall_s=time.perf_counter() - t0)
