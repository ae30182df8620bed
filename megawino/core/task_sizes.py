"""Task sizes for a layer and the task graph built from them: the heuristic
(``default_params``), the split rules the tuner's candidate space shares with it
(``transform_chunk``, ``transform_tiles``), the size guard (``check_size``: int32 limits of the
kernels and records, device memory) and ``build_graph``, which sizes a layer's tasks and writes
their records.  What a task *is* (types, parameters, layout, the graph's class) lives in
:mod:`megawino.core.tasks`, which imports nothing from here.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .spec import LayerSpec
from .tasks import (CHANNEL_ALIGN, COUNTER_STRIDE, GEMM_BLOCK_ROWS, GEMM_OUTPUT_MAX_C_STRIDE, INT32_MAX,
                    K_ALIGN, LANE_CHANNELS, NO_COUNTER, TASK_RECORD_FIELDS, TICKET_MARGIN, TRANSFORM_MIN_TILES,
                    Layout, TaskParams, TaskType, gemm_output_fits, round_up)
from .task_graph import TaskGraph
from .winograd import tiles_for

GEMM_WIDE_K = 128        # default_params' GEMM task width: fewer V re-reads than 64-channel tasks
DEFAULT_WORKERS = 264    # 132 SMs x 2 resident megakernel blocks on the H100
FILTER_MIN_PAIRS = 256   # fewest (c, k) pairs a filter task covers: one per thread of a
                         # 256-thread block (megawino.gpu.nvrtc.BLOCK_THREADS)


def default_params(spec: LayerSpec, m: int = 4) -> TaskParams:
    """Sensible task sizes for a layer (``megawino tune`` refines them).

    Rule: GEMM tasks of about 128 tiles x min(K, 128) channels; transform tasks of about
    4096 (tile, channel) pairs so each of 256 threads has work, split further (down to
    LANE_CHANNELS channels, a warp's width, then down to TRANSFORM_MIN_TILES tiles) while
    there are fewer transform tasks than resident workers (filter tasks likewise, from 1024
    down to FILTER_MIN_PAIRS pairs): on small layers a few long transform tasks would leave
    most resident blocks idle.
    """
    spec.require_winograd()
    tiles = spec.N * tiles_for(spec.out_h, m) * tiles_for(spec.out_w, m)
    k_stride = round_up(spec.K, K_ALIGN)
    # 128 output channels per GEMM task where K allows: fewer, longer GEMM tasks re-read
    # each V row block fewer times.
    gemm_k = min(k_stride, GEMM_WIDE_K)
    # 128-row GEMM tasks (the 64-row tile re-reads B for half the rows) as long as they
    # still make about two waves of the resident blocks.
    gemm_tasks_128 = -(-tiles // 128) * (m + 2) ** 2 * -(-k_stride // gemm_k)
    tiles_per_group = 128 if gemm_tasks_128 >= 2 * DEFAULT_WORKERS else GEMM_BLOCK_ROWS
    groups = -(-tiles // tiles_per_group)
    per_task_pairs = 4096
    c_pad = round_up(spec.C, CHANNEL_ALIGN)
    input_channels = transform_chunk(c_pad, per_task_pairs // tiles_per_group, groups)
    output_k = transform_chunk(spec.K, per_task_pairs // tiles_per_group, groups)
    filter_pairs = 1024
    while filter_pairs // 2 >= FILTER_MIN_PAIRS and -(-c_pad * k_stride // filter_pairs) < DEFAULT_WORKERS:
        filter_pairs //= 2
    whole = TaskParams(m=m, tiles_per_group=tiles_per_group, input_channels_per_task=input_channels,
                       gemm_k_per_task=gemm_k, output_k_per_task=output_k, filter_pairs_per_task=filter_pairs)
    return with_transform_split(spec, whole)


def transform_chunk(channels: int, chunk: int, groups: int, workers: int = DEFAULT_WORKERS) -> int:
    """Channels per transform task: ``chunk``, at least one warp's LANE_CHANNELS and at most
    ``channels``, halved while the layer would have fewer than ``workers`` such tasks (never
    below LANE_CHANNELS: a narrower task leaves lanes idle and is no faster)."""
    chunk = min(channels, max(chunk, LANE_CHANNELS))
    while chunk // 2 >= LANE_CHANNELS and groups * -(-channels // chunk) < workers:
        chunk //= 2
    return chunk


def transform_tiles(tiles_per_group: int, tasks: int, workers: int = DEFAULT_WORKERS) -> int:
    """Tiles per transform task: the whole group, halved while the layer would have fewer
    than ``workers`` transform tasks (``tasks`` of whole groups), never below
    TRANSFORM_MIN_TILES and always a divisor of ``tiles_per_group``."""
    tiles = tiles_per_group
    while (tiles % 2 == 0 and (tiles // 2) % TRANSFORM_MIN_TILES == 0
           and tasks * (tiles_per_group // tiles) < workers):
        tiles //= 2
    return tiles


def transform_split(spec: LayerSpec, params: TaskParams, workers: int = DEFAULT_WORKERS) -> tuple[int, int]:
    """(input, output) tiles per transform task by ``transform_tiles`` for ``params``' group
    size and channel chunks (the split default_params applies; the tuner offers it too)."""
    lay = Layout(spec, dataclasses.replace(params, input_tiles_per_task=None, output_tiles_per_task=None))
    return (transform_tiles(params.tiles_per_group, lay.num_groups * lay.inputs_per_group, workers),
            transform_tiles(params.tiles_per_group, lay.num_groups * lay.outputs_per_group, workers))


def with_transform_split(spec: LayerSpec, params: TaskParams, workers: int = DEFAULT_WORKERS) -> TaskParams:
    """``params`` with the transform tile split of :func:`transform_split`."""
    input_tiles, output_tiles = transform_split(spec, params, workers)
    return dataclasses.replace(params, input_tiles_per_task=input_tiles, output_tiles_per_task=output_tiles)


def buffer_bytes(layout: Layout) -> int:
    """Device bytes of one plan: U, V, M (float32), the task records twice (by id and by
    ticket), the mapping and the counters."""
    floats = sum(int(np.prod(shape)) for shape in (layout.u_shape, layout.v_shape, layout.m_shape))
    records = 2 * layout.num_tasks * len(TASK_RECORD_FIELDS) + layout.num_tasks
    return 4 * (floats + records + layout.num_counters * COUNTER_STRIDE)


def check_size(spec: LayerSpec, params: TaskParams, memory_bytes: int | None = None) -> Layout:
    """The layout of ``spec`` with ``params``, or a ValueError saying which int32 quantity of
    the kernels or the task records would overflow (or, given ``memory_bytes``, that the
    buffers do not fit): called before any record is built or buffer allocated."""
    if not isinstance(params, TaskParams):
        raise ValueError(f"params must be TaskParams, got {type(params).__name__}")
    layout = Layout(spec, params)
    if params.fused_output and not gemm_output_fits(spec):
        raise ValueError(f"TaskParams.fused_output takes layers of up to {GEMM_OUTPUT_MAX_C_STRIDE} (padded) input "
                         f"channels, got {spec.describe()} (c_stride {layout.c_stride})")
    limits = [
        ("C (channels)", spec.C), ("K (output channels)", spec.K), ("H", spec.H), ("W", spec.W),
        ("padding", spec.padding), ("padded channels (c_stride)", layout.c_stride),
        ("padded output channels (k_stride)", layout.k_stride),
        ("padded tiles (the tile ids)", layout.tiles_padded),
        ("tasks plus one ticket fetch per block (the ticket head)", layout.num_tasks + TICKET_MARGIN),
        ("counter words (counter offsets)", layout.num_counters * COUNTER_STRIDE),
    ]
    for what, value in limits:
        if value > INT32_MAX:
            raise ValueError(
                f"layer {spec.describe()} (m={params.m}, tiles_per_group={params.tiles_per_group}) "
                f"is too large for the kernels' int32 indices: {what} = {value} > {INT32_MAX} "
                f"(split the batch into smaller calls)")
    if memory_bytes is not None and buffer_bytes(layout) > memory_bytes:
        raise ValueError(f"layer {spec.describe()} needs {buffer_bytes(layout) / 2**30:.2f} GiB of "
                         f"Winograd buffers, more than the {memory_bytes / 2**30:.2f} GiB available "
                         f"(split the batch into smaller calls)")
    return layout


def build_graph(spec: LayerSpec, params: TaskParams | None = None) -> TaskGraph:
    """Build the task table of a Winograd layer (vectorised: it scales to VGG-16 at batch 64)."""
    spec.require_winograd()
    if params is None:
        params = default_params(spec)
    layout = check_size(spec, params)
    groups = layout.num_groups
    n_f, s_i, s_g, s_o = (layout.num_filter_tasks, layout.inputs_per_group,
                          layout.gemms_per_group, layout.outputs_per_group)

    def block(task_type, per_group, wait_a, need_a, wait_b, need_b, signal):
        g = np.repeat(np.arange(groups), per_group)
        idx = np.tile(np.arange(per_group), groups)
        need = lambda n: n(g) if callable(n) else np.full(g.shape, n)  # noqa: E731
        cols = [np.full(g.shape, int(task_type)), g, idx,
                wait_a(g), need(need_a), wait_b(g), need(need_b), signal(g)]
        return np.stack(cols, axis=1)

    none = lambda g: np.full(g.shape, NO_COUNTER)  # noqa: E731
    filters = np.stack([np.full(n_f, int(TaskType.FILTER)), np.zeros(n_f, int), np.arange(n_f),
                        np.full(n_f, NO_COUNTER), np.zeros(n_f, int),
                        np.full(n_f, NO_COUNTER), np.zeros(n_f, int),
                        np.full(n_f, layout.counter_filters_done())], axis=1)
    # Group g reuses the slot of group g - ring (never without a ring: ring = groups): its inputs
    # overwrite V once that group's GEMMs have read it, its GEMMs overwrite M once that group's
    # outputs have.  The filter wait of those GEMMs is implied: every chain of waits back from
    # them ends at a GEMM that has it.
    ring = layout.buffer_groups
    reused = lambda g: g >= ring  # noqa: E731
    inputs = block(TaskType.INPUT, s_i, lambda g: np.where(reused(g), 1 + groups + g - ring, NO_COUNTER),
                   lambda g: np.where(reused(g), s_g, 0), none, 0, lambda g: 1 + g)
    # GEMM_OUTPUT tasks (fused_output) signal nothing: no task reads what they write.
    gemms = block(layout.product_type, s_g, lambda g: np.where(reused(g), 1 + 2 * groups + g - ring, 0),
                  lambda g: np.where(reused(g), s_o, n_f), lambda g: 1 + g, s_i,
                  none if params.fused_output else (lambda g: 1 + groups + g))
    outputs = block(TaskType.OUTPUT, s_o, lambda g: 1 + groups + g, s_g, none, 0,
                    (lambda g: 1 + 2 * groups + g) if layout.ring else none)
    records = np.ascontiguousarray(np.concatenate([filters, inputs, gemms, outputs]), dtype=np.int32)
    graph = TaskGraph(layout, records)
    # The needs written into the records must equal the counters' in-degrees.
    need = graph.counter_need
    typed = graph.typed_records
    for wait, need_field in (("wait_a", "need_a"), ("wait_b", "need_b")):
        has = typed[wait] >= 0
        if not np.array_equal(need[typed[wait][has]], typed[need_field][has]):
            # a bug in the graph's construction, never the caller's input: checked even under -O
            raise RuntimeError(f"build_graph: the {need_field} written into the records differ from the "
                               f"counters' in-degrees ({layout.spec.describe()})")
    return graph
