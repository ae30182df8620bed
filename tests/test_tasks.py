import networkx as nx
import numpy as np
import pytest

from megawino import codegen
from megawino.spec import LayerSpec
from megawino.tasks import (GEMM_BLOCK_ROWS, Layout, TaskParams, TaskType, build_graph,
                            default_params)


def small_params(**kw):
    base = dict(m=4, tiles_per_group=GEMM_BLOCK_ROWS, input_channels_per_task=8,
                gemm_k_per_task=8, output_k_per_task=5, filter_pairs_per_task=50)
    base.update(kw)
    return TaskParams(**base)


def test_counts_match_design():
    spec = LayerSpec(64, 64, 64, 56, 56)
    params = TaskParams(tiles_per_group=128, input_channels_per_task=32, gemm_k_per_task=64,
                        output_k_per_task=32, filter_pairs_per_task=1024)
    lay = Layout(spec, params)
    assert lay.tiles == 64 * 14 * 14
    assert lay.num_groups == -(-lay.tiles // 128)
    assert (lay.inputs_per_group, lay.gemms_per_group, lay.outputs_per_group) == (2, 36, 2)
    assert lay.num_filter_tasks == 4
    assert lay.u_shape == (36, 64, 64) and lay.v_shape == (36, lay.num_groups * 128, 64)


def test_ragged_sizes_pad():
    lay = Layout(LayerSpec(1, 5, 3, 9, 7), small_params())
    assert lay.c_stride == 8 and lay.k_stride == 4
    assert lay.tiles == 3 * 2 and lay.tiles_padded == GEMM_BLOCK_ROWS
    assert lay.input_channel_range(0) == (0, 8)
    assert lay.output_k_range(0) == (0, 3)
    assert lay.gemm_k_range(0) == (0, 4)


def test_graph_structure_and_counters():
    spec = LayerSpec(2, 13, 7, 11, 6, padding=0)
    graph = build_graph(spec, small_params())
    lay = graph.layout
    g = graph.to_networkx()
    assert nx.is_directed_acyclic_graph(g)
    tasks = [n for n in g if n[0] == "task"]
    assert len(tasks) == lay.num_tasks == graph.num_tasks
    # counter needs are the counter nodes' in-degrees
    for c in range(lay.num_counters):
        assert g.in_degree(("counter", c)) == graph.counter_need[c]
    # every GEMM waits on the filters and its group's inputs, every OUTPUT on its group's GEMMs
    for tid in graph.ids_of(TaskType.GEMM):
        parents = {graph.records[p][0] for p in graph.task_parents(tid)}
        assert parents == {int(TaskType.FILTER), int(TaskType.INPUT)}
        assert len(graph.task_parents(tid)) == lay.num_filter_tasks + lay.inputs_per_group
    for tid in graph.ids_of(TaskType.OUTPUT):
        group = graph.records[tid][1]
        parents = graph.task_parents(tid)
        assert len(parents) == lay.gemms_per_group
        assert all(graph.records[p][1] == group and graph.records[p][0] == TaskType.GEMM
                   for p in parents)
    # graph ancestors agree with the record table
    tid = int(graph.ids_of(TaskType.OUTPUT)[-1])
    anc = {n[1] for n in nx.ancestors(g, ("task", tid)) if n[0] == "task"}
    assert int(graph.ids_of(TaskType.FILTER)[0]) in anc


def test_describe_and_types():
    graph = build_graph(LayerSpec(1, 5, 3, 9, 7), small_params())
    assert graph.describe_task(0).startswith("FILTER")
    assert "GEMM g=0 j=" in graph.describe_task(int(graph.ids_of(TaskType.GEMM)[0]))


def test_default_params_are_valid_for_suite_like_shapes():
    for spec in [LayerSpec(64, 64, 64, 56, 56), LayerSpec(1, 3, 64, 224, 224),
                 LayerSpec(64, 192, 48, 7, 7), LayerSpec(1, 1000, 5, 9, 13)]:
        params = default_params(spec)
        lay = Layout(spec, params)
        assert lay.num_tasks > 0
        assert params.gemm_k_per_task <= lay.k_stride


@pytest.mark.parametrize("field,value", [("tiles_per_group", 3), ("gemm_k_per_task", 6),
                                         ("input_channels_per_task", 0), ("m", 3)])
def test_bad_params(field, value):
    with pytest.raises(ValueError, match=field):
        small_params(**{field: value})


def test_winograd_only_graph():
    with pytest.raises(ValueError, match="stride"):
        build_graph(LayerSpec(1, 4, 4, 8, 8, stride=2))


def test_generated_header_is_current():
    """cuda/generated_tasks.cuh must be regenerated (python -m megawino.codegen) after tasks.py changes."""
    assert codegen.header_path().read_text() == codegen.header_text()
    text = codegen.header_text()
    for t in TaskType:
        assert f"TASK_{t.name} = {int(t)}" in text


def test_transform_chunk_splits_small_layers_to_warp_width():
    from megawino.tasks import DEFAULT_WORKERS, LANE_CHANNELS, transform_chunk
    # densenet161.block3 at batch 64: 16 groups of 64 tiles, C = 192: 64-channel chunks give
    # 48 input tasks for 264 workers, so the rule halves them to one warp's width
    assert transform_chunk(192, 64, 16) == LANE_CHANNELS
    assert transform_chunk(48, 64, 16) == 48            # halving would go under a warp
    assert transform_chunk(16, 64, 16) == 16            # fewer channels than a chunk
    assert transform_chunk(256, 64, 2000) == 64         # enough tasks already: unchanged
    assert transform_chunk(512, 256, 1, workers=DEFAULT_WORKERS) == LANE_CHANNELS
    assert transform_chunk(512, 16, 5000) == LANE_CHANNELS        # 256-tile groups: a whole warp
    spec = LayerSpec(64, 192, 48, 14, 14)
    p = default_params(spec)
    assert p.input_channels_per_task == LANE_CHANNELS and p.output_k_per_task == 48


def test_lane_channels_matches_the_cuda_lane_maps():
    """LANE_CHANNELS is the channel width of a transform warp in the CUDA sources."""
    import re
    from megawino.resources import cuda_dir
    from megawino.tasks import LANE_CHANNELS
    src = (cuda_dir() / "input_transform.cuh").read_text()
    assert int(re.search(r"#define MW_IN_CW (\d+)", src).group(1)) == LANE_CHANNELS
    mega = (cuda_dir() / "megakernel.cu").read_text()
    assert re.search(rf"output_transform_task_cpt2s<MW_M, MW_NHWC != 0, {LANE_CHANNELS},", mega)
