import dataclasses

import networkx as nx
import numpy as np
import pytest

from megawino.gpu import codegen
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.tasks import CHANNEL_ALIGN, GEMM_BLOCK_ROWS, Layout, TaskParams, TaskType


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
    assert lay.c_stride == CHANNEL_ALIGN and lay.k_stride == 4
    assert lay.tiles == 3 * 2 and lay.tiles_padded == GEMM_BLOCK_ROWS
    assert lay.input_slices(0, 0) == ((0, GEMM_BLOCK_ROWS), (0, 8))
    assert lay.output_slices(0, 0) == ((0, GEMM_BLOCK_ROWS), (0, 3))
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
    """cuda/generated_tasks.cuh must be regenerated (python -m megawino.gpu.codegen) after tasks.py changes."""
    assert codegen.header_path().read_text() == codegen.header_text()
    text = codegen.header_text()
    for t in TaskType:
        assert f"TASK_{t.name} = {int(t)}" in text


def test_transform_chunk_splits_small_layers_to_warp_width():
    from megawino.core.task_sizes import DEFAULT_WORKERS, transform_chunk
    from megawino.core.tasks import LANE_CHANNELS
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
    from megawino.core.resources import cuda_dir
    from megawino.core.tasks import LANE_CHANNELS
    src = (cuda_dir() / "generated_tasks.cuh").read_text()
    assert int(re.search(r"constexpr int LANE_CHANNELS = (\d+);", src).group(1)) == LANE_CHANNELS
    for header in ("input_transform.cuh", "output_transform.cuh"):
        assert "LANE_CHANNELS" in (cuda_dir() / header).read_text()


def test_transform_tile_slices_cover_each_group_once():
    """Input / output tasks split a group's tiles into parts: together the tasks of a group
    cover its tiles x channels exactly once (index = chunk * parts + part)."""
    spec = LayerSpec(3, 37, 21, 23, 19)
    params = TaskParams(tiles_per_group=2 * GEMM_BLOCK_ROWS, input_channels_per_task=16,
                        gemm_k_per_task=8, output_k_per_task=8, input_tiles_per_task=32,
                        output_tiles_per_task=16)
    lay = Layout(spec, params)
    assert lay.input_tile_parts == 4 and lay.output_tile_parts == 8
    assert lay.inputs_per_group == 3 * 4 and lay.outputs_per_group == 3 * 8
    assert lay.input_slices(1, 5) == ((128 + 32, 128 + 64), (16, 32))
    assert lay.output_slices(0, 23) == ((112, 128), (16, 21))
    for slices, count, width in ((lay.input_slices, lay.inputs_per_group, lay.c_stride),
                                 (lay.output_slices, lay.outputs_per_group, spec.K)):
        for group in range(lay.num_groups):
            seen = np.zeros((params.tiles_per_group, width), dtype=int)
            for index in range(count):
                (t0, t1), (c0, c1) = slices(group, index)
                base = group * params.tiles_per_group
                seen[t0 - base:t1 - base, c0:c1] += 1
            assert (seen == 1).all()


@pytest.mark.parametrize("field", ["input_tiles_per_task", "output_tiles_per_task"])
@pytest.mark.parametrize("value", [0, 8, 48, 24, 256])
def test_transform_tiles_must_divide_the_group(field, value):
    with pytest.raises(ValueError, match=field):
        TaskParams(tiles_per_group=128, **{field: value})


def test_transform_tiles_default_to_the_group():
    p = TaskParams(tiles_per_group=192)
    assert p.input_tiles_per_task == p.output_tiles_per_task == 192
    assert TaskParams(tiles_per_group=192, input_tiles_per_task=48).input_tiles_per_task == 48


def test_default_params_split_tiles_only_when_tasks_are_few():
    from megawino.core.task_sizes import transform_tiles
    from megawino.core.tasks import TRANSFORM_MIN_TILES
    assert transform_tiles(64, 24) == TRANSFORM_MIN_TILES     # densenet161.block4: 24 -> 96 tasks
    assert transform_tiles(128, 64) == 16                     # 64 -> 256 tasks is still < 264: 512
    assert transform_tiles(128, 140) == 64                    # 280 >= 264 workers
    assert transform_tiles(128, 300) == 128                   # enough tasks: whole groups
    assert transform_tiles(192, 1) == 48                      # 192 = 4 x 48; 24 is not a multiple of 16
    p = default_params(LayerSpec(64, 192, 48, 7, 7))          # densenet161.block4
    lay = Layout(LayerSpec(64, 192, 48, 7, 7), p)
    assert p.input_tiles_per_task == TRANSFORM_MIN_TILES
    assert lay.num_groups * lay.inputs_per_group >= 4 * 24
    big = default_params(LayerSpec(64, 64, 64, 224, 224))     # vgg16.conv1_2: thousands of tasks
    assert big.input_tiles_per_task == big.output_tiles_per_task == big.tiles_per_group


def test_default_filter_tasks_split_while_few():
    from megawino.core.task_sizes import FILTER_MIN_PAIRS
    small = Layout(LayerSpec(64, 192, 48, 7, 7), default_params(LayerSpec(64, 192, 48, 7, 7)))
    assert small.params.filter_pairs_per_task == FILTER_MIN_PAIRS     # 9216 pairs: 36 tasks
    big = default_params(LayerSpec(64, 512, 512, 14, 14))               # 256 tasks of 1024 < 264
    assert big.filter_pairs_per_task == 512
    assert default_params(LayerSpec(1, 1024, 1024, 14, 14)).filter_pairs_per_task == 1024


def test_codegen_writes_atomically_and_never_over_a_foreign_file(tmp_path):
    path = tmp_path / codegen.HEADER_NAME
    assert codegen.write_header(path).read_text() == codegen.header_text()
    codegen.write_header(path)                       # its own header: rewritten
    foreign = tmp_path / "mine.cuh"
    foreign.write_text("// hand-written\n")
    with pytest.raises(ValueError, match=f"not overwriting {foreign}"):
        codegen.write_header(foreign)
    assert foreign.read_text() == "// hand-written\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([codegen.HEADER_NAME, "mine.cuh"])


# ---- size guards ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec, params, what", [
    # the case: 196e9 tiles (a NumPy MemoryError before the guard)
    (LayerSpec(1000000000, 64, 64, 56, 56), None, r"padded tiles \(the tile ids\) = 196000000000"),
    (LayerSpec(2**31 // 49 + 1, 64, 64, 28, 28), None, r"padded tiles \(the tile ids\) = 2147483776"),
    (LayerSpec(1, 2**31 - 3, 8, 8, 8), small_params(), r"padded channels \(c_stride\) = 2147483648"),
    (LayerSpec(1, 8, 2**31, 8, 8), small_params(), r"K \(output channels\) = 2147483648"),
    (LayerSpec(1, 8, 8, 8, 2**31), small_params(), r"W = 2147483648"),
    # 2^27 tiles (fine) in 2^21 groups of 36 * 1024 GEMM tasks: the int32 ticket head overflows
    (LayerSpec(2**27, 64, 4096, 4, 4), small_params(gemm_k_per_task=4),
     r"tasks plus one ticket fetch per block \(the ticket head\) = \d+"),
])
def test_sizes_past_int32_are_refused_before_any_record_is_built(spec, params, what):
    import tracemalloc
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"too large for the kernels' int32 indices: " + what + r" > 2147483647"):
        build_graph(spec, params)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak            # refused on arithmetic alone, nothing allocated


def test_cli_path_for_a_huge_batch_is_a_value_error():
    from megawino.tuning import choice as tuning_choice
    spec = LayerSpec(1000000000, 64, 64, 56, 56)
    params, mapping, _ = tuning_choice.choose(spec, "h100")    # pure arithmetic
    with pytest.raises(ValueError, match="int32"):
        build_graph(spec, params)


def test_check_size_against_device_memory():
    from megawino.core.task_sizes import buffer_bytes, check_size
    spec, params = LayerSpec(64, 64, 64, 56, 56), default_params(LayerSpec(64, 64, 64, 56, 56))
    lay = check_size(spec, params)
    floats = sum(int(np.prod(s)) for s in (lay.u_shape, lay.v_shape, lay.m_shape))
    assert buffer_bytes(lay) > 4 * floats
    assert check_size(spec, params, memory_bytes=buffer_bytes(lay)).tiles == lay.tiles
    with pytest.raises(ValueError, match=r"needs 0\.\d\d GiB of Winograd buffers, more than the 0\.10 GiB"):
        check_size(spec, params, memory_bytes=int(0.1 * 2**30))


@pytest.mark.parametrize("field, value", [
    ("tiles_per_group", 2**36), ("tiles_per_group", 2**16), ("input_channels_per_task", 2**15 + 1),
    ("gemm_k_per_task", 2**36), ("output_k_per_task", 2**40), ("filter_pairs_per_task", 2**31),
    ("tiles_per_group", True), ("input_tiles_per_task", 2**16), ("m", True),
])
def test_task_params_have_upper_bounds(field, value):
    with pytest.raises(ValueError, match=field):
        small_params(**{field: value})


def test_task_param_limits_keep_transform_work_items_in_int32():
    from megawino.core.tasks import INT32_MAX, MAX_CHANNELS_PER_TASK, MAX_TILES_PER_GROUP, TASK_PARAM_LIMITS
    assert MAX_TILES_PER_GROUP * MAX_CHANNELS_PER_TASK < INT32_MAX
    assert set(TASK_PARAM_LIMITS) == {f.name for f in dataclasses.fields(TaskParams)} - {"m", "fused_output"}
    small_params(tiles_per_group=MAX_TILES_PER_GROUP, input_channels_per_task=MAX_CHANNELS_PER_TASK)
