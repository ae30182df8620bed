"""CPU tests of the plan's graph forms: once U is prepared the megakernel runs the graph without
its filter tasks (megawino.schedule.mapping.without_filter_tasks); the CPU executor runs that same task list
and must give bitwise the output of the full graph."""
from __future__ import annotations

import numpy as np
import pytest

from megawino.cpu import executor
from megawino.schedule import mapping as mapping_mod
from megawino.schedule.mapping import without_filter_tasks
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.tasks import TaskType


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("order_kind", ["interleaved", "sequential"])
def test_prepared_graph_gives_the_full_graphs_output(m, order_kind):
    spec = LayerSpec(2, 11, 13, 10, 9)
    graph = build_graph(spec, default_params(spec, m))
    order = (mapping_mod.interleaved_mapping(graph) if order_kind == "interleaved"
             else mapping_mod.sequential_mapping(graph))
    rng = np.random.default_rng(m)
    x = rng.standard_normal(spec.input_shape).astype(np.float32) + 0.5
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    full = executor.execute(graph, order, x, w)

    prepared, kept = without_filter_tasks(graph, order)
    assert prepared.num_tasks == graph.num_tasks - graph.layout.num_filter_tasks
    assert not (prepared.types == int(TaskType.FILTER)).any()
    assert sorted(kept.tolist()) == list(range(prepared.num_tasks))
    mapping_mod.validate_mapping(prepared, kept)           # parents still before children
    buffers = executor.Buffers.allocate(prepared, x, w)
    buffers.U[...] = full.U                                # the prepared weights
    for task in kept.tolist():
        executor.run_task(prepared, task, buffers)
    assert not np.isnan(buffers.y).any()
    assert np.array_equal(buffers.y, full.y)


def test_prepared_gemms_wait_only_for_their_inputs():
    spec = LayerSpec(1, 40, 24, 12, 12)
    graph = build_graph(spec, default_params(spec))
    prepared, _ = without_filter_tasks(graph, mapping_mod.interleaved_mapping(graph))
    gemm = prepared.records[prepared.types == int(TaskType.GEMM)]
    assert (gemm[:, 3] == -1).all() and (gemm[:, 4] == 0).all()
    assert (gemm[:, 5] >= 1).all()
    assert prepared.counter_need[graph.layout.counter_filters_done()] == 0
