import numpy as np
import pytest

from megawino.schedule.mapping import (MappingError, MappingParams, build_interleaved,
                              dependency_distances, sequential_equivalent, sequential_mapping,
                              validate_mapping)
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph
from megawino.core.tasks import GEMM_BLOCK_ROWS, TaskParams, TaskType


def random_case(rng):
    spec = LayerSpec(int(rng.integers(1, 9)), int(rng.integers(1, 130)), int(rng.integers(1, 130)),
                     int(rng.integers(3, 40)), int(rng.integers(3, 40)),
                     padding=int(rng.integers(0, 3)))
    params = TaskParams(m=int(rng.choice([2, 4])),
                        tiles_per_group=GEMM_BLOCK_ROWS * int(rng.integers(1, 3)),
                        input_channels_per_task=int(rng.integers(1, 64)),
                        gemm_k_per_task=4 * int(rng.integers(1, 17)),
                        output_k_per_task=int(rng.integers(1, 64)),
                        filter_pairs_per_task=int(rng.integers(16, 2048)),
                        input_tiles_per_task=int(rng.choice([16, 32, 64])),
                        output_tiles_per_task=int(rng.choice([16, 64])))
    mp = MappingParams(int(rng.integers(0, 200)), int(rng.integers(0, 300)), int(rng.integers(1, 9)))
    return build_graph(spec, params), mp


CASES = 150


@pytest.mark.parametrize("seed", range(CASES))
def test_interleaved_properties(seed):
    rng = np.random.default_rng(seed)
    graph, mp = random_case(rng)
    mapping = build_interleaved(graph, mp)
    order = mapping.order
    # a permutation with parents first
    assert sorted(order.tolist()) == list(range(graph.num_tasks))
    validate_mapping(graph, order)
    types = graph.types[order]
    assert (types[:graph.layout.num_filter_tasks] == TaskType.FILTER).all()
    # distances hold wherever the counts allow: a GEMM may sit closer than DIG to its
    # inputs only once no input is left to place, an output closer than DGO only
    # once every GEMM is placed.
    dist = dependency_distances(graph, order)[order]
    last_input = np.flatnonzero(types == TaskType.INPUT).max()
    last_gemm = np.flatnonzero(types == TaskType.GEMM).max()
    tickets = np.arange(order.size)
    short_gemm = (types == TaskType.GEMM) & (dist < mp.dig)
    short_out = (types == TaskType.OUTPUT) & (dist < mp.dgo)
    assert (tickets[short_gemm] > last_input).all()
    assert (tickets[short_out] > last_gemm).all()
    # the M GEMM tasks that share filter matrix j (same block of M groups) are adjacent
    per_column = min(mp.groups_per_column, graph.layout.num_groups)
    rec = graph.records[order]
    gemm_tickets = np.flatnonzero(types == TaskType.GEMM)
    col = (rec[gemm_tickets, 1] // per_column) * graph.layout.gemms_per_group + rec[gemm_tickets, 2]
    for c in np.unique(col):
        t = gemm_tickets[col == c]
        assert t.max() - t.min() == t.size - 1


def test_body_proportions_follow_task_counts():
    graph = build_graph(LayerSpec(64, 64, 64, 56, 56))
    lay = graph.layout
    mp = MappingParams(64, 128, 4)
    types = graph.types[build_interleaved(graph, mp).order]
    first_out = np.flatnonzero(types == TaskType.OUTPUT).min()
    last_in = np.flatnonzero(types == TaskType.INPUT).max()
    body = types[first_out:last_in]
    total = lay.inputs_per_group + lay.gemms_per_group + lay.outputs_per_group
    expect = np.array([lay.inputs_per_group, lay.gemms_per_group, lay.outputs_per_group]) / total
    window = 4 * mp.groups_per_column * total
    assert body.size > 2 * window
    for start in range(0, body.size - window, window):
        part = body[start:start + window]
        share = np.array([(part == t).mean() for t in (TaskType.INPUT, TaskType.GEMM, TaskType.OUTPUT)])
        assert np.abs(share - expect).max() < 0.05, (start, share, expect)


def test_sequential_is_fig3a():
    graph = build_graph(LayerSpec(2, 16, 16, 12, 12))
    order = sequential_mapping(graph)
    validate_mapping(graph, order)
    types = graph.types[order]
    assert (np.diff(types) >= 0).all()


@pytest.mark.parametrize("seed", range(20))
def test_sequential_equivalent_reproduces_the_sequential_order(seed):
    graph, _ = random_case(np.random.default_rng(1000 + seed))
    params = sequential_equivalent(graph)
    assert params is not None and params.groups_per_column == 1
    assert np.array_equal(build_interleaved(graph, params).order, sequential_mapping(graph))


def test_validator_names_first_offending_ticket():
    graph = build_graph(LayerSpec(2, 16, 16, 12, 12))
    order = sequential_mapping(graph).copy()
    first_gemm = int(np.flatnonzero(graph.types[order] == TaskType.GEMM)[0])
    bad = np.concatenate([order[:1], order[first_gemm:first_gemm + 1], order[1:first_gemm],
                          order[first_gemm + 1:]])
    with pytest.raises(MappingError, match=r"ticket 1 \(GEMM g=0 j=0\) comes before its parent"):
        validate_mapping(graph, bad)
    with pytest.raises(MappingError, match="repeats task"):
        validate_mapping(graph, np.concatenate([order[:-1], order[:1]]))
    with pytest.raises(MappingError, match="is missing"):
        validate_mapping(graph, order[:-1])
    with pytest.raises(MappingError, match="outside"):
        validate_mapping(graph, np.concatenate([order[:-1], [graph.num_tasks]]))


@pytest.mark.parametrize("kw", [dict(dig=-1), dict(dgo=-5), dict(groups_per_column=0), dict(groups_per_column=1.5)])
def test_bad_mapping_params(kw):
    with pytest.raises(ValueError):
        MappingParams(**kw)


@pytest.mark.parametrize("kw", [dict(dig=2**31), dict(dgo=2**40), dict(groups_per_column=2**31), dict(dig=True),
                                dict(dgo="5"), dict(groups_per_column=None)])
def test_mapping_params_have_int32_bounds(kw):
    with pytest.raises(ValueError, match=r"mapping parameter (DIG|DGO|groups_per_column \(the paper's M\)) must be"):
        MappingParams(**kw)
    MappingParams(dig=2**31 - 1, dgo=0, groups_per_column=2**31 - 1)
