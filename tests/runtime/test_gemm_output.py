"""GEMM_OUTPUT tasks (TaskParams.fused_output): the graph, its mappings, the CPU executor and the
errors on the CPU; on the GPU (tests marked ``gpu``) the float64 error, bitwise agreement with the
GEMM + OUTPUT graph of the same layer, between the megakernel and the non-fused kernels and across
mappings, outputs poisoned with NaN before every run."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.tasks import GEMM_OUTPUT_CHANNELS, TaskParams, TaskType
from megawino.core.winograd import direct_conv_nchw, rel_l2
from megawino.cpu import executor
from megawino.schedule import mapping as mapping_mod
from megawino.schedule.simulator import simulate

# C of 16, 32, 48 and 64 (every k-tile count), K below, at and past a K block, partial tiles.
SHAPES = [LayerSpec(2, 32, 40, 13, 11), LayerSpec(3, 64, 64, 9, 14), LayerSpec(1, 16, 8, 5, 6),
          LayerSpec(2, 48, 33, 7, 7, layout="NHWC"), LayerSpec(1, 64, 96, 12, 12, layout="NHWC")]


def fused(spec, m=4, **kw):
    """The heuristic's sizes with GEMM_OUTPUT tasks (``kw`` overrides; a new group size takes
    whole-group transform tasks)."""
    split = {} if "tiles_per_group" not in kw else {"input_tiles_per_task": None, "output_tiles_per_task": None}
    return dataclasses.replace(default_params(spec, m), fused_output=True, gemm_k_per_task=GEMM_OUTPUT_CHANNELS,
                               **split, **kw)


def inputs(spec, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.N, spec.C, spec.H, spec.W)).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    return x, w, (x if spec.layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1)))


def nchw(spec, y):
    y = y.get() if hasattr(y, "get") else np.asarray(y)
    return y if spec.layout == "NCHW" else y.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: s.shape_string + s.layout)
def test_graph_has_gemm_output_tasks_and_no_m(spec, m):
    graph = build_graph(spec, fused(spec, m))
    lay = graph.layout
    kinds = {TaskType(int(c)) for c in np.unique(graph.types)}
    assert kinds == {TaskType.FILTER, TaskType.INPUT, TaskType.GEMM_OUTPUT}
    assert lay.product_type == TaskType.GEMM_OUTPUT and lay.outputs_per_group == 0
    assert lay.gemms_per_group == -(-lay.k_stride // GEMM_OUTPUT_CHANNELS) == lay.k_blocks
    assert graph.ids_of(TaskType.GEMM_OUTPUT).size == lay.num_groups * lay.k_blocks
    assert lay.m_shape[1] == 0
    # Each waits for the filters and its group's inputs; nothing waits for it.
    ids = graph.ids_of(TaskType.GEMM_OUTPUT)
    parents = set(graph.task_parents(int(ids[-1])).tolist())
    group = int(graph.field("group")[ids[-1]])
    inputs_of_group = {int(t) for t in graph.ids_of(TaskType.INPUT) if graph.field("group")[t] == group}
    assert parents == set(graph.ids_of(TaskType.FILTER).tolist()) | inputs_of_group
    assert (graph.field("signal")[ids] < 0).all()
    assert "GEMM_OUTPUT g=" in graph.describe_task(int(ids[-1]))


@pytest.mark.parametrize("spec", SHAPES[:3], ids=lambda s: s.shape_string)
def test_mappings_are_valid_and_simulated(spec):
    graph = build_graph(spec, fused(spec))
    rng = np.random.default_rng(3)
    for _ in range(5):
        mp = mapping_mod.MappingParams(int(rng.integers(0, 40)), int(rng.integers(0, 40)), int(rng.integers(1, 5)))
        order = mapping_mod.resolve_order(graph, mp)     # validates: a permutation, parents first
        assert sorted(order.tolist()) == list(range(graph.num_tasks))
    assert simulate(graph, mapping_mod.sequential_mapping(graph), workers=8).makespan > 0


@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: s.shape_string + s.layout)
def test_cpu_executor_matches_float64(spec, m):
    x, w, xl = inputs(spec, 1)
    ref = direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), padding=1)
    for params in (fused(spec, m), fused(spec, m, tiles_per_group=16)):
        graph = build_graph(spec, params)
        order = mapping_mod.interleaved_mapping(graph, 4, 8, 2)
        got = nchw(spec, executor.execute(graph, order, xl, w).y)
        assert rel_l2(got, ref) < 3e-6


def test_errors_before_anything_runs():
    spec = LayerSpec(1, 32, 64, 8, 8)
    with pytest.raises(ValueError, match="gemm_k_per_task=32"):
        TaskParams(fused_output=True, gemm_k_per_task=64)
    with pytest.raises(ValueError, match="buffer_groups"):
        TaskParams(fused_output=True, gemm_k_per_task=32, buffer_groups=2)
    assert TaskParams(fused_output=True, gemm_k_per_task=32, tiles_per_group=16).tiles_per_group == 16
    with pytest.raises(ValueError, match="multiple of 64"):
        TaskParams(tiles_per_group=32)
    with pytest.raises(ValueError, match="True or False"):
        TaskParams(fused_output="yes", gemm_k_per_task=32)
    with pytest.raises(ValueError, match="up to 64"):
        build_graph(LayerSpec(1, 80, 64, 8, 8), fused(LayerSpec(1, 80, 64, 8, 8)))
    assert build_graph(spec, fused(spec)).num_tasks > 0


def test_table_entries_with_gemm_output_tasks_apply_only_where_they_can():
    """choose() keeps a GEMM_OUTPUT entry for 3xTF32 plans of a narrow enough layer and gives the
    heuristic's GEMM and OUTPUT sizes otherwise (other arithmetics, a wider borrowed shape)."""
    from megawino.tuning import choice as tuning_choice
    entry = {"params": dataclasses.asdict(fused(LayerSpec(64, 32, 64, 208, 208), tiles_per_group=32)),
             "mapping": {"dig": 264, "dgo": 264, "m": 4}}
    for spec, allowed, kept in ((LayerSpec(64, 32, 64, 208, 208), True, True),
                                (LayerSpec(64, 32, 64, 208, 208), False, False),
                                (LayerSpec(2, 64, 3, 30, 30), True, True),
                                (LayerSpec(8, 128, 64, 56, 56), True, False),
                                (LayerSpec(1, 1, 1, 9, 9), True, True)):
        params, _ = tuning_choice.entry_params(entry, spec, allowed)
        assert params.fused_output == kept
        if not kept:
            assert params == default_params(spec)
        assert build_graph(spec, params).num_tasks > 0
    # The shipped H100 table's GEMM_OUTPUT entries: kept for 3xTF32, replaced for FFMA plans.
    res1 = LayerSpec(64, 32, 64, 208, 208)
    if tuning_choice.choose(res1, "h100")[0].fused_output:
        assert not tuning_choice.choose(res1, "h100", fused_output=False)[0].fused_output


# ---- GPU ----------------------------------------------------------------------

def _run(plan, xd, wd):
    import cupy
    out = cupy.full(plan.spec.output_shape, np.nan, dtype=cupy.float32)
    for buf in (plan.U, plan.V, plan.M):
        buf.fill(np.nan)
    plan(xd, wd, out=out)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 2])
@pytest.mark.parametrize("spec", SHAPES, ids=lambda s: s.shape_string + s.layout)
def test_gpu_fused_is_the_gemm_and_output_graphs_bits(spec, m):
    """The products have the GEMM task's bits and the transform is the output task's, so y is
    bitwise that of the unfused graph, in the megakernel and the non-fused kernels alike."""
    import cupy
    import megawino
    x, w, xl = inputs(spec, 7)
    xd, wd = cupy.asarray(xl), cupy.asarray(w)
    ref = _run(megawino.plan(spec, params=default_params(spec, m)), xd, wd)
    for params in (fused(spec, m), fused(spec, m, tiles_per_group=16)):
        mega = megawino.plan(spec, params=params)
        assert "fused_output" in repr(mega)
        y = _run(mega, xd, wd)
        err = rel_l2(nchw(spec, y), direct_conv_nchw(x, w, 1, 1))
        assert not bool(cupy.isnan(y).any()) and err < {4: 3e-6, 2: 1e-6}[m], err
        assert bool((y == ref).all()), f"GEMM_OUTPUT tasks ({params.tiles_per_group} tiles a group) differ from GEMM + OUTPUT"
        y2 = _run(megawino.plan(spec, params=params, algo="nonfused"), xd, wd)
        assert bool((y2 == y).all()), "megakernel and non-fused GEMM_OUTPUT results differ"


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["megakernel", "nonfused"])
def test_gpu_fused_plan_runs_after_other_plans_of_its_module(algo):
    """A module's kernels are shared by its plans: a plan without GEMM_OUTPUT tasks made after one
    with them (as a converted model makes its layers' plans) leaves the first one the shared
    memory it launches with."""
    import cupy
    import megawino
    spec, other = LayerSpec(2, 32, 40, 13, 11), LayerSpec(1, 96, 80, 9, 10)
    x, w, xl = inputs(spec, 5)
    xd, wd = cupy.asarray(xl), cupy.asarray(w)
    first = megawino.plan(spec, params=fused(spec), algo=algo)
    y = _run(first, xd, wd)
    assert rel_l2(nchw(spec, y), direct_conv_nchw(x, w, 1, 1)) < 3e-6
    ox, ow, oxl = inputs(other, 6)
    second = megawino.plan(other, params=default_params(other, 4), algo=algo)
    assert "fused_output" not in repr(second)
    assert rel_l2(nchw(other, _run(second, cupy.asarray(oxl), cupy.asarray(ow))), direct_conv_nchw(ox, ow, 1, 1)) < 3e-6
    assert bool((_run(first, xd, wd) == y).all())


@pytest.mark.gpu
def test_gpu_fused_bitwise_across_mappings():
    import cupy
    import megawino
    spec = LayerSpec(3, 64, 72, 17, 15)
    params = fused(spec, tiles_per_group=64)
    x, w, xl = inputs(spec, 9)
    xd, wd = cupy.asarray(xl), cupy.asarray(w)
    ref = _run(megawino.plan(spec, params=params, mapping=mapping_mod.sequential_mapping(build_graph(spec, params))),
               xd, wd)
    rng = np.random.default_rng(2)
    for i in range(6):
        mp = mapping_mod.MappingParams(int(rng.integers(0, 200)), int(rng.integers(0, 300)), int(rng.integers(1, 9)))
        p = megawino.plan(spec, params=params, mapping=mp)
        for _ in range(2):       # a second launch of the same plan too
            assert bool((_run(p, xd, wd) == ref).all()), f"mapping #{i} {mp} differs"


@pytest.mark.gpu
def test_gpu_fused_needs_3xtf32_without_a_ring():
    import megawino
    spec = LayerSpec(1, 32, 32, 8, 8)
    for kw in ({"gemm_math": "bf16x3"}, {"gemm_math": "ffma"}, {"ring_buffers": True}):
        with pytest.raises(ValueError, match="fused_output"):
            megawino.plan(spec, params=fused(spec), **kw)
