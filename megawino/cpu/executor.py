"""CPU executor: runs a layer's task list in ticket order on host buffers laid
out exactly like the GPU buffers, each task touching only its own slices.

It proves the task decomposition on machines without a GPU, and its buffers are
diffed against the GPU's (tests/gpu/test_gpu.py) task type by task type.
:func:`conv2d_cpu` is the public CPU entry point (``megawino.conv2d_cpu``); it runs
large batches a batch of images at a time, and large images in bands of output rows, so its
buffers stay within a memory budget.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..schedule import mapping as mapping_mod
from ..core import task_types
from ..core.arguments import check_float32, integer_argument
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
        check_float32(name, arr)


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
    memory_budget = integer_argument("memory_budget", memory_budget, 1)
    low, high = 1, spec.N          # buffer bytes grow with the images of a batch: bisect
    while low < high:
        mid = (low + high + 1) // 2
        if buffer_bytes(_batch_layout(spec, mid, params, m)) <= memory_budget:
            low = mid
        else:
            high = mid - 1
    return low


def _band_spec(spec: LayerSpec, out_rows: int) -> LayerSpec:
    """One image's band of ``out_rows`` output rows as a layer of its own: its input rows with
    the padding written out (so the band has padding 0) give exactly those output rows."""
    return LayerSpec(1, spec.C, spec.K, out_rows + 2, spec.W + 2 * spec.padding, 3, 3, 1, 0, spec.layout)


def band_bytes(spec: LayerSpec, out_rows: int, params: TaskParams | None = None, m: int = 4) -> int:
    """Bytes one band of ``out_rows`` output rows uses: its padded input copy, U, V, M and y."""
    band = _band_spec(spec, out_rows)
    return 4 * math.prod(band.input_shape) + buffer_bytes(_batch_layout(band, 1, params, m))


def rows_per_band(spec: LayerSpec, params: TaskParams | None = None, m: int = 4,
                  memory_budget: int = DEFAULT_MEMORY_BUDGET) -> int:
    """The most output rows (a multiple of ``m``: whole tile rows, so the bands' tiles are the
    whole image's) of one band within ``memory_budget`` bytes; a ValueError stating both sizes
    when even one row of tiles needs more. Computed from the sizes alone, nothing allocated."""
    memory_budget = integer_argument("memory_budget", memory_budget, 1)
    low, high = 1, -(-spec.out_h // m)           # in tile rows
    smallest = band_bytes(spec, min(m, spec.out_h), params, m)
    if smallest > memory_budget:
        raise ValueError(f"one row of {m}x{m} output tiles of {spec.describe()} needs "
                         f"{smallest / 2**20:.1f} MiB of buffers, more than the memory budget of "
                         f"{memory_budget / 2**20:.1f} MiB: raise memory_budget or split the image")
    while low < high:
        mid = (low + high + 1) // 2
        if band_bytes(spec, min(mid * m, spec.out_h), params, m) <= memory_budget:
            low = mid
        else:
            high = mid - 1
    return min(low * m, spec.out_h)


def _graph_and_order(spec: LayerSpec, params: TaskParams | None, m: int, mapping_params):
    layout = _batch_layout(spec, spec.N, params, m)
    graph = build_graph(layout.spec, layout.params)
    return graph, mapping_mod.build_interleaved(graph, mapping_params or mapping_mod.MappingParams()).order


def _run_in_bands(spec: LayerSpec, x: np.ndarray, w: np.ndarray, y: np.ndarray, rows: int,
                  params: TaskParams | None, mapping_params, m: int) -> None:
    """y of each image, ``rows`` output rows at a time (see :func:`rows_per_band`)."""
    nhwc, pad = spec.layout == "NHWC", spec.padding
    graphs: dict[int, tuple] = {}        # output rows -> (band, graph, order): at most two sizes
    for n in range(spec.N):
        for r0 in range(0, spec.out_h, rows):
            out_rows = min(rows, spec.out_h - r0)
            if out_rows not in graphs:
                band = _band_spec(spec, out_rows)
                graphs[out_rows] = (band, *_graph_and_order(band, params, m, mapping_params))
            band, graph, order = graphs[out_rows]
            xb = np.zeros(band.input_shape, dtype=np.float32)
            top = r0 - pad                       # the band's first input row (may be padding)
            lo, hi = max(top, 0), min(top + band.H, spec.H)
            if lo < hi:
                if nhwc:
                    xb[0, lo - top:hi - top, pad:pad + spec.W] = x[n, lo:hi]
                else:
                    xb[0, :, lo - top:hi - top, pad:pad + spec.W] = x[n, :, lo:hi]
            yb = execute(graph, order, xb, w).y
            if nhwc:
                y[n, r0:r0 + out_rows] = yb[0]
            else:
                y[n, :, r0:r0 + out_rows] = yb[0]


def run_in_batches(spec: LayerSpec, x: np.ndarray, w: np.ndarray, params: TaskParams | None = None,
                   mapping_params: mapping_mod.MappingParams | None = None,
                   memory_budget: int = DEFAULT_MEMORY_BUDGET, m: int = 4) -> np.ndarray:
    """y of the layer through the task list, one batch of images at a time, so that U, V, M
    and y of a batch stay under ``memory_budget`` bytes; an image whose buffers alone are more
    runs in bands of output rows (:func:`rows_per_band`; a ValueError before anything is
    allocated when even one row of tiles is more). Each batch or band is its own task graph
    (``params``, else the heuristic's for F(m x m, 3x3)) in the interleaved mapping
    (``mapping_params``, default :class:`~megawino.schedule.mapping.MappingParams`).

    Besides x, w and the result y, the memory this takes is the budget's (and the task graphs')."""
    spec.require_winograd()
    check_inputs(spec, x, w)
    m = params.m if params is not None else m
    per_batch = images_per_batch(spec, params, m, memory_budget)
    whole_images = buffer_bytes(_batch_layout(spec, 1, params, m)) <= memory_budget
    rows = None if whole_images else rows_per_band(spec, params, m, memory_budget)
    y = np.empty(spec.output_shape, dtype=np.float32)
    if rows is not None:
        _run_in_bands(spec, x, w, y, rows, params, mapping_params, m)
        return y
    graphs: dict[int, tuple] = {}        # images -> (graph, order): at most two sizes
    for n0 in range(0, spec.N, per_batch):
        images = min(per_batch, spec.N - n0)
        if images not in graphs:
            graphs[images] = _graph_and_order(spec.with_(N=images), params, m, mapping_params)
        graph, order = graphs[images]
        y[n0:n0 + images] = execute(graph, order, x[n0:n0 + images], w).y
    return y


def conv2d_cpu(x: np.ndarray, w: np.ndarray, padding: int = 1, stride: int = 1, layout: str = "NCHW",
               m: int = 4, params: TaskParams | None = None, order=None,
               memory_budget: int | None = None) -> np.ndarray:
    """Winograd F(m x m, 3x3) convolution on the CPU through the task list: the reference path
    (float32 NumPy arrays; x NCHW or NHWC, w KCRS with R = S = 3, stride 1).

    Its buffers stay within ``memory_budget`` bytes (default DEFAULT_MEMORY_BUDGET, 1 GiB; besides
    x, w and the result): it works one
    batch of images at a time, and a large image in bands of output rows; a layer that cannot
    fit (or an explicit ticket ``order``, which runs the whole layer's graph as one) is refused
    with a ValueError stating the size and the budget, before anything is allocated."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    stride = integer_argument("stride", stride, 1)
    if stride != 1:
        raise ValueError(f"conv2d_cpu runs Winograd at stride 1 only, got stride={stride!r} "
                         "(megawino.sweep.direct_conv_float32 is the CPU path for other strides)")
    padding = integer_argument("padding", padding, 0)
    m = integer_argument("m", m, 2)
    memory_budget = integer_argument("memory_budget", DEFAULT_MEMORY_BUDGET if memory_budget is None
                                     else memory_budget, 1)
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"x and w must be 4-D, got x{tuple(x.shape)} and w{tuple(w.shape)}")
    check_float32("x", x)
    check_float32("w", w)
    n, c, h, wd = x.shape if layout == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    spec = LayerSpec(n, c, w.shape[0], h, wd, w.shape[2], w.shape[3], 1, padding, layout)
    spec.require_winograd()
    if params is not None and params.m != m:
        raise ValueError(f"params.m is {params.m} but m is {m}")
    if order is not None:
        graph = build_graph(spec, params if params is not None else default_params(spec, m))
        needed = buffer_bytes(graph.layout)
        if needed > memory_budget:
            raise ValueError(f"an explicit order runs {spec.describe()} as one graph, whose buffers "
                             f"need {needed / 2**20:.1f} MiB, more than the memory budget of "
                             f"{memory_budget / 2**20:.1f} MiB: raise memory_budget or drop order")
        return execute(graph, order, x, w).y
    return run_in_batches(spec, x, w, params, memory_budget=memory_budget, m=m)
