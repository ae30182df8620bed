"""GPU runtime: plan a layer and run it as the persistent megakernel or as the four
non-fused kernels (compiled by :mod:`megawino.nvrtc`), or on the direct path.

Nothing here touches CUDA at import time; CuPy is imported on first use.

* :func:`plan` / :class:`Plan`: buffers, task records, the ticket mapping and the
  scheduler state of one layer shape, allocated once; ``plan(x, w)`` runs it.
* :func:`conv2d`: one call on CuPy arrays (or anything with ``__dlpack__``), with
  plans cached by (layer spec, algo).

One compiled module serves every layer: layer sizes travel in a runtime
parameter struct (``cuda/params.cuh``); only m, the layout and tracing are
compile-time variants.
"""
from __future__ import annotations

import numpy as np

from . import abi
from . import mapping as mapping_mod
from .resources import cuda_dir, source_hash
from .spec import LayerSpec
from . import tuning
from .nvrtc import (BLOCK_THREADS, DEFAULT_GEMM_MATH, KERNEL_KINDS, as_cupy, blocks_per_sm, check_gemm_math,
                    cupy_module as _cupy, gpu_available, module)
from .tasks import COUNTER_STRIDE, TaskParams, TaskType, build_graph

__all__ = ["plan", "conv2d", "Plan", "DirectPlan", "gpu_available", "cuda_dir", "source_hash"]

ALGOS = KERNEL_KINDS + ("direct",)


def gpu_name_key() -> str:
    """Key of the current GPU's mapping table (``mapping/<key>.json``), e.g. ``h100``."""
    return tuning.current_gpu_key()


# ---------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------

def _resolve_order(graph, mapping) -> np.ndarray:
    """None -> interleaved (default MappingParams); MappingParams -> interleaved with
    them; "sequential" / "interleaved"; or an explicit ticket order (validated)."""
    if mapping is None or (isinstance(mapping, str) and mapping == "interleaved"):
        return mapping_mod.build_interleaved(graph, mapping_mod.MappingParams()).order
    if isinstance(mapping, mapping_mod.MappingParams):
        return mapping_mod.build_interleaved(graph, mapping).order
    if isinstance(mapping, str):
        if mapping == "sequential":
            return mapping_mod.sequential_mapping(graph)
        raise ValueError(f"mapping must be None, 'interleaved', 'sequential', MappingParams "
                         f"or a ticket order, got {mapping!r}")
    if isinstance(mapping, mapping_mod.Mapping):
        mapping = mapping.order
    order = np.asarray(mapping.get() if hasattr(mapping, "get") else mapping)
    if order.dtype.kind not in "iu":
        raise mapping_mod.MappingError(f"a mapping holds integer task ids, got dtype {order.dtype}")
    mapping_mod.validate_mapping(graph, order)
    return order.astype(np.int32)


def _check_array(cupy, name: str, arr, shape) -> None:
    if not isinstance(arr, cupy.ndarray):
        raise ValueError(f"{name} must be a CuPy array, got {type(arr).__name__}")
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, the plan expects {tuple(shape)}")
    if arr.dtype != np.float32:
        raise ValueError(f"{name} has dtype {arr.dtype}, only float32 is supported")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if arr.data.ptr % 16:
        raise ValueError(f"{name} must be 16-byte aligned (the kernels use 16-byte vectors)")
    if arr.device.id != cupy.cuda.Device().id:
        raise ValueError(f"{name} is on device {arr.device.id}, the plan on {cupy.cuda.Device().id}")


class Plan:
    """One layer shape on the GPU: buffers U, V, M, task records, mapping and
    scheduler state, allocated once.  ``plan(x, w)`` runs the layer."""

    def __init__(self, spec: LayerSpec, params: TaskParams | None = None, mapping=None,
                 algo: str = "megakernel", timeout_s: float = 2.0, trace: bool = False,
                 gemm_math: str = DEFAULT_GEMM_MATH):
        cupy = _cupy()
        if not isinstance(spec, LayerSpec):
            raise ValueError(f"spec must be a LayerSpec, got {type(spec).__name__}")
        spec.require_winograd()
        if algo not in KERNEL_KINDS:
            raise ValueError(f"algo must be one of {KERNEL_KINDS}, got {algo!r}")
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number, got {timeout_s!r}")
        if trace and algo != "megakernel":
            raise ValueError("trace=True needs algo='megakernel'")
        self.gemm_math = check_gemm_math(gemm_math)
        self.spec = spec
        self.algo = algo
        self.timeout_s = float(timeout_s)
        self.traced = bool(trace)
        mod = module(algo, params.m if params is not None else 4, spec.layout, trace, self.gemm_math)
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        if algo == "megakernel":
            self._mega = mod.get_function("mw_megakernel")
            self.blocks_per_sm = blocks_per_sm(self._mega)
        else:
            self._kernels = {t: mod.get_function(f"mw_{name}_kernel") for t, name in (
                (TaskType.FILTER, "filter"), (TaskType.INPUT, "input"),
                (TaskType.GEMM, "gemm"), (TaskType.OUTPUT, "output"))}
            self.blocks_per_sm = blocks_per_sm(self._kernels[TaskType.GEMM])
        workers = sms * max(1, self.blocks_per_sm)
        # Parameters: given, else the tuned table for this GPU (tuned / nearest / heuristic).
        self.choice = "given"
        if params is None or mapping is None:
            chosen_params, chosen_mapping, self.choice = tuning.choose(
                spec, gpu_name_key(), params.m if params is not None else 4, workers)
            if params is None:
                params = chosen_params
            if mapping is None:
                mapping = chosen_mapping
        self.params = params
        self.graph = build_graph(spec, self.params)
        self.layout = self.graph.layout
        self.grid = max(1, min(self.graph.num_tasks, workers)) if algo == "megakernel" else None
        # Validate the mapping on the host before anything is allocated or launched.
        self.order = _resolve_order(self.graph, mapping)
        lay = self.layout

        self.U = cupy.empty(lay.u_shape, dtype=cupy.float32)
        self.V = cupy.empty(lay.v_shape, dtype=cupy.float32)
        self.M = cupy.empty(lay.m_shape, dtype=cupy.float32)
        self._records = cupy.asarray(np.ascontiguousarray(self.graph.records, dtype=np.int32))
        self._mapping = cupy.asarray(np.ascontiguousarray(self.order, dtype=np.int32))
        # The megakernel reads a ticket's record in one load (no ticket -> task indirection).
        self._ticket_records = cupy.asarray(np.ascontiguousarray(self.graph.records[self.order], dtype=np.int32))
        self._counters = cupy.zeros(lay.num_counters * COUNTER_STRIDE, dtype=cupy.uint32)
        self._state = cupy.zeros(abi.STATE_WORDS, dtype=cupy.int32)
        self._state[abi.state_offset("BREAK")] = -1
        self._trace = cupy.zeros((self.graph.num_tasks, 4), dtype=cupy.int64) if trace else None

        values = {
            "U": self.U.data.ptr, "V": self.V.data.ptr, "Mbuf": self.M.data.ptr,
            "records": self._records.data.ptr, "mapping": self._mapping.data.ptr,
            "ticket_records": self._ticket_records.data.ptr,
            "counters": self._counters.data.ptr, "state": self._state.data.ptr,
            "trace": self._trace.data.ptr if trace else 0,
            "N": spec.N, "C": spec.C, "K": spec.K, "H": spec.H, "W": spec.W, "pad": spec.padding,
            "out_h": spec.out_h, "out_w": spec.out_w,
            "tiles_h": lay.tiles_h, "tiles_w": lay.tiles_w, "tiles": lay.tiles,
            "tiles_per_group": self.params.tiles_per_group, "tiles_padded": lay.tiles_padded,
            "c_stride": lay.c_stride, "k_stride": lay.k_stride,
            "input_channels_per_task": self.params.input_channels_per_task,
            "gemm_k_per_task": self.params.gemm_k_per_task, "k_blocks": lay.k_blocks,
            "output_k_per_task": self.params.output_k_per_task,
            "filter_pairs_per_task": self.params.filter_pairs_per_task,
            "input_tiles_per_task": self.params.input_tiles_per_task,
            "output_tiles_per_task": self.params.output_tiles_per_task,
            "num_tasks": self.graph.num_tasks, "num_counters": lay.num_counters,
            "timeout_ns": int(round(self.timeout_s * 1e9)),
        }
        fields = [name for name, _ in abi.PARAM_FIELDS]
        assert set(fields) == set(values), sorted(set(fields) ^ set(values))
        self._pbuf = cupy.asarray(np.array([int(values[f]) for f in fields], dtype=np.int64))

        # Task ids of one type are contiguous: (first id, count) per type.
        types = self.graph.types
        self._type_range = {}
        for t in TaskType:
            ids = np.flatnonzero(types == int(t))
            self._type_range[t] = (int(ids[0]) if ids.size else 0, int(ids.size))
            if ids.size and not np.array_equal(ids, np.arange(ids[0], ids[0] + ids.size)):
                raise RuntimeError(f"task ids of type {t.name} are not contiguous")

    # ---- running -------------------------------------------------------
    def __call__(self, x, w, out=None, check: bool = True):
        cupy = _cupy()
        spec = self.spec
        _check_array(cupy, "x", x, spec.input_shape)
        _check_array(cupy, "w", w, spec.weight_shape)
        if out is None:
            out = cupy.empty(spec.output_shape, dtype=cupy.float32)
        else:
            _check_array(cupy, "out", out, spec.output_shape)
        if self.algo == "megakernel":
            self._mega((self.grid,), (BLOCK_THREADS,), (self._pbuf, x, w, out))
        else:
            self.launch_stage(TaskType.FILTER, w)
            self.launch_stage(TaskType.INPUT, x)
            self.launch_stage(TaskType.GEMM)
            self.launch_stage(TaskType.OUTPUT, out)
        if check:
            self.check()
        return out

    def launch_stage(self, task_type: TaskType, array=None) -> None:
        """Non-fused path: launch one stage's kernel (one block per task).
        FILTER takes w, INPUT x, OUTPUT y, GEMM nothing."""
        if self.algo != "nonfused":
            raise RuntimeError("launch_stage needs algo='nonfused'")
        first, count = self._type_range[TaskType(task_type)]
        if count == 0:
            return
        args = (self._pbuf,) + (() if task_type == TaskType.GEMM else (array,)) + (np.int32(first),)
        self._kernels[TaskType(task_type)]((count,), (BLOCK_THREADS,), args)

    def check(self) -> None:
        """Raise RuntimeError if the watchdog fired in a launch since the last check
        (then reset the scheduler state so the next launch is correct).  Synchronizes."""
        if self.algo != "megakernel":
            _cupy().cuda.get_current_stream().synchronize()
            return
        base = abi.state_offset("STATUS")
        words = self._state[base:base + len(abi.STATUS_FIELDS)].get()
        status = dict(zip(abi.STATUS_FIELDS, (int(v) for v in words)))
        if not status["FLAG"]:
            return
        ticket, task, counter = status["TICKET"], status["TASK"], status["COUNTER"]
        value, need = status["VALUE"], status["NEED"]
        self.reset()
        what = self.graph.describe_task(task) if 0 <= task < self.graph.num_tasks else f"task {task}"
        raise RuntimeError(f"megakernel watchdog: ticket {ticket} ({what}) waited > {self.timeout_s} s "
                           f"on counter {counter} (value {value}, need {need})")

    def reset(self) -> None:
        """Put counters, ticket head and status back to their initial values."""
        cupy = _cupy()
        self._counters.fill(0)
        self._state.fill(0)
        self._state[abi.state_offset("BREAK")] = -1
        cupy.cuda.get_current_stream().synchronize()

    def trace(self) -> np.ndarray:
        """int64 [tickets][4]: SM id, fetch time, start time after the wait, end time (ns,
        %globaltimer) of the last launch."""
        if self._trace is None:
            raise RuntimeError("this plan was made without trace=True")
        return self._trace.get()

    def _debug_break_counter(self, counter_index: int) -> None:
        """Make one counter unreachable (need + 1) for the next launch only: its
        waiters time out and the watchdog fires."""
        if not 0 <= int(counter_index) < self.layout.num_counters:
            raise ValueError(f"counter index {counter_index} outside 0..{self.layout.num_counters - 1}")
        self._state[abi.state_offset("BREAK")] = int(counter_index)

    def __repr__(self) -> str:
        return (f"Plan({self.spec.describe()}, {self.spec.layout}, m={self.params.m}, algo={self.algo}, "
                f"gemm_math={self.gemm_math}, tasks={self.graph.num_tasks}, grid={self.grid})")


class DirectPlan:
    """The direct-convolution path (cuda/direct.cu) behind the same call as a Plan:
    filters up to 15x15 (direct.MAX_FILTER), any stride and padding; its tile configuration comes from
    ``mapping/direct_<gpu>.json`` or the model's heuristic (megawino.direct)."""

    algo = "direct"

    def __init__(self, spec: LayerSpec, config=None):
        from . import direct
        if not isinstance(spec, LayerSpec):
            raise ValueError(f"spec must be a LayerSpec, got {type(spec).__name__}")
        direct.check_spec(spec)
        self.spec = spec
        self.config = config if config is not None else direct.heuristic_config(
            spec, gpu=gpu_name_key())
        self._direct = direct

    def __call__(self, x, w, out=None, check: bool = True):
        cupy = _cupy()
        spec = self.spec
        _check_array(cupy, "x", x, spec.input_shape)
        _check_array(cupy, "w", w, spec.weight_shape)
        return self._direct.conv2d_direct(x, w, spec.stride, spec.padding, spec.layout,
                                          config=self.config, out=out)

    def check(self) -> None:
        """Kernel errors surface at synchronisation (there is no watchdog to read)."""
        _cupy().cuda.get_current_stream().synchronize()

    def __repr__(self) -> str:
        return f"DirectPlan({self.spec.describe()}, {self.spec.layout}, config={self.config.key})"


def plan(spec: LayerSpec, params: TaskParams | None = None, mapping=None, algo: str = "megakernel",
         timeout_s: float = 2.0, trace: bool = False, gemm_math: str = DEFAULT_GEMM_MATH):
    """A reusable plan for one layer shape: :class:`Plan` for the Winograd algos
    (``megakernel``, ``nonfused``), :class:`DirectPlan` for ``direct``.  ``gemm_math``:
    how the Winograd GEMM multiplies, ``"3xtf32"`` (default) or ``"ffma"`` (nvrtc.GEMM_MATHS)."""
    check_gemm_math(gemm_math)
    if algo == "direct":
        if params is not None or mapping is not None or trace:
            raise ValueError("algo='direct' takes no task params, mapping or trace")
        return DirectPlan(spec)
    return Plan(spec, params=params, mapping=mapping, algo=algo, timeout_s=timeout_s, trace=trace,
                gemm_math=gemm_math)


_PLANS: dict = {}


def conv2d(x, w, stride: int = 1, padding: int = 1, algo: str = "auto", layout: str = "NCHW",
           gemm_math: str = DEFAULT_GEMM_MATH):
    """Convolution (cross-correlation) on the GPU.  ``x`` is [N][C][H][W] (NCHW) or
    [N][H][W][C] (NHWC), ``w`` is [K][C][R][S]; returns a CuPy array in the same layout.
    ``algo="auto"``: 3x3 stride 1 runs as Winograd F(4x4, 3x3) in the megakernel,
    everything else on the direct path; ``megakernel``, ``nonfused`` or ``direct`` force one.
    ``gemm_math``: the Winograd GEMM's arithmetic, ``"3xtf32"`` (default) or ``"ffma"``."""
    cupy = _cupy()
    if algo not in ("auto",) + ALGOS:
        raise ValueError(f"algo must be one of {('auto',) + ALGOS}, got {algo!r}")
    check_gemm_math(gemm_math)
    x = as_cupy(x, "x")
    w = as_cupy(w, "w")
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"x and w must be 4-D, got x{tuple(x.shape)} and w{tuple(w.shape)}")
    if layout == "NCHW":
        n, c, h, wd = x.shape
    elif layout == "NHWC":
        n, h, wd, c = x.shape
    else:
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    k, c2, r, s = w.shape
    if c2 != c:
        raise ValueError(f"x has C={c} channels but w expects C={c2}")
    spec = LayerSpec(int(n), int(c), int(k), int(h), int(wd), int(r), int(s), int(stride),
                     int(padding), layout)
    if algo == "auto":
        algo = "megakernel" if spec.winograd_eligible else "direct"
    key = (spec, algo, gemm_math)
    p = _PLANS.get(key)
    if p is None:
        p = _PLANS[key] = plan(spec, algo=algo, gemm_math=gemm_math)
    return p(cupy.ascontiguousarray(x), cupy.ascontiguousarray(w))
