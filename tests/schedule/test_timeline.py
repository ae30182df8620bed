"""CPU tests of timelines: summaries, the Perfetto export, terminal rendering, GPU traces."""
import io
import re
import json
from collections import defaultdict

import numpy as np
import pytest
from rich.console import Console

from megawino.schedule.simulator import simulate
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph
from megawino.core.tasks import TaskType
from megawino.schedule.timeline import Timeline, render

MEDIUM = LayerSpec(1, 64, 64, 56, 56)


@pytest.fixture(scope="module")
def graph():
    return build_graph(MEDIUM)


@pytest.fixture(scope="module")
def timeline(graph):
    return simulate(graph, np.arange(graph.num_tasks), 24)


def test_summary_numbers(timeline, graph):
    s = json.loads(json.dumps(timeline.summary()))
    assert s["tickets"] == graph.num_tasks and s["workers"] == 24
    assert s["makespan_us"] == pytest.approx(timeline.end.max())
    assert sum(s["busy_share"].values()) == pytest.approx(1.0)
    assert s["tasks"]["GEMM"] == graph.ids_of(TaskType.GEMM).size
    assert s["total_wait_us"] == pytest.approx(sum(s["wait_by_type_us"].values()))
    assert s["max_wait_us"] == pytest.approx(timeline.wait.max())
    assert 0 < s["utilisation"] <= 1


def test_running_counts_integrate_to_busy_time(timeline):
    bins = 37
    counts = timeline.running_counts(bins)
    assert counts.shape == (bins, len(TaskType))
    width = timeline.makespan / bins
    busy = timeline.durations
    for t in TaskType:
        assert counts[:, t].sum() * width == pytest.approx(busy[timeline.type == t].sum(), rel=1e-9)
    assert np.all(counts.sum(axis=1) <= timeline.num_workers + 1e-9)
    assert timeline.waiting_counts(bins).sum() * width == pytest.approx(timeline.total_wait, rel=1e-9)


def test_perfetto_round_trip(timeline, tmp_path):
    path = tmp_path / "trace.json"
    trace = timeline.to_perfetto(path)
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(json.dumps(trace))
    assert loaded["displayTimeUnit"] == "ns"
    events = loaded["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    tasks = [e for e in slices if e["cat"] != "wait"]
    waits = [e for e in slices if e["cat"] == "wait"]
    assert len(tasks) == timeline.tickets
    assert len(waits) == int((timeline.wait > 0).sum()) > 0
    assert {e["cat"] for e in tasks} == {TaskType(int(c)).name for c in np.unique(timeline.type)}
    assert any(e["name"].startswith("GEMM g=") for e in tasks)
    assert all(e["name"] == "wait" for e in waits)
    per_tid = defaultdict(list)
    for e in slices:
        assert e["dur"] >= 0 and e["pid"] == 0
        per_tid[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for spans in per_tid.values():
        spans.sort()
        for (_, prev_end), (ts, _) in zip(spans, spans[1:]):
            assert ts >= prev_end - 1e-6
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {w: f"worker {w}" for w in range(timeline.num_workers)}
    assert any(e["ph"] == "M" and e["name"] == "process_name" for e in events)
    assert timeline.to_perfetto() == trace          # no path: nothing written, same dict


def _text(renderable, width):
    console = Console(width=width, record=True, file=io.StringIO(), color_system="truecolor")
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("workers", [1, 24, 264])
def test_render_fits_80_columns(graph, workers):
    tl = simulate(graph, np.arange(graph.num_tasks), workers)
    at80, wide = _text(render(tl), 80), _text(render(tl), 200)
    assert at80 == wide                              # nothing wrapped or squeezed at 80
    lines = at80.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("│GEMM") or "GEMM " in line for line in lines)
    assert "F filter" in at80 and "· wait" in at80
    lane_rows = [line for line in lines if re.match(r"│ w\d+ ", line)]
    assert len(lane_rows) == min(16, workers)
    bodies = "".join(row[9:-1] for row in lane_rows)
    assert set(bodies) <= set("FIGO· ") and bodies.strip()
    if workers > 1:
        assert "G" in bodies
    assert f"tickets {graph.num_tasks}" in at80


def test_render_empty_and_narrow(graph):
    empty = Timeline(task=[], type=[], worker=[], sm=[], fetch=[], start=[], end=[])
    assert "empty timeline" in _text(render(empty), 80)
    tl = simulate(graph, np.arange(graph.num_tasks), 8)
    assert max(len(line) for line in _text(render(tl, width=60, lanes=4), 60).splitlines()) <= 60


def _synthetic_records(tl, sms, t0_ns=10**15):
    """A GPU trace (smid, fetch, start, end in ns) from a simulated timeline."""
    ns = lambda a: np.round(a * 1000).astype(np.int64) + t0_ns  # noqa: E731
    return np.stack([tl.worker % sms, ns(tl.fetch), ns(tl.start), ns(tl.end)], axis=1)


def test_from_gpu_trace(graph):
    sim = simulate(graph, np.arange(graph.num_tasks), 12)
    records = _synthetic_records(sim, sms=4)
    tl = Timeline.from_gpu_trace(records, sim.task, graph, label="synthetic")
    assert tl.source == "measured" and tl.label == "synthetic"
    assert tl.num_workers <= 12 and set(tl.sm.tolist()) <= {0, 1, 2, 3}
    assert np.allclose(tl.fetch, sim.fetch, atol=1e-3)
    assert np.allclose(tl.wait, sim.wait, atol=2e-3) and np.allclose(tl.durations, sim.durations, atol=2e-3)
    assert np.array_equal(tl.type, sim.type)
    # workers of one SM are lanes of that SM
    for w in range(tl.num_workers):
        assert len(set(tl.sm[tl.worker == w].tolist())) == 1
    names = tl.worker_names()
    assert names[0] == "SM 0 slot 0" and all(n.startswith("SM ") for n in names)
    tl.validate()
    assert "SM" in _text(render(tl), 80)
    trace = tl.to_perfetto()
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"} == set(names)


def test_from_gpu_trace_rejects_bad_records(graph):
    sim = simulate(graph, np.arange(graph.num_tasks), 4)
    records = _synthetic_records(sim, sms=2)
    records[5, 3] = records[5, 2] - 1                # end before start
    with pytest.raises(ValueError, match="ticket 5"):
        Timeline.from_gpu_trace(records, sim.task, graph)
    with pytest.raises(ValueError, match="int64"):
        Timeline.from_gpu_trace(records[:, :3], sim.task, graph)


def test_validate_catches_overlap_and_order():
    tl = Timeline(task=[0, 1], type=[1, 1], worker=[0, 0], sm=[-1, -1],
                  fetch=[0.0, 1.0], start=[0.5, 1.5], end=[2.0, 3.0])
    with pytest.raises(ValueError, match="overlap on worker 0"):
        tl.validate()
    tl = Timeline(task=[0, 1], type=[1, 1], worker=[0, 1], sm=[-1, -1],
                  fetch=[0.0, 1.0], start=[0.5, 0.9], end=[2.0, 3.0])
    with pytest.raises(ValueError, match="ticket 1 .*start < fetch"):
        tl.validate()
    ok = Timeline(task=[0, 1], type=[1, 2], worker=[0, 1], sm=[-1, -1],
                  fetch=[0.0, 1.0], start=[0.5, 1.0], end=[2.0, 3.0], num_workers=4)
    assert ok.validate() is ok and ok.num_workers == 4 and ok.wait.tolist() == [0.5, 0.0]
    assert ok.busy_share()[TaskType.GEMM] == pytest.approx(2.0 / 3.5)
