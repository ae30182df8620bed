"""Discrete-event simulator of the persistent megakernel, with a roofline cost model.

Model of the kernel (DESIGN.md, "The megakernel"): P persistent workers (resident
blocks) claim tickets in mapping order; whichever worker is free first takes the
next ticket (ties: lowest worker id).  A worker that claims a ticket at ``fetch``
starts the task at ``max(fetch, ready) + handoff_us`` where ``ready`` is the time
the last parent ended (its counters complete), and ends it ``duration`` later;
then it claims the next ticket at once.  ``handoff_us`` covers the ticket's
atomicAdd and mapping read plus the acquire load of the counters: one hand-off
latency is paid per ticket, whether or not it had to spin (H100: about 1.0 us).

Because tickets are processed in order and every parent sits at an earlier
ticket (checked first with :func:`megawino.mapping.validate_mapping`), each task's parents' end times are
known when its ticket is processed; per counter the simulator keeps the latest
end among its signallers.  Cost: one heap operation per ticket.
"""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from .mapping import validate_mapping
from .tasks import TASK_RECORD_FIELDS, TaskType
from .timeline import Timeline

_WAIT_A = TASK_RECORD_FIELDS.index("wait_a")
_WAIT_B = TASK_RECORD_FIELDS.index("wait_b")
_SIGNAL = TASK_RECORD_FIELDS.index("signal")


def default_workers(sms: int = 132, residents_per_sm: int = 2) -> int:
    """Persistent grid size: SMs x resident blocks per SM."""
    return int(sms) * int(residents_per_sm)


def task_work(graph) -> tuple[np.ndarray, np.ndarray]:
    """(flops, bytes) per task id, vectorised over the records.

    FILTER: per (c, k) pair, G g G^T: 2*(alpha*9 + alpha^2*3) flops; reads 9 floats,
    writes alpha^2.  INPUT: per (tile, channel) B^T d B, two alpha^3 multiply-add
    products (4*alpha^3 flops); reads the m*m unique input pixels (the overlap comes
    from L2), writes alpha^2 floats of V.  GEMM: V[p][rows][:] @ U[p][:][kcols]:
    2*t*C*kw flops; reads t*C + C*kw floats, writes t*kw.  OUTPUT: per (tile, k)
    A^T M A: 2*(m*alpha^2 + m^2*alpha) flops; reads alpha^2, writes m*m floats.
    Padded channels count as work (the kernels do them).
    """
    layout, p = graph.layout, graph.layout.params
    m, a, t = p.m, p.alpha, p.tiles_per_group
    types, idx = graph.types.astype(np.int64), graph.field("index").astype(np.int64)

    def width(lo, per, total):
        return np.clip(np.minimum(total, lo + per) - lo, 0, None).astype(np.float64)

    pairs = width(idx * p.filter_pairs_per_task, p.filter_pairs_per_task, layout.c_stride * layout.k_stride)
    chans = width(idx * p.input_channels_per_task, p.input_channels_per_task, layout.c_stride)
    kb = idx % layout.k_blocks
    kw = width(kb * p.gemm_k_per_task, p.gemm_k_per_task, layout.k_stride)
    kch = width(idx * p.output_k_per_task, p.output_k_per_task, layout.spec.K)
    c = float(layout.c_stride)
    flops_by_type = [pairs * 2 * (a * 9 + a * a * 3), t * chans * 4 * a ** 3,
                     2.0 * t * c * kw, t * kch * 2 * (m * a * a + m * m * a)]
    bytes_by_type = [pairs * 4 * (9 + a * a), t * chans * 4 * (m * m + a * a),
                     4.0 * (t * c + c * kw + t * kw), t * kch * 4 * (a * a + m * m)]
    flops, nbytes = np.zeros(len(types)), np.zeros(len(types))
    for tt in TaskType:
        sel = types == tt
        flops[sel] = flops_by_type[tt][sel]
        nbytes[sel] = bytes_by_type[tt][sel]
    return flops, nbytes


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Roofline durations with each worker's share of the GPU's ceilings.

    duration(task) = max(flops / (flops_per_s / W), bytes / (bytes_per_s / W)) * scale[type]
    for W workers.  This ignores that memory-bound and compute-bound tasks running
    side by side use the GPU better than either alone; per-type ``scale`` factors,
    fitted to a measured trace by :meth:`calibrate`, absorb that and every other error.
    Defaults: H100 ceilings (suite/baseline-h100.md).
    """

    flops_per_s: float = 51.3e12
    bytes_per_s: float = 2.97e12
    sms: int = 132
    handoff_us: float = 1.0
    scale: dict = dataclasses.field(default_factory=lambda: {int(t): 1.0 for t in TaskType})
    residents_per_sm: int = 2

    @property
    def workers(self) -> int:
        return default_workers(self.sms, self.residents_per_sm)

    def scale_array(self) -> np.ndarray:
        return np.array([float(self.scale.get(int(t), 1.0)) for t in TaskType])

    def task_costs(self, graph, workers: int | None = None) -> np.ndarray:
        """Duration in microseconds per task id."""
        w = float(workers if workers is not None else self.workers)
        flops, nbytes = task_work(graph)
        us = np.maximum(flops * w / self.flops_per_s, nbytes * w / self.bytes_per_s) * 1e6
        return us * self.scale_array()[graph.types.astype(np.int64)]

    def calibrate(self, timeline: Timeline, graph) -> "CostModel":
        """Fit to a (measured) timeline of ``graph``: per type, scale = median of
        measured / unscaled predicted duration (with the timeline's worker count);
        handoff = median of start - max(fetch, parents' end), plus the median gap
        between a worker's end and its next fetch.  Types absent keep their scale."""
        base = dataclasses.replace(self, scale={int(t): 1.0 for t in TaskType})
        predicted = base.task_costs(graph, workers=timeline.num_workers)[timeline.task]
        measured = timeline.durations
        scale = dict(self.scale)
        for t in TaskType:
            sel = (timeline.type == t) & (predicted > 0)
            if sel.any():
                scale[int(t)] = float(np.median(measured[sel] / predicted[sel]))
        ready = parents_end(graph, timeline)
        handoff = float(np.median(timeline.start - np.maximum(timeline.fetch, ready)))
        order = np.lexsort((timeline.fetch, timeline.worker))
        same = timeline.worker[order[1:]] == timeline.worker[order[:-1]]
        gaps = (timeline.fetch[order[1:]] - timeline.end[order[:-1]])[same]
        if len(gaps):
            handoff += max(0.0, float(np.median(gaps)))
        return dataclasses.replace(self, scale=scale, handoff_us=max(0.0, handoff))

    @classmethod
    def from_trace(cls, timeline: Timeline, graph, **fields) -> "CostModel":
        """A model with the given base fields, calibrated to ``timeline``."""
        return cls(**fields).calibrate(timeline, graph)


def parents_end(graph, timeline: Timeline) -> np.ndarray:
    """Per ticket: the latest end among the task's parents (0 where it has none)."""
    end_by_task = np.zeros(graph.num_tasks)
    end_by_task[timeline.task] = timeline.end
    counter_end = np.zeros(graph.layout.num_counters)
    sig = graph.records[:, _SIGNAL]
    has = sig >= 0
    np.maximum.at(counter_end, sig[has], end_by_task[has])
    ready = np.zeros(timeline.tickets)
    for col in (_WAIT_A, _WAIT_B):
        c = graph.records[timeline.task, col]
        ready = np.where(c >= 0, np.maximum(ready, counter_end[np.maximum(c, 0)]), ready)
    return ready


def simulate(graph, mapping, workers: int | None = None, cost_model: CostModel | None = None,
             durations=None, label: str = "") -> Timeline:
    """Simulate the persistent kernel running ``mapping`` (ticket -> task id) on
    ``workers`` workers (default: the cost model's SMs x residents).  Durations come
    from ``durations`` (us per task id, e.g. ``Timeline.task_durations`` of a measured
    trace) or from the cost model.  Raises ValueError for a mapping that could deadlock."""
    model = cost_model if cost_model is not None else CostModel()
    workers = int(workers if workers is not None else model.workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    validate_mapping(graph, mapping)   # the one validator: parents first, a permutation
    mapping = np.asarray(mapping, dtype=np.int64)
    n = graph.num_tasks
    if durations is None:
        dur = model.task_costs(graph, workers=workers)
    else:
        dur = np.asarray(durations, dtype=np.float64)
        if dur.shape != (n,) or not np.all(np.isfinite(dur)) or np.any(dur < 0):
            raise ValueError(f"durations must be {n} finite non-negative numbers (us per task id)")
    h = float(model.handoff_us)
    rec = graph.records
    wait_a, wait_b = rec[:, _WAIT_A].tolist(), rec[:, _WAIT_B].tolist()
    signal, dur_l = rec[:, _SIGNAL].tolist(), dur.tolist()
    counter_end = [0.0] * graph.layout.num_counters
    heap = [(0.0, w) for w in range(workers)]           # (free time, worker): sorted, so a heap
    fetch, start, end, worker = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    replace = heapq.heapreplace
    for i, task in enumerate(mapping.tolist()):
        free, w = heap[0]
        ready = free
        a, b = wait_a[task], wait_b[task]
        if a >= 0 and counter_end[a] > ready:
            ready = counter_end[a]
        if b >= 0 and counter_end[b] > ready:
            ready = counter_end[b]
        s = ready + h
        e = s + dur_l[task]
        c = signal[task]
        if c >= 0 and e > counter_end[c]:
            counter_end[c] = e
        fetch[i], start[i], end[i], worker[i] = free, s, e, w
        replace(heap, (e, w))
    if not label:
        spec = graph.layout.spec
        label = spec.name or spec.shape_string
    return Timeline.from_graph(graph, mapping, np.array(worker), np.full(n, -1), np.array(fetch),
                               np.array(start), np.array(end), label=label, source="simulated",
                               num_workers=workers)
