"""CPU executor: runs a layer's task list in ticket order on host buffers laid
out exactly like the GPU buffers, each task touching only its own slices.

It proves the task decomposition on machines without a GPU, and its buffers are
diffed against the GPU's (tests/test_gpu.py) task type by task type.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import mapping as mapping_mod
from .spec import LayerSpec
from .stages import RUNNERS
from .task_sizes import default_params
from .tasks import TaskGraph, TaskParams, TaskType, build_graph
from .winograd import transform

POISON = np.float32(np.nan)


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
    rec = graph.records[task]
    tf = tf if tf is not None else transform(graph.layout.params.m)
    RUNNERS[TaskType(int(rec[0]))](graph.layout, buffers, int(rec[1]), int(rec[2]), tf)


def execute(graph: TaskGraph, order, x: np.ndarray, w: np.ndarray) -> Buffers:
    """Run every task in ticket order; returns the buffers (``.y`` is the output)."""
    check_inputs(graph.layout.spec, x, w)
    mapping_mod.validate_mapping(graph, order)
    buffers = Buffers.allocate(graph, np.asarray(x), np.asarray(w))
    tf = transform(graph.layout.params.m)
    for task in np.asarray(order).tolist():
        run_task(graph, task, buffers, tf)
    return buffers


def conv2d_cpu(x: np.ndarray, w: np.ndarray, padding: int = 1, layout: str = "NCHW", m: int = 4,
               params: TaskParams | None = None, order=None) -> np.ndarray:
    """Winograd convolution on the CPU through the task list (default: interleaved mapping)."""
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be NCHW or NHWC, got {layout!r}")
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"x and w must be 4-D, got x{tuple(x.shape)} and w{tuple(w.shape)}")
    n, c, h, wd = x.shape if layout == "NCHW" else (x.shape[0], x.shape[3], x.shape[1], x.shape[2])
    spec = LayerSpec(n, c, w.shape[0], h, wd, w.shape[2], w.shape[3], 1, padding, layout)
    graph = build_graph(spec, params if params is not None else default_params(spec, m))
    if order is None:
        order = mapping_mod.interleaved_mapping(graph)
    return execute(graph, order, x, w).y
