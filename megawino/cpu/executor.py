"""CPU executor: runs a layer's task list in ticket order on host buffers laid
out exactly like the GPU buffers, each task touching only its own slices.

It proves the task decomposition on machines without a GPU, and its buffers are
diffed against the GPU's (tests/test_gpu.py) task type by task type.
:func:`conv2d_cpu` is the public CPU entry point (``megawino.conv2d_cpu``); it runs
large batches a batch of images at a time so its memory stays bounded.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..schedule import mapping as mapping_mod
from ..core import task_types
from ..core.spec import LayerSpec
from ..core.task_sizes import build_graph, default_params
from ..core.task_graph import TaskGraph
from ..core.tasks import Layout, TaskParams
from ..core.winograd import transform
from .threads import executor_blas_threads

POISON = np.float32(np.nan)
DEFAULT_MEMORY_BUDGET = 1 << 30     # bytes of U, V, M and y that one batch of images may use


@dataclasses.dataclass
class Buffers:
    """Host buffers of one run; U, V, M start poisoned so unwritten slices show."""

    x: np.ndarray
    w: np.ndarray
    U: np.ndarray
    V: np.ndarray
    M: np.ndarray
    y: np.ndarray

    @classmethod
    def allocate(cls, graph: TaskGraph, x: np.ndarray, w: np.ndarray) -> "Buffers":
        layout = graph.layout
        return cls(x=x, w=w,
                   U=np.full(layout.u_shape, POISON, dtype=np.float32),
                   V=np.full(layout.v_shape, POISON, dtype=np.float32),
                   M=np.full(layout.m_shape, POISON, dtype=np.float32),
                   y=np.full(layout.spec.output_shape, POISON, dtype=np.float32))


def check_inputs(spec: LayerSpec, x, w) -> None:
    """ValueError naming the mismatch, before any work."""
    for name, arr, shape in (("x", x, spec.input_shape), ("w", w, spec.weight_shape)):
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(arr.shape)}, the layer "
                             f"({spec.layout}) expects {tuple(shape)}")
        if np.dtype(arr.dtype) != np.float32:
            raise ValueError(f"{name} has dtype {arr.dtype}, only float32 is supported")


def run_task(graph: TaskGraph, task: int, buffers: Buffers, tf=None) -> None:
    rec = graph.typed_records[task]
    tf = tf if tf is not None else transform(graph.layout.params.m)
    task_types.info(rec["type"]).runner(graph.layout, buffers, int(rec["group"]), int(rec["index"]), tf)


def execute(graph: TaskGraph, order, x: np.ndarray, w: np.ndarray) -> Buffers:
    """Run every task in ticket order; returns the buffers (``.y`` is the output)."""
    check_inputs(graph.layout.spec, x, w)
    mapping_mod.validate_mapping(graph, order)
    buffers = Buffers.allocate(graph, np.asarray(x), np.asarray(w))
    tf = transform(graph.layout.params.m)
    with executor_blas_threads():
        for task in np.asarray(order).tolist():
            run_task(graph, task, buffers, tf)
    return buffers


def buffer_bytes(layout) -> int:
    """Bytes of U, V, M and y of one run of ``layout`` (float32)."""
    return 4 * sum(math.prod(shape) for shape in (layout.u_shape, layout.v_shape, layout.m_shape,
                                                    layout.spec.output_shape))


def _batch_layout(spec: LayerSpec, images: int, params: TaskParams | None, m: int) -> Layout:
    batch = spec.with_(N=images)
    return Layout(batch, params if params is not None else default_params(batch, m))


def images_per_batch(spec: LayerSpec, params: TaskParams | None = None, m: int = 4,
                     memory_budget: int = DEFAULT_MEMORY_BUDGET) -> int:
    """The most images of ``spec`` (at least one) whose U, V, M and y fit ``memory_budget``
    bytes (``params``: task sizes, default the heuristic's for each batch)."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)) \
            or memory_budget < 1:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
    low, high = 1, spec.N          # buffer bytes grow with the images of a batch: bisect
    while low < high:
        mid = (low + high + 1) // 2
        if buffer_bytes(_batch_layout(spec, mid, params, m)) <= memory_budget:
            low = mid
        else:
            high = mid - 1
    return low


def run_in_batches(spec: LayerSpec, x: np.ndarray, w: np.ndarray, params: TaskParams | None = None,
                   mapping_params: mapping_mod.MappingParams | None = None,
                   memory_budget: int = DEFAULT_MEMORY_BUDGET, m: int = 4) -> np.ndarray:
    """y of the layer through the task list, one batch of images at a time, so that U, V, M
    and y of a batch stay under ``memory_budget`` bytes (one image when even that is more).
    Each batch is its own task graph (``params``, else the heuristic's for F(m x m, 3x3)) in the
    interleaved mapping (``mapping_params``, default :class:`~megawino.schedule.mapping.MappingParams`)."""
    spec.require_winograd()
    check_inputs(spec, x, w)
    m = params.m if params is not None else m
    per_batch = images_per_batch(spec, params, m, memory_budget)
    y = np.empty(spec.output_shape, dtype=np.float32)
    graphs: dict[int, tuple] = {}        # images -> (graph, order): at most two sizes
    for n0 in range(0, spec.N, per_batch):
        images = min(per_batch, spec.N - n0)
        if images not in graphs:
            layout = _batch_layout(spec, images, params, m)
            graph = build_graph(layout.spec, layout.params)
            graphs[images] = graph, mapping_mod.build_interleaved(
                graph, mapping_params or mapping_mod.MappingParams()).order
        graph, order = graphs[images]
        y[n0:n0 + images] = execute(graph, order, x[n0:n0 + images], w).y
    return y


def conv2d_cpu(x: np.ndarray, w: np.ndarray, padding: int = 1, stride: int = 1, layout: str = "NCHW",
               m: int = 4, params: TaskParams | None = None, order=None,
               memory_budget: int = DEFAULT_MEMORY_BUDGET) -> np.ndarray:
    """Winograd F(m x m, 3x3) convolution on the CPU through the task list: the reference path
    (float32 NumPy arrays; x NCHW or NHWC, w KCRS with R = S = 3, stride 1).

    It works one batch of images at a time so that its buffers stay under ``memory_budget``
    bytes; an explicit ticket ``order`` (of the whole layer's graph) runs the layer as one
    graph instead."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride != 1:
        raise ValueError(f"conv2d_cpu runs Winograd at stride 1 only, got stride={stride!r} "
                         "(megawino.sweep.direct_conv_float32 is the CPU path for other strides)")
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"x and w must be 4-D, got x{tuple(x.shape)} and w{tuple(w.shape)}")
    n, c, h, wd = x.shape if layout == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    spec = LayerSpec(n, c, w.shape[0], h, wd, w.shape[2], w.shape[3], 1, padding, layout)
    spec.require_winograd()
    if params is not None and params.m != m:
        raise ValueError(f"params.m is {params.m} but m is {m}")
    if order is not None:
        graph = build_graph(spec, params if params is not None else default_params(spec, m))
        return execute(graph, order, x, w).y
    return run_in_batches(spec, x, w, params, memory_budget=memory_budget, m=m)
