"""CPU tests of the discrete-event simulator and its cost model."""
import collections
import heapq
import sys

import numpy as np
import pytest

from megawino.schedule.simulator import (CostModel, default_workers, expected_overlap, simulate, sm_layout,
                                sm_overlap, task_work)
from megawino.schedule.timeline import Timeline
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph
from megawino.core.tasks import LANE_CHANNELS, TaskParams, TaskType

SMALL = LayerSpec(2, 5, 3, 9, 7)
MEDIUM = LayerSpec(1, 64, 64, 56, 56)


def random_topological_order(graph, seed):
    """A random parents-first ordering (Kahn's algorithm with random priorities)."""
    rng = np.random.default_rng(seed)
    n = graph.num_tasks
    parents = [set(graph.task_parents(t).tolist()) for t in range(n)]
    children = [[] for _ in range(n)]
    for t, ps in enumerate(parents):
        for p in ps:
            children[p].append(t)
    missing = [len(ps) for ps in parents]
    key = rng.random(n)
    ready = [(key[t], t) for t in range(n) if missing[t] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, t = heapq.heappop(ready)
        order.append(t)
        for c in children[t]:
            missing[c] -= 1
            if missing[c] == 0:
                heapq.heappush(ready, (key[c], c))
    assert len(order) == n
    return np.array(order)


def assert_valid(graph, tl, handoff=1.0):
    n = graph.num_tasks
    assert tl.tickets == n
    assert sorted(tl.task.tolist()) == list(range(n))          # every task exactly once
    assert np.all(tl.start >= tl.fetch + handoff - 1e-9)
    assert np.all(tl.end > tl.start)
    assert np.all(np.diff(tl.fetch) >= -1e-12)                 # tickets claimed in order
    end_of = np.empty(n)
    end_of[tl.task] = tl.end
    start_of = np.empty(n)
    start_of[tl.task] = tl.start
    for task in range(n):
        parents = graph.task_parents(task)
        if len(parents):
            assert start_of[task] >= end_of[parents].max() + handoff - 1e-9, graph.describe_task(task)
    for w in np.unique(tl.worker):
        idx = np.flatnonzero(tl.worker == w)
        order = idx[np.argsort(tl.fetch[idx])]
        assert np.all(tl.fetch[order[1:]] >= tl.end[order[:-1]] - 1e-9)
    assert tl.makespan > 0
    tl.validate()


@pytest.mark.parametrize("spec", [SMALL, MEDIUM], ids=["small", "medium"])
@pytest.mark.parametrize("workers", [1, 3, 264])
def test_sequential_and_random_orders_are_valid(spec, workers):
    graph = build_graph(spec)
    for mapping in (np.arange(graph.num_tasks), random_topological_order(graph, seed=workers)):
        tl = simulate(graph, mapping, workers)
        assert_valid(graph, tl)
        assert np.array_equal(tl.task, mapping)
        assert tl.source == "simulated" and tl.num_workers == workers


def test_interleaved_mapping_simulates():
    from megawino.schedule import mapping as mp
    graph = build_graph(MEDIUM)
    seq = simulate(graph, mp.sequential_mapping(graph), 264)
    inter = simulate(graph, mp.interleaved_mapping(graph, 4, 4, 2), 264)
    assert_valid(graph, seq)
    assert_valid(graph, inter)


def test_child_before_parent_raises_naming_the_ticket():
    graph = build_graph(SMALL)
    first_gemm = int(graph.ids_of(TaskType.GEMM)[0])
    mapping = np.concatenate([[first_gemm], np.delete(np.arange(graph.num_tasks), first_gemm)])
    with pytest.raises(ValueError, match=r"ticket 0 \(GEMM g=0 j=0\) comes before its parent at ticket"):
        simulate(graph, mapping, 4)
    # an output task placed before one of its GEMMs
    out = int(graph.ids_of(TaskType.OUTPUT)[0])
    last_gemm = int(graph.ids_of(TaskType.GEMM)[-1])
    mapping = np.arange(graph.num_tasks)
    mapping[[out, last_gemm]] = mapping[[last_gemm, out]]
    with pytest.raises(ValueError, match=rf"ticket {last_gemm} \(OUTPUT g=0 #0 \(tiles 0\.\.\d+, channels 0\.\.\d+\)\) "
                                         rf"comes before its parent at ticket {out} \(GEMM g=0 j=35\)"):
        simulate(graph, mapping, 4)


def test_mapping_must_be_a_permutation():
    graph = build_graph(SMALL)
    with pytest.raises(ValueError, match="repeats task"):
        simulate(graph, np.zeros(graph.num_tasks, dtype=int), 2)
    with pytest.raises(ValueError, match="is missing"):
        simulate(graph, np.arange(graph.num_tasks - 1), 2)
    with pytest.raises(ValueError, match="outside"):
        simulate(graph, np.arange(1, graph.num_tasks + 1), 2)


def test_one_worker_runs_back_to_back():
    graph = build_graph(MEDIUM)
    model = CostModel(handoff_us=0.7)
    tl = simulate(graph, np.arange(graph.num_tasks), 1, cost_model=model)
    costs = model.task_costs(graph)        # a slot's share of the machine, whatever the grid
    assert tl.makespan == pytest.approx(costs.sum() + graph.num_tasks * 0.7, rel=1e-12)
    assert np.allclose(tl.wait, 0.7)


def test_parents_hold_back_children():
    graph = build_graph(MEDIUM)
    tl = simulate(graph, np.arange(graph.num_tasks), 264)
    # with more workers than ready tasks, GEMMs wait on the input transforms
    assert tl.wait_by_type()[TaskType.GEMM] > graph.ids_of(TaskType.GEMM).size * 1.0 + 1.0
    assert tl.max_wait > 1.0


def test_task_work_matches_layout_slices():
    spec = LayerSpec(2, 37, 45, 20, 20)
    params = TaskParams(tiles_per_group=64, input_channels_per_task=16, gemm_k_per_task=16,
                        output_k_per_task=10, filter_pairs_per_task=300,
                        input_tiles_per_task=32, output_tiles_per_task=16)
    graph = build_graph(spec, params)
    lay = graph.layout
    flops, nbytes = task_work(graph)
    m, a, t, c = params.m, params.alpha, params.tiles_per_group, lay.c_stride
    for task, rec in enumerate(graph.records.tolist()):
        kind, group, idx = TaskType(rec[0]), rec[1], rec[2]
        if kind == TaskType.FILTER:
            lo, hi = lay.filter_pair_range(idx)
            want = ((hi - lo) * 2 * (9 * a + 3 * a * a), (hi - lo) * 4 * (9 + a * a))
        elif kind == TaskType.INPUT:   # channels in whole warps (LANE_CHANNELS): idle lanes cost
            (t0, t1), (lo, hi) = lay.input_slices(group, idx)
            n = -(-(hi - lo) // LANE_CHANNELS) * LANE_CHANNELS
            want = ((t1 - t0) * n * 4 * a ** 3, (t1 - t0) * n * 4 * (m * m + a * a))
        elif kind == TaskType.GEMM:
            lo, hi = lay.gemm_k_range(lay.gemm_position_kblock(idx)[1])
            kw = hi - lo
            want = (2 * t * c * kw, 4 * (t * c + c * kw + t * kw))
        else:
            (t0, t1), (lo, hi) = lay.output_slices(group, idx)
            n = -(-(hi - lo) // LANE_CHANNELS) * LANE_CHANNELS
            want = ((t1 - t0) * n * 2 * (m * a * a + m * m * a), (t1 - t0) * n * 4 * (a * a + m * m))
        assert (flops[task], nbytes[task]) == want, graph.describe_task(task)
    gemm = graph.types == TaskType.GEMM
    assert flops[gemm].sum() == 2 * lay.alpha2 * lay.tiles_padded * lay.c_stride * lay.k_stride


def test_roofline_picks_the_binding_ceiling():
    graph = build_graph(MEDIUM)
    flops, nbytes = task_work(graph)
    compute = CostModel(bytes_per_s=1e30).task_costs(graph, workers=100)
    memory = CostModel(flops_per_s=1e30).task_costs(graph, workers=100)
    both = CostModel().task_costs(graph, workers=100)
    assert np.allclose(compute, flops * 100 / 51.3e12 * 1e6)
    assert np.allclose(memory, nbytes * 100 / 2.97e12 * 1e6)
    assert np.allclose(both, np.maximum(compute, memory))
    scaled = CostModel(scale={int(TaskType.GEMM): 3.0}).task_costs(graph, workers=100)
    gemm = graph.types == TaskType.GEMM
    assert np.allclose(scaled[gemm], 3 * both[gemm]) and np.allclose(scaled[~gemm], both[~gemm])
    assert default_workers() == 264 == CostModel().workers


@pytest.mark.parametrize("handoff", [1.0, 0.4])
def test_calibrate_recovers_scale_and_handoff(handoff):
    graph = build_graph(MEDIUM)
    truth = CostModel(handoff_us=handoff, scale={int(TaskType.GEMM): 2.0, int(TaskType.OUTPUT): 0.5})
    tl = simulate(graph, np.arange(graph.num_tasks), 64, cost_model=truth)
    fitted = CostModel().calibrate(tl, graph)
    assert fitted.scale[int(TaskType.GEMM)] == pytest.approx(2.0, rel=1e-6)
    assert fitted.scale[int(TaskType.OUTPUT)] == pytest.approx(0.5, rel=1e-6)
    assert fitted.scale[int(TaskType.INPUT)] == pytest.approx(1.0, rel=1e-6)
    assert fitted.handoff_us == pytest.approx(handoff, rel=1e-6)
    assert CostModel.from_trace(tl, graph) == fitted
    again = simulate(graph, np.arange(graph.num_tasks), 64, cost_model=fitted)
    assert again.makespan == pytest.approx(tl.makespan, rel=1e-9)


def test_replay_measured_durations():
    graph = build_graph(MEDIUM)
    tl = simulate(graph, np.arange(graph.num_tasks), 16, cost_model=CostModel(scale={2: 1.7}))
    replay = simulate(graph, np.arange(graph.num_tasks), 16, durations=tl.task_durations())
    assert np.allclose(replay.end, tl.end) and np.array_equal(replay.worker, tl.worker)
    with pytest.raises(ValueError, match="durations"):
        simulate(graph, np.arange(graph.num_tasks), 16, durations=-tl.task_durations())


def test_large_layer_is_fast():
    # 64-channel GEMM tasks keep the graph above 60k tasks (default_params now takes 128).
    graph = build_graph(LayerSpec(64, 256, 256, 112, 112),
                        TaskParams(tiles_per_group=128, input_channels_per_task=32, gemm_k_per_task=64))
    assert graph.num_tasks > 60000
    mapping = np.arange(graph.num_tasks)
    # The work, not the seconds: one pass of the ticket loop, which makes no Python call per
    # task and one C call (the heap's) per task; everything else is vectorised.
    calls = collections.Counter()

    def count(frame, event, arg):
        if event == "call":
            calls["python"] += 1
            calls[frame.f_code.co_name] += 1
        elif event == "c_call":
            calls["c"] += 1

    sys.setprofile(count)
    try:
        tl = simulate(graph, mapping, 264)
    finally:
        sys.setprofile(None)
    assert calls["_run"] == 1 and calls["python"] < 2000, calls.most_common(5)
    assert calls["c"] < graph.num_tasks + 2000, calls["c"]
    assert tl.tickets == graph.num_tasks and tl.makespan > 0
    assert np.all(np.diff(tl.fetch) >= 0)


def test_sm_layout_puts_neighbouring_workers_on_one_sm():
    assert sm_layout(264).tolist() == np.repeat(np.arange(132), 2).tolist()
    assert len(set(sm_layout(97).tolist())) == 97                   # below one wave: one per SM
    lay = sm_layout(169)                                            # densenet161.block4's grid
    counts = np.bincount(lay, minlength=132)
    assert len(counts) == 132 and (counts == 2).sum() == 37 and (counts == 1).sum() == 95
    assert np.all(np.diff(lay) >= 0)                                # an SM's workers are consecutive
    doubled = np.flatnonzero(counts == 2)
    assert doubled[0] < 10 and doubled[-1] > 120                    # spread over the SMs


def test_sm_overlap_measures_the_sibling_running():
    # SM 0: [0, 10] and [5, 15] overlap by 5; SM 1: one task alone; SM -1: unknown -> 1
    o = sm_overlap(sm=[0, 0, 1, -1], start=[0.0, 5.0, 0.0, 0.0], end=[10.0, 15.0, 10.0, 4.0])
    assert np.allclose(o, [0.5, 0.5, 0.0, 1.0])


def test_expected_overlap_pairs_launch_tickets_then_uses_utilisation():
    sm_of = sm_layout(4, sms=2)                                     # workers (0, 1) and (2, 3)
    worker = np.array([0, 1, 2, 3, 0])
    start = np.array([0.0, 0.0, 0.0, 8.0, 10.0])
    end = np.array([10.0, 5.0, 10.0, 9.0, 20.0])
    o = expected_overlap(sm_of, worker, start, end)
    assert o[1] == pytest.approx(1.0)           # launch sibling (ticket 0) runs all its time
    # ticket 3 (its sibling's launch ticket) runs 1 of its 10 us; after that sibling's end
    # (1 us) the sibling is busy like any other worker: (10 + 5 + 1) / (10 us * 3 others)
    assert o[2] == pytest.approx((1.0 + 16.0 / 30.0 * 1.0) / 10.0)
    assert o[4] == pytest.approx(0.0)           # after launch: nobody else runs in [10, 20]
    assert np.all(expected_overlap(sm_layout(2, sms=2), [0, 1], [0.0, 0.0], [1.0, 1.0]) == 0)


def test_solo_factor_speeds_up_tasks_alone_on_their_sm():
    graph = build_graph(MEDIUM)
    order = np.arange(graph.num_tasks)
    plain = CostModel()
    solo = CostModel(solo={int(t): 0.5 for t in TaskType})
    one_per_sm = simulate(graph, order, 132, solo)                  # no sibling anywhere
    assert one_per_sm.makespan < simulate(graph, order, 132, plain).makespan * 0.6
    assert np.allclose(one_per_sm.durations, 0.5 * plain.task_costs(graph)[order])
    # every MEDIUM task is a launch ticket, paired on an SM with its neighbour: all shared
    assert simulate(graph, order, 264, solo).makespan == pytest.approx(
        simulate(graph, order, 264, plain).makespan)
    big = build_graph(LayerSpec(8, 64, 64, 56, 56))                # past launch: some alone
    big_order = np.arange(big.num_tasks)
    both = simulate(big, big_order, 264, solo)
    shared = simulate(big, big_order, 264, plain)
    assert both.durations.sum() < shared.durations.sum() and both.makespan < shared.makespan


def _as_measured(tl):
    sm = sm_layout(tl.num_workers)[tl.worker]          # the simulator's placement, as a trace has
    return Timeline(task=tl.task, type=tl.type, worker=tl.worker, sm=sm, fetch=tl.fetch,
                    start=tl.start, end=tl.end, source="measured", num_workers=tl.num_workers)


def test_calibrate_fits_solo_factor_from_sm_ids_and_pools_traces():
    graph = build_graph(LayerSpec(4, 64, 64, 28, 28))
    order = np.arange(graph.num_tasks)
    truth = CostModel(scale={int(TaskType.GEMM): 1.5}, solo={int(TaskType.GEMM): 0.6})
    # the calibration reads SM sharing off the timeline's SM ids; make them exact here
    tl = simulate(graph, order, 200, truth)
    fitted = CostModel().calibrate(_as_measured(tl), graph)
    assert fitted.scale[int(TaskType.GEMM)] == pytest.approx(1.5, rel=0.15)
    assert fitted.solo[int(TaskType.GEMM)] == pytest.approx(0.6, abs=0.1)
    two = CostModel().calibrate([_as_measured(tl), _as_measured(tl)], graph)
    assert two.scale == pytest.approx(fitted.scale) and two.handoff_us == pytest.approx(fitted.handoff_us)
    # without SM ids nothing can be said about sharing: solo stays 1
    blind = Timeline(task=tl.task, type=tl.type, worker=tl.worker, sm=np.full(tl.tickets, -1),
                     fetch=tl.fetch, start=tl.start, end=tl.end, num_workers=tl.num_workers)
    assert all(v == 1.0 for v in CostModel().calibrate(blind, graph).solo.values())


def test_sibling_weight_mixes_the_simulated_sibling_in_and_is_fitted():
    from megawino.schedule.simulator import SIBLING_WEIGHTS
    graph = build_graph(LayerSpec(8, 64, 64, 56, 56))
    order = np.arange(graph.num_tasks)
    solo = {int(t): 0.5 for t in TaskType}
    loose = simulate(graph, order, 264, CostModel(solo=solo))
    tight = simulate(graph, order, 264, CostModel(solo=solo, sibling_weight=1.0))
    assert tight.makespan != pytest.approx(loose.makespan)        # the weight changes durations
    # calibrate picks, from its grid, the weight whose simulation of the traced mapping
    # comes closest to the traced makespan
    fitted = CostModel(solo=solo).calibrate(_as_measured(tight), graph)
    assert fitted.sibling_weight in SIBLING_WEIGHTS
    assert simulate(graph, order, 264, fitted).makespan == pytest.approx(tight.makespan, rel=0.05)
    # several traced mappings: nothing to fit against, the weight stays
    from megawino.schedule.mapping import interleaved_mapping
    other = simulate(graph, interleaved_mapping(graph), 264, CostModel(solo=solo))
    assert not np.array_equal(other.task, tight.task)
    kept = CostModel(solo=solo, sibling_weight=0.25).calibrate([_as_measured(tight), _as_measured(other)], graph)
    assert kept.sibling_weight == 0.25
