"""GPU runtime entry points: :func:`plan`, :func:`conv2d`, :func:`synchronize`.

* :func:`plan` makes a reusable plan for one layer shape (megawino.gpu.winograd_plan.Plan for the Winograd
  algos, megawino.direct.plan.DirectPlan for the direct path).
* :func:`conv2d` validates its arguments, checks its arrays as the plans do
  (megawino.gpu.call_checks.check_call), picks the algorithm (``"auto"``: the fastest of the
  megakernel, the non-fused kernels and the direct path, measured once per shape and GPU:
  megawino.gpu.algo_choice) and launches a cached plan through its route (megawino.gpu.route:
  with a weight token, a launcher bound once), asynchronously on CuPy's current stream.
  NumPy inputs run the CPU reference path (megawino.cpu.executor.conv2d_cpu).
* Plans are cached per (device, shape, algorithm, GEMM arithmetic) in a thread-safe LRU of
  ``MEGAWINO_PLAN_CACHE`` entries (default 512: DenseNet-161 alone has 86 conv shapes), never
  evicting a plan a captured CUDA graph uses; :func:`clear_cache` frees plans and prepared
  weights (not while such a graph is still replayed).

Nothing here touches CUDA at import time; CuPy is imported on first use.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from .gpu import algo_choice, weights
from .gpu.algo_choice import choose_fastest
from .gpu.nvrtc import DEFAULT_GEMM_MATH, WINOGRAD_ALGOS, as_cupy, check_gemm_math, cupy_module, gpu_available
from .gpu.route import forget as forget_routes, launch as launch_route, route as plan_route
from .gpu.call_checks import check_call, check_options, env_number, ready_arrays
from .direct.plan import DirectPlan
from .direct.pointwise import PointwisePlan, check_pointwise
from .gpu.winograd_plan import Plan, WatchdogError, synchronize
from .core.resources import cuda_dir, source_hash
from .core.arguments import check_float32, pair_argument
from .core.spec import LayerSpec
from .core.tasks import TaskParams
from .gpu.workspace import set_allocator

__all__ = ["plan", "conv2d", "synchronize", "clear_cache", "set_allocator", "choose_fastest",
           "choose_algo", "candidate_algos", "cached_plan", "Plan", "DirectPlan", "PointwisePlan", "WatchdogError", "gpu_available", "cuda_dir",
           "source_hash"]

ALGOS = WINOGRAD_ALGOS + ("direct", "pointwise")
LAYOUTS = ("NCHW", "NHWC")
ENV_PLAN_CACHE = "MEGAWINO_PLAN_CACHE"
PLAN_CACHE_MAX = 1 << 20          # plans: far more shapes than any network has


def plan(spec: LayerSpec, params: TaskParams | None = None, mapping=None, algo: str = "megakernel",
         timeout_s: float | None = None, trace: bool = False, gemm_math: str = DEFAULT_GEMM_MATH,
         ring_buffers: bool | None = None):
    """A reusable plan for one layer shape: a Winograd plan for ``megakernel`` / ``nonfused``, a
    direct plan for ``direct``, a pointwise plan (1x1 stride-1 layers) for ``pointwise``.  ``gemm_math``: how the Winograd GEMM multiplies, ``"3xtf32"``
    (default), ``"ffma"`` or ``"bf16x3"``; ``timeout_s``: the watchdog limit (default ``$MEGAWINO_WATCHDOG_S``
    or 2 s); ``ring_buffers`` (megakernel): V and M hold only the fewest groups the ticket order
    allows (a fraction of the memory, at the cost of the ring's waits); None (the default):
    where whole V and M would take more than a quarter of the GPU's memory."""
    check_gemm_math(gemm_math)
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
    if algo in ("direct", "pointwise") and ring_buffers:
        raise ValueError(f"ring_buffers needs algo='megakernel', got algo={algo!r}")
    if algo == "direct":
        if params is not None or mapping is not None or trace:
            raise ValueError("algo='direct' takes no task params, mapping or trace")
        return DirectPlan(spec)
    if algo == "pointwise":
        if params is not None or mapping is not None or trace:
            raise ValueError("algo='pointwise' takes no task params, mapping or trace")
        return PointwisePlan(spec, gemm_math=gemm_math)
    return Plan(spec, params=params, mapping=mapping, algo=algo, timeout_s=timeout_s, trace=trace,
                gemm_math=gemm_math, ring_buffers=ring_buffers)


class _PlanCache:
    """Thread-safe LRU of plans keyed by (device, spec, algo, gemm_math); a plan it drops is
    marked ``evicted`` (a launcher that holds it stops using it)."""

    def __init__(self):
        self._plans: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self._making: dict = {}

    def get(self, key, make):
        with self._lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                return found
            maker_lock = self._making.setdefault(key, threading.Lock())
        with maker_lock:                      # one thread compiles a shape, the others wait
            with self._lock:
                found = self._plans.get(key)
            if found is None:
                found = make()
                with self._lock:
                    self._plans[key] = found
                    limit = _plan_cache_limit()
                    for old_key in [k for k, p in self._plans.items()
                                    if not getattr(p, "captured", False) and k != key]:
                        if len(self._plans) <= limit:
                            break
                        _evict(self._plans.pop(old_key))
                    self._making.pop(key, None)
        return found

    def discard(self, key) -> None:
        with self._lock:
            found = self._plans.pop(key, None)
        if found is not None:
            _evict(found)

    def clear(self) -> None:
        with self._lock:
            for found in self._plans.values():
                _evict(found)
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


def _evict(found) -> None:
    """Mark a plan the cache dropped (the launchers that hold it stop using it) and drop its
    routes, which would keep its workspaces alive."""
    found.evicted = True
    forget_routes(found)


def _plan_cache_limit() -> int:
    return env_number(ENV_PLAN_CACHE, 512, int, 1, PLAN_CACHE_MAX)


PLANS = _PlanCache()
_RESOLVED: dict = {}       # conv2d's arguments -> (LayerSpec, algorithm): the per-call fast path


def clear_cache() -> None:
    """Free the cached plans (their workspaces) and the prepared weights."""
    PLANS.clear()
    _RESOLVED.clear()
    weights.CACHE.clear()


def cached_plan(spec: LayerSpec, algo: str, gemm_math: str, device: int):
    """The plan :func:`conv2d` runs for ``spec`` and ``algo`` on ``device``, the current device
    (made and cached when missing): for callers that have checked their arrays themselves."""
    return PLANS.get((device, spec, algo, gemm_math), lambda: plan(spec, algo=algo, gemm_math=gemm_math))


def route(spec: LayerSpec, algo: str, gemm_math: str, device: int, w, weight_token):
    """The route (megawino.gpu.route.Route) of :func:`cached_plan` bound to the weight ``w``
    under ``weight_token`` on the current stream: for callers that have checked their arrays
    themselves (megawino.torch after a layer's first call)."""
    return plan_route(cached_plan(spec, algo, gemm_math, device), w, weight_token)


def candidate_algos(spec: LayerSpec) -> tuple[str, ...]:
    """The algorithms that can run ``spec``, in ALGOS order."""
    from .direct import check_spec
    checks = {"megakernel": spec.require_winograd, "nonfused": spec.require_winograd,
              "direct": lambda: check_spec(spec), "pointwise": lambda: check_pointwise(spec)}
    names = []
    for algo in ALGOS:
        try:
            checks[algo]()
        except ValueError:
            continue
        names.append(algo)
    return tuple(names)


def choose_algo(spec: LayerSpec, gemm_math: str = DEFAULT_GEMM_MATH, prepared_weights: bool = False) -> str:
    """The fastest of the algorithms that can run ``spec`` on this GPU (measured once per shape,
    cached in the user's cache directory; a shape only one algorithm takes is not measured).
    ``prepared_weights``: time the calls as a caller with a weight token makes them (the filter
    transform or packing skipped)."""
    names = candidate_algos(spec)
    if not names:
        raise ValueError(f"no megawino algorithm runs {spec.describe()}")
    if len(names) == 1:
        return names[0]
    cupy = cupy_module()
    key = (f"{spec.with_(name='').shape_string}/{spec.layout}/{gemm_math}/"
           f"{'prepared' if prepared_weights else 'raw'}/{source_hash()[:12]}")
    known = algo_choice.cached_choice(key)
    if known in names:
        return known
    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.standard_normal(spec.input_shape, dtype=np.float32))
    w = cupy.asarray(rng.standard_normal(spec.weight_shape, dtype=np.float32))
    y = cupy.empty(spec.output_shape, dtype=cupy.float32)
    device = cupy.cuda.Device().id
    candidates = {}
    for algo in names:
        try:
            p = PLANS.get((device, spec, algo, gemm_math),
                          lambda a=algo: plan(spec, algo=a, gemm_math=gemm_math))
        except ValueError:        # a limit the shape checks do not cover (workspace size)
            continue
        token = ("choose_algo", spec, algo) if prepared_weights else None
        run = lambda p=p, token=token: p(x, w, out=y, check=False, weight_token=token)  # noqa: E731
        try:
            run()                 # allocates the workspace
        except cupy.cuda.memory.OutOfMemoryError:   # e.g. the non-fused path's whole V and M of a
            PLANS.discard((device, spec, algo, gemm_math))   # layer the megakernel runs in a ring
            continue
        candidates[algo] = run
    if not candidates:
        raise MemoryError(f"no megawino algorithm for {spec.describe()} fits the GPU's free memory "
                          "(split the batch into smaller calls)")
    choice = choose_fastest(key, candidates)
    for algo in candidates:
        if algo != choice:                    # the losers' workspaces are not kept
            PLANS.discard((device, spec, algo, gemm_math))
    return choice


def _conv_cpu(x, w, stride, padding, algo, layout, gemm_math, out):
    from .cpu.executor import conv2d_cpu
    if out is not None:
        raise ValueError("out= is not supported on the CPU reference path")
    if stride != 1 or w.shape[2:] != (3, 3):
        raise ValueError("NumPy inputs run the CPU reference path (megawino.conv2d_cpu), which takes "
                         f"3x3 stride-1 layers only; got a {w.shape[2]}x{w.shape[3]} filter at stride "
                         f"{stride}: pass CuPy arrays to run it on the GPU")
    if algo not in ("auto", "cpu"):
        raise ValueError(f"NumPy inputs run on the CPU: algo must be 'auto' or 'cpu', got {algo!r}")
    return conv2d_cpu(x, w, padding=padding, layout=layout)


def conv2d(x, w, stride=1, padding=1, algo: str = "auto", layout: str = "NCHW",
           gemm_math: str = DEFAULT_GEMM_MATH, out=None, weight_token=None, check: bool = True):
    """Convolution (cross-correlation).  ``x`` is [N][C][H][W] (NCHW) or [N][H][W][C] (NHWC),
    ``w`` is [K][C][R][S]; returns the output in the input's layout (``out`` when given).
    ``stride`` and ``padding``: an int, or an (h, w) pair (run by the direct path).

    CuPy arrays (or DLPack GPU tensors) run on the GPU, asynchronously on CuPy's current stream;
    NumPy arrays run the CPU reference path.  ``algo``: ``"auto"`` (the fastest for the shape),
    ``megakernel``, ``nonfused`` or ``direct``.  ``gemm_math``: the Winograd GEMM's arithmetic.
    ``weight_token``: a hashable naming this weight's contents; prepared weights are reused while
    it stays the same.  ``check``: raise first for an earlier launch whose watchdog fired."""
    stride = pair_argument("stride", stride, 1)
    padding = pair_argument("padding", padding, 0)
    if algo not in ("auto", "cpu") + ALGOS:
        raise ValueError(f"algo must be one of {('auto',) + ALGOS}, got {algo!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_gemm_math(gemm_math)
    check_options(check, weight_token)
    for name, arr in (("x", x), ("w", w)):
        if getattr(arr, "ndim", None) != 4:
            raise ValueError(f"{name} must be a 4-D array, got {type(arr).__name__} with shape "
                             f"{tuple(getattr(arr, 'shape', ()))}")
    if isinstance(x, np.ndarray) or isinstance(w, np.ndarray):
        if not (isinstance(x, np.ndarray) and isinstance(w, np.ndarray)):
            raise ValueError("x and w must both be NumPy arrays (CPU) or both GPU arrays")
        for name, arr in (("x", x), ("w", w)):
            check_float32(name, arr)
        return _conv_cpu(x, w, stride, padding, algo, layout, gemm_math, out)
    if algo == "cpu":
        raise ValueError("algo='cpu' needs NumPy arrays")
    cupy = cupy_module()
    x, w = as_cupy(x, "x"), as_cupy(w, "w")
    device = cupy.cuda.runtime.getDevice()
    key = (device, x.shape, w.shape, stride, padding, layout, algo, gemm_math, weight_token is not None)
    resolved = _RESOLVED.get(key)
    if resolved is None:
        n, c, h, wd = x.shape if layout == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
        k, c2, r, s = w.shape
        if c2 != c:
            raise ValueError(f"x has C={c} channels but w expects C={c2}")
        spec = LayerSpec(int(n), int(c), int(k), int(h), int(wd), int(r), int(s), stride, padding, layout)
    else:
        spec, algo = resolved
    if out is not None:
        out = as_cupy(out, "out")
    check_call(cupy, spec, device, x, w, out)      # the plans' own checks, before anything launches
    if resolved is None:
        if algo == "auto":
            algo = choose_algo(spec, gemm_math, prepared_weights=weight_token is not None)
        if len(_RESOLVED) >= 4096:
            _RESOLVED.clear()
        _RESOLVED[key] = (spec, algo)
    p = PLANS.get((device, spec, algo, gemm_math), lambda: plan(spec, algo=algo, gemm_math=gemm_math))
    x, ready_w, out = ready_arrays(spec, x, w, out)
    return launch_route(p, x, ready_w, out, check, weight_token, copied_weight=ready_w is not w)
