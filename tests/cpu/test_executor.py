import numpy as np
import pytest

from megawino.cpu import executor
from megawino.schedule.mapping import interleaved_mapping, sequential_mapping
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph
from megawino.core.tasks import GEMM_BLOCK_ROWS, TaskParams
from megawino.core.winograd import direct_conv_nchw, rel_l2


def run_case(spec, params, seed=0, order_fn=None):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(spec.input_shape).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    graph = build_graph(spec, params)
    order = (order_fn or (lambda g: interleaved_mapping(g, 3, 5, 2)))(graph)
    buffers = executor.execute(graph, order, x, w)
    x_nchw = x if spec.layout == "NCHW" else x.transpose(0, 3, 1, 2)
    ref = direct_conv_nchw(x_nchw, w, 1, spec.padding)
    y = buffers.y if spec.layout == "NCHW" else buffers.y.transpose(0, 3, 1, 2)
    return buffers, rel_l2(y, ref)


CASES = [
    # N, C, K, H, W, padding, layout, m
    (1, 5, 3, 9, 7, 1, "NCHW", 4),        # odd H and W, H != W, batch 1
    (2, 13, 7, 11, 6, 0, "NHWC", 4),      # padding 0
    (1, 3, 9, 10, 13, 2, "NCHW", 4),      # padding 2
    (2, 37, 70, 17, 19, 1, "NHWC", 4),    # C, K not multiples of any chunk
    (1, 1, 1, 5, 5, 1, "NCHW", 4),
    (3, 5, 11, 9, 7, 1, "NCHW", 2),
    (1, 19, 6, 8, 13, 2, "NHWC", 2),
]


@pytest.mark.parametrize("case", CASES)
def test_executor_matches_direct(case):
    n, c, k, h, w, pad, layout, m = case
    spec = LayerSpec(n, c, k, h, w, padding=pad, layout=layout)
    params = TaskParams(m=m, tiles_per_group=GEMM_BLOCK_ROWS, input_channels_per_task=6,
                        gemm_k_per_task=8, output_k_per_task=5, filter_pairs_per_task=37)
    buffers, err = run_case(spec, params)
    assert err < 1e-5 if m == 4 else err < 1e-6
    for name in ("U", "V", "M", "y"):   # every element, padding included, was written
        assert not np.isnan(getattr(buffers, name)).any(), name


@pytest.mark.parametrize("input_tiles,output_tiles", [(16, 32), (32, 16), (64, 16)])
def test_executor_with_tile_split_transforms(input_tiles, output_tiles):
    """Transform tasks that cover part of a group's tiles give the same bits as whole groups."""
    spec = LayerSpec(3, 13, 11, 15, 17, layout="NCHW")
    base = dict(tiles_per_group=GEMM_BLOCK_ROWS, input_channels_per_task=8, gemm_k_per_task=8,
                output_k_per_task=5)
    whole, err = run_case(spec, TaskParams(**base))
    split, _ = run_case(spec, TaskParams(**base, input_tiles_per_task=input_tiles,
                                         output_tiles_per_task=output_tiles))
    assert err < 1e-5
    for name in ("U", "V", "M", "y"):
        assert np.array_equal(getattr(whole, name), getattr(split, name)), name


def test_results_bitwise_identical_across_mappings():
    spec = LayerSpec(2, 20, 12, 14, 10)
    params = TaskParams(tiles_per_group=GEMM_BLOCK_ROWS, input_channels_per_task=8,
                        gemm_k_per_task=4, output_k_per_task=6)
    a, _ = run_case(spec, params, order_fn=sequential_mapping)
    b, _ = run_case(spec, params, order_fn=lambda g: interleaved_mapping(g, 1, 2, 3))
    for name in ("U", "V", "M", "y"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_default_params_layer():
    buffers, err = run_case(LayerSpec(1, 64, 64, 14, 14), None,
                            order_fn=lambda g: interleaved_mapping(g))
    assert err < 1e-5


def test_conv2d_cpu_entry_point():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 8, 9)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    y = executor.conv2d_cpu(x, w, padding=1)
    assert rel_l2(y, direct_conv_nchw(x, w, 1, 1)) < 1e-5


def test_bad_inputs_are_refused_before_work():
    spec = LayerSpec(1, 4, 6, 8, 8)
    graph = build_graph(spec)
    order = sequential_mapping(graph)
    good_x = np.ones(spec.input_shape, np.float32)
    good_w = np.ones(spec.weight_shape, np.float32)
    with pytest.raises(ValueError, match="x has shape"):
        executor.execute(graph, order, np.ones((1, 5, 8, 8), np.float32), good_w)
    with pytest.raises(ValueError, match="w has shape"):
        executor.execute(graph, order, good_x, np.ones((6, 4, 5, 5), np.float32))
    with pytest.raises(ValueError, match="float32"):
        executor.execute(graph, order, good_x.astype(np.float64), good_w)
    with pytest.raises(ValueError, match="ticket"):
        executor.execute(graph, order[::-1], good_x, good_w)


@pytest.mark.parametrize("budget", [0, -5, True, 1.5])
def test_memory_budget_must_be_positive_bytes(budget):
    spec = LayerSpec(2, 3, 4, 9, 9)
    with pytest.raises(ValueError, match="memory_budget"):
        executor.images_per_batch(spec, memory_budget=budget)


def test_images_per_batch_is_the_most_that_fit():
    spec = LayerSpec(40, 16, 24, 30, 30)
    one = executor.buffer_bytes(executor._batch_layout(spec, 1, None, 4))
    whole = executor.buffer_bytes(executor._batch_layout(spec, 40, None, 4))
    assert executor.images_per_batch(spec, memory_budget=whole) == 40
    for budget in (one, 3 * one, whole // 3):
        n = executor.images_per_batch(spec, memory_budget=budget)
        assert executor.buffer_bytes(executor._batch_layout(spec, n, None, 4)) <= budget
        assert executor.buffer_bytes(executor._batch_layout(spec, n + 1, None, 4)) > budget


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_ring_buffers_same_bits_and_only_their_slots(layout):
    """V and M as a ring (TaskParams.buffer_groups): the interleaved order's fewest slots and
    a single slot (a sequential-by-group order) give the same y as whole buffers, in buffers of
    buffer_tiles rows; an order that reuses a slot too early is refused before any task runs."""
    import dataclasses
    from megawino.schedule.mapping import (MappingError, MappingParams, build_interleaved,
                                           ring_buffer_groups, validate_mapping)
    spec = LayerSpec(6, 12, 10, 40, 36, layout=layout)
    params = TaskParams(tiles_per_group=GEMM_BLOCK_ROWS, input_channels_per_task=8, gemm_k_per_task=8,
                        output_k_per_task=4, filter_pairs_per_task=40, input_tiles_per_task=16,
                        output_tiles_per_task=32)
    graph = build_graph(spec, params)
    rng = np.random.default_rng(4)
    x = rng.standard_normal(spec.input_shape).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    order = build_interleaved(graph, MappingParams(4, 12, 1)).order
    ref = executor.execute(graph, order, x, w).y
    ring = ring_buffer_groups(graph, order)
    assert 1 < ring < graph.layout.num_groups
    ring_graph = build_graph(spec, dataclasses.replace(params, buffer_groups=ring))
    assert ring_graph.layout.v_shape[1] == ring * params.tiles_per_group
    out = executor.execute(ring_graph, order, x, w)
    assert out.V.shape == ring_graph.layout.v_shape and out.M.shape == ring_graph.layout.m_shape
    assert np.array_equal(out.y, ref) and not np.isnan(out.y).any()
    # One slot: each group's tasks in full before the next group's (filters first).
    one = build_graph(spec, dataclasses.replace(params, buffer_groups=1))
    types, groups = one.types, one.field("group")
    by_group = np.lexsort((types, groups, types != 0)).astype(np.int32)
    assert np.array_equal(executor.execute(one, by_group, x, w).y, ref)
    with pytest.raises(MappingError, match="before its parent"):
        validate_mapping(ring_graph, build_interleaved(graph, MappingParams(64, 64, 4)).order)


def test_ring_waits_and_counters():
    """The ring's graph: group g >= R's inputs wait for all GEMMs of g - R, its GEMMs for all
    outputs of g - R (which signal their own counters), and earlier groups wait as without a ring;
    the prepared-weight graph drops only the waits on the filter counter."""
    import dataclasses
    from megawino.core.tasks import TaskType
    from megawino.schedule.mapping import without_filter_tasks
    spec = LayerSpec(2, 16, 16, 40, 40)
    params = TaskParams(tiles_per_group=GEMM_BLOCK_ROWS, input_channels_per_task=16, gemm_k_per_task=16,
                        output_k_per_task=16, buffer_groups=2)
    graph = build_graph(spec, params)
    lay = graph.layout
    assert lay.ring and lay.num_groups == 4 and lay.num_counters == 1 + 3 * 4
    rec = graph.typed_records
    for t in range(graph.num_tasks):
        kind, g = TaskType(int(rec["type"][t])), int(rec["group"][t])
        wait = (int(rec["wait_a"][t]), int(rec["need_a"][t]))
        if kind == TaskType.INPUT:
            assert wait == ((lay.counter_products_done(g - 2), lay.gemms_per_group) if g >= 2 else (-1, 0))
        elif kind == TaskType.GEMM:
            assert wait == ((lay.counter_outputs_done(g - 2), lay.outputs_per_group) if g >= 2
                            else (lay.counter_filters_done(), lay.num_filter_tasks))
        elif kind == TaskType.OUTPUT:
            assert int(rec["signal"][t]) == lay.counter_outputs_done(g)
    assert [int(n) for n in graph.counter_need[lay.counter_outputs_done(0):]] == [lay.outputs_per_group] * 4
    prepared, _ = without_filter_tasks(graph, np.arange(graph.num_tasks, dtype=np.int32))
    pw = prepared.typed_records
    assert not (pw["wait_a"] == lay.counter_filters_done()).any()
    assert (pw["wait_a"] >= 0).sum() == (rec["wait_a"] > lay.counter_filters_done()).sum()
    with pytest.raises(ValueError, match="buffer_groups"):
        TaskParams(buffer_groups=0)


def test_automatic_ring_only_where_whole_buffers_crowd_the_gpu():
    """plan(ring_buffers=None) rings V and M when they would take more than RING_MEMORY_SHARE of
    the GPU's memory: VGG-16 conv1_2 at batch 64 (3.7 GB) not on 80 GB, at batch 1024 it does."""
    from megawino.gpu.workspace import RING_MEMORY_SHARE, workspace_needs_ring
    from megawino.core.tasks import Layout
    spec = LayerSpec(64, 64, 64, 224, 224)
    params = TaskParams(tiles_per_group=256, input_channels_per_task=32, gemm_k_per_task=64)
    whole = Layout(spec, params)
    vm = 4 * (np.prod(whole.v_shape) + np.prod(whole.m_shape))
    assert not workspace_needs_ring(whole, 80 << 30)
    assert workspace_needs_ring(Layout(spec.with_(N=1024), params), 80 << 30)
    assert workspace_needs_ring(whole, int(vm / RING_MEMORY_SHARE) - 1)
    assert not workspace_needs_ring(whole, int(vm / RING_MEMORY_SHARE) + 4)
