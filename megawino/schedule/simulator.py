"""Discrete-event simulator of the persistent megakernel, with a roofline cost model.

Model of the kernel (docs/design.md, "The persistent megakernel"): P persistent workers (resident
blocks) claim tickets in mapping order; whichever worker is free first takes the
next ticket (ties: lowest worker id).  A worker that claims a ticket at ``fetch``
starts the task at ``max(fetch, ready) + handoff_us`` where ``ready`` is the time
the last parent ended (its counters complete), and ends it ``duration`` later;
then it claims the next ticket at once.  ``handoff_us`` covers the ticket's
atomicAdd and mapping read plus the acquire load of the counters: one hand-off
latency is paid per ticket, whether or not it had to spin (``calibrate`` fits it from traces;
1.0 us is the uncalibrated default).

Workers are resident blocks on SMs (:func:`sm_layout`): the two blocks of an SM take
neighbouring tickets at launch (measured: median ticket gap 2-4), so consecutive worker
ids share an SM.  A task whose SM sibling runs a task at the same time is slower than
one alone on its SM (measured on the H100: GEMM x1.5, transforms x1.1-1.4); the cost
model's per-type ``solo`` factor (duration alone / duration shared) carries that, and
:func:`simulate` resolves who overlaps whom by re-simulating with the previous pass's
overlaps (:data:`COSHARE_PASSES`).  With every ``solo`` at 1 it is one pass, as before.

Because tickets are processed in order and every parent sits at an earlier
ticket (checked first with :func:`megawino.schedule.mapping.validate_mapping`), each task's parents' end times are
known when its ticket is processed; per counter the simulator keeps the latest
end among its signallers.  Cost: one heap operation per ticket.
"""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from ..core import task_types
from ..core.ceilings import MEASURED_CEILINGS
from .mapping import validate_mapping
from .timeline import Timeline


def default_workers(sms: int = 132, residents_per_sm: int = 2) -> int:
    """Persistent grid size: SMs x resident blocks per SM."""
    return int(sms) * int(residents_per_sm)


def task_work(graph) -> tuple[np.ndarray, np.ndarray]:
    """(flops, bytes) per task id: each registered type's ``work`` (megawino.core.task_types) on
    its tasks.  Padded channels count as work (the kernels do them), and so do idle lanes."""
    types = graph.types.astype(np.int64)
    group, index = graph.field("group").astype(np.int64), graph.field("index").astype(np.int64)
    flops, nbytes = np.zeros(len(types)), np.zeros(len(types))
    for entry in task_types.registered():
        sel = types == entry.code
        if sel.any():
            flops[sel], nbytes[sel] = entry.work(graph.layout, group[sel], index[sel])
    return flops, nbytes


COSHARE_PASSES = 3      # simulate passes when some solo factor != 1 (sim 2 and 3 use overlaps)
SIBLING_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)   # the grid CostModel.calibrate fits sibling_weight on
_MIN_SAMPLES = 3         # tasks per side (alone / shared) before a solo factor is fitted


def _center(r) -> float:
    """Mean of the ratios between their 5th and 95th percentiles: the mean, because a
    worker's throughput follows the mean duration (right-skewed on the H100: mean / median
    1.04-1.07 for GEMM), trimmed so that a few outliers do not set it."""
    lo, hi = np.percentile(r, [5, 95])
    kept = r[(r >= lo) & (r <= hi)]
    return float(kept.mean()) if len(kept) else float(np.median(r))


def sm_layout(workers: int, sms: int = 132, residents_per_sm: int = 2) -> np.ndarray:
    """SM of each worker id: SMs in order, each holding consecutive worker ids
    (``workers // sms`` each, one more on ``workers % sms`` SMs spread evenly), the
    launch pattern of a persistent grid of ``workers`` blocks."""
    workers, sms = int(workers), max(1, int(sms))
    per, extra = divmod(workers, sms)
    k = np.arange(sms)
    counts = per + ((k + 1) * extra // sms - k * extra // sms)
    return np.repeat(k, counts).astype(np.int64)


def sm_overlap(sm, start, end) -> np.ndarray:
    """Per ticket: share of its [start, end] during which another task ran on the same SM
    (1 = shared all the time, 0 = alone; SM < 0 = unknown: 1, the calibrated default)."""
    sm, start, end = (np.asarray(a) for a in (sm, start, end))
    out = np.ones(len(sm))
    dur = end - start
    for s in np.unique(sm[sm >= 0]).tolist():
        idx = np.flatnonzero(sm == s)
        starts, ends = np.sort(start[idx]), np.sort(end[idx])
        ps = np.concatenate([[0.0], np.cumsum(starts)])
        pe = np.concatenate([[0.0], np.cumsum(ends)])

        def busy(t):   # summed running time of the SM's tasks before t
            ks, ke = np.searchsorted(starts, t), np.searchsorted(ends, t)
            return ks * t - ps[ks] - (ke * t - pe[ke])
        other = busy(end[idx]) - busy(start[idx]) - dur[idx]
        d = dur[idx]
        out[idx] = np.where(d > 0, np.clip(other / np.where(d > 0, d, 1.0), 0.0, 1.0), 1.0)
    return out


def expected_overlap(sm_of, worker, start, end) -> np.ndarray:
    """Per ticket of a simulated pass: the share of its run during which its SM sibling
    is expected to run a task.  Launch tickets (the first of each worker) share the SM
    with the sibling's launch ticket as simulated; after that the sibling is whichever
    block the hardware put there, decorrelated from the schedule by run-to-run jitter,
    so it is busy with the probability that any other worker is (measured: outputs in
    a layer's tail mostly run alone, where lock-stepped simulated pairs would not)."""
    sm_of, worker = np.asarray(sm_of), np.asarray(worker)
    start, end = np.asarray(start, float), np.asarray(end, float)
    n, workers = len(worker), len(sm_of)
    dur = end - start
    s_sorted, e_sorted = np.sort(start), np.sort(end)
    ps = np.concatenate([[0.0], np.cumsum(s_sorted)])
    pe = np.concatenate([[0.0], np.cumsum(e_sorted)])

    def busy(t):   # summed running time of all tasks before t
        ks, ke = np.searchsorted(s_sorted, t), np.searchsorted(e_sorted, t)
        return ks * t - ps[ks] - (ke * t - pe[ke])
    safe = np.where(dur > 0, dur, 1.0)
    others = max(workers - 1, 1)
    util = np.clip((busy(end) - busy(start) - dur) / (safe * others), 0.0, 1.0)
    per_sm = np.bincount(sm_of)
    has_sibling = per_sm[sm_of[worker]] > 1
    o = np.where(has_sibling, util, 0.0)
    launch = min(n, workers)                       # ticket i < workers is worker i's first
    first_w = np.asarray(worker[:launch])
    ticket_of = np.full(workers, -1)
    ticket_of[first_w] = np.arange(launch)
    for w in np.flatnonzero(has_sibling[:launch]).tolist():
        i = w
        mates = np.flatnonzero(sm_of == sm_of[worker[i]])
        mates = mates[(mates != worker[i]) & (ticket_of[mates] >= 0)]
        if not len(mates) or dur[i] <= 0:
            continue
        j = ticket_of[mates[0]]
        shared = max(0.0, min(end[i], end[j]) - max(start[i], start[j]))
        after = max(0.0, end[i] - max(end[j], start[i]))
        o[i] = min(1.0, (shared + util[i] * after) / dur[i])
    return o


# The H100's record: the defaults (and the CLI's model without a GPU).
_DEFAULT = MEASURED_CEILINGS["h100"]


def _ones() -> dict:
    """A factor of 1 per registered task type."""
    return {int(c): 1.0 for c in task_types.codes()}


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Roofline durations with each resident slot's share of the GPU's ceilings.

    duration(task) = max(flops / (flops_per_s / W), bytes / (bytes_per_s / W)) * scale[type]
    with W = sms x residents_per_sm, the slots of the machine (a block's speed is set by
    its SM, not by how many blocks the grid has), for a task whose SM sibling is busy the
    whole time; a task alone on its SM for a share ``1 - o`` of its time takes
    ``(solo + (1 - solo) * o)`` of that.  This ignores that memory-bound and compute-bound
    tasks running side by side use the GPU better than either alone; per-type ``scale``
    and ``solo`` factors, fitted to measured traces by :meth:`calibrate`, absorb that and
    every other error; so does ``sibling_weight`` (how far a task's SM sibling follows the
    simulated schedule rather than run-to-run jitter: what sets a small layer's tail).  Defaults:
    the H100's measured ceilings; :meth:`for_ceilings` takes another GPU's
    (megawino.gpu.identity.ceilings).
    """

    flops_per_s: float = _DEFAULT.flops_per_s
    bytes_per_s: float = _DEFAULT.bytes_per_s
    sms: int = _DEFAULT.sms
    handoff_us: float = 1.0
    scale: dict = dataclasses.field(default_factory=_ones)
    residents_per_sm: int = 2
    solo: dict = dataclasses.field(default_factory=_ones)
    # How far a ticket's SM sibling follows the simulated schedule (0: decorrelated by jitter,
    # expected_overlap; 1: the simulated sibling's own tasks), fitted by calibrate.
    sibling_weight: float = 0.0
    device: str = _DEFAULT.device     # the GPU whose ceilings these are (said in the CLI)

    @classmethod
    def for_ceilings(cls, ceilings, **fields) -> "CostModel":
        """The uncalibrated model of a GPU of ``ceilings`` (megawino.core.ceilings.Ceilings)."""
        return cls(flops_per_s=ceilings.flops_per_s, bytes_per_s=ceilings.bytes_per_s, sms=ceilings.sms,
                   device=ceilings.device, **fields)

    @property
    def workers(self) -> int:
        return default_workers(self.sms, self.residents_per_sm)

    def scale_array(self) -> np.ndarray:
        return np.array(task_types.by_code(lambda e: float(self.scale.get(e.code, 1.0)), 1.0))

    def solo_array(self) -> np.ndarray:
        return np.array(task_types.by_code(lambda e: float(self.solo.get(e.code, 1.0)), 1.0))

    def task_costs(self, graph, workers: int | None = None) -> np.ndarray:
        """Duration in microseconds per task id, its SM shared (``workers``: the share
        divisor W, default the machine's slots)."""
        w = float(workers if workers is not None else self.workers)
        flops, nbytes = task_work(graph)
        us = np.maximum(flops * w / self.flops_per_s, nbytes * w / self.bytes_per_s) * 1e6
        return us * self.scale_array()[graph.types.astype(np.int64)]

    def calibrate(self, timelines, graph) -> "CostModel":
        """Fit to one or more (measured) timelines of ``graph``, samples pooled.  Per type,
        with r = measured / unscaled predicted duration and o = :func:`sm_overlap`: the
        tasks with o >= 1/2 and those with o < 1/2 give two (median o, median r) points;
        the line through them read at o = 1 is ``scale``, at o = 0 over that ``solo``
        (clipped to 0.3..1: sharing an SM cannot make a task faster).  With fewer than
        three tasks on a side (or no SM ids), scale = median r and solo = 1.
        handoff = median of start - max(fetch, parents' end), plus the median gap
        between a worker's end and its next fetch.  Types absent keep their factors."""
        if isinstance(timelines, Timeline):
            timelines = [timelines]
        base = dataclasses.replace(self, scale=_ones())
        unscaled = base.task_costs(graph)
        ratio, over, types, hand, gaps = [], [], [], [], []
        for tl in timelines:
            predicted = unscaled[tl.task]
            ok = predicted > 0
            ratio.append((tl.durations / np.where(ok, predicted, 1.0))[ok])
            over.append(sm_overlap(tl.sm, tl.start, tl.end)[ok])
            types.append(tl.type[ok])
            hand.append(tl.start - np.maximum(tl.fetch, parents_end(graph, tl)))
            order = np.lexsort((tl.fetch, tl.worker))
            same = tl.worker[order[1:]] == tl.worker[order[:-1]]
            gaps.append((tl.fetch[order[1:]] - tl.end[order[:-1]])[same])
        ratio, over, types = np.concatenate(ratio), np.concatenate(over), np.concatenate(types)
        scale, solo = dict(self.scale), dict(self.solo)
        for t in task_types.codes().tolist():
            sel = types == t
            if not sel.any():
                continue
            r, o = ratio[sel], over[sel]
            hi, lo = o >= 0.5, o < 0.5
            scale[int(t)], solo[int(t)] = _center(r), 1.0
            o_hi = float(np.median(o[hi])) if hi.any() else 1.0
            o_lo = float(np.median(o[lo])) if lo.any() else 0.0
            if min(hi.sum(), lo.sum()) >= _MIN_SAMPLES and o_hi - o_lo >= 0.25:
                r_hi, r_lo = _center(r[hi]), _center(r[lo])
                slope = (r_hi - r_lo) / (o_hi - o_lo)
                shared = r_hi + slope * (1.0 - o_hi)
                if shared > 0:
                    scale[int(t)] = shared
                    solo[int(t)] = float(np.clip((r_lo - slope * o_lo) / shared, 0.3, 1.0))
        handoff = float(np.median(np.concatenate(hand)))
        gaps = np.concatenate(gaps)
        if len(gaps):
            handoff += max(0.0, float(np.median(gaps)))
        fitted = dataclasses.replace(self, scale=scale, solo=solo, handoff_us=max(0.0, handoff))
        return fitted._fit_sibling_weight(timelines, graph)

    def _fit_sibling_weight(self, timelines, graph) -> "CostModel":
        """``sibling_weight`` from SIBLING_WEIGHTS whose simulation of the traced mapping comes
        closest to the median traced makespan.  On a small layer the makespan is set by the
        slowest task of a short tail, and whether its SM sibling is busy depends on which
        blocks freed up together, which a model that treats siblings as independent misses.
        Kept at the current weight when every mapping traced differs or no solo factor is
        below 1."""
        if all(v == 1.0 for v in self.solo.values()):
            return self
        orders = {tuple(tl.task.tolist()) for tl in timelines}
        if len(orders) != 1:
            return self
        order = timelines[0].task
        workers = max(tl.num_workers for tl in timelines)
        target = float(np.median([tl.makespan for tl in timelines]))
        if target <= 0:
            return self
        best = min(SIBLING_WEIGHTS, key=lambda wgt: abs(simulate(
            graph, order, workers, dataclasses.replace(self, sibling_weight=wgt)).makespan - target))
        return dataclasses.replace(self, sibling_weight=float(best))

    @classmethod
    def from_trace(cls, timelines, graph, **fields) -> "CostModel":
        """A model with the given base fields, calibrated to ``timelines`` (one or more)."""
        return cls(**fields).calibrate(timelines, graph)


def parents_end(graph, timeline: Timeline) -> np.ndarray:
    """Per ticket: the latest end among the task's parents (0 where it has none)."""
    end_by_task = np.zeros(graph.num_tasks)
    end_by_task[timeline.task] = timeline.end
    counter_end = np.zeros(graph.layout.num_counters)
    sig = graph.field("signal")
    has = sig >= 0
    np.maximum.at(counter_end, sig[has], end_by_task[has])
    ready = np.zeros(timeline.tickets)
    for wait in ("wait_a", "wait_b"):
        c = graph.field(wait)[timeline.task]
        ready = np.where(c >= 0, np.maximum(ready, counter_end[np.maximum(c, 0)]), ready)
    return ready


def _run(graph, mapping: list, workers: int, dur: list, h: float):
    """One pass of the ticket loop: (fetch, start, end, worker) lists per ticket."""
    wait_a, wait_b = graph.field("wait_a").tolist(), graph.field("wait_b").tolist()
    signal = graph.field("signal").tolist()
    counter_end = [0.0] * graph.layout.num_counters
    n = len(mapping)
    heap = [(0.0, w) for w in range(workers)]           # (free time, worker): sorted, so a heap
    fetch, start, end, worker = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n
    replace = heapq.heapreplace
    for i, task in enumerate(mapping):
        free, w = heap[0]
        ready = free
        a, b = wait_a[task], wait_b[task]
        if a >= 0 and counter_end[a] > ready:
            ready = counter_end[a]
        if b >= 0 and counter_end[b] > ready:
            ready = counter_end[b]
        s = ready + h
        e = s + dur[i]
        c = signal[task]
        if c >= 0 and e > counter_end[c]:
            counter_end[c] = e
        fetch[i], start[i], end[i], worker[i] = free, s, e, w
        replace(heap, (e, w))
    return fetch, start, end, worker


def simulate(graph, mapping, workers: int | None = None, cost_model: CostModel | None = None,
             durations=None, label: str = "") -> Timeline:
    """Simulate the persistent kernel running ``mapping`` (ticket -> task id) on
    ``workers`` workers (default: the cost model's SMs x residents), placed on SMs by
    :func:`sm_layout`.  Durations come from ``durations`` (us per task id, e.g.
    ``Timeline.task_durations`` of a measured trace, taken as they are) or from the cost
    model, SM sharing included (module docstring).  Raises ValueError for a mapping that
    could deadlock."""
    model = cost_model if cost_model is not None else CostModel()
    workers = int(workers if workers is not None else model.workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    validate_mapping(graph, mapping)   # the one validator: parents first, a permutation
    mapping = np.asarray(mapping, dtype=np.int64)
    n = graph.num_tasks
    solo = np.ones(n)
    if durations is None:
        shared = model.task_costs(graph)[mapping]
        solo = model.solo_array()[graph.types.astype(np.int64)[mapping]]
    else:
        dur = np.asarray(durations, dtype=np.float64)
        if dur.shape != (n,) or not np.all(np.isfinite(dur)) or np.any(dur < 0):
            raise ValueError(f"durations must be {n} finite non-negative numbers (us per task id)")
        shared = dur[mapping]
    sm_of = sm_layout(workers, model.sms, model.residents_per_sm)
    order, h = mapping.tolist(), float(model.handoff_us)
    dur = shared
    passes = COSHARE_PASSES if np.any(solo != 1.0) else 1
    for p in range(passes):
        fetch, start, end, worker = (np.array(a) for a in _run(graph, order, workers, dur.tolist(), h))
        if p + 1 < passes:
            o = expected_overlap(sm_of, worker, start, end)
            wgt = float(model.sibling_weight)
            if wgt > 0:
                o = (1.0 - wgt) * o + wgt * sm_overlap(sm_of[worker], start, end)
            dur = shared * (solo + (1.0 - solo) * o)
    if not label:
        spec = graph.layout.spec
        label = spec.name or spec.shape_string
    # SM -1: the layout is the model's, not a measured placement (names stay 'worker w')
    return Timeline.from_graph(graph, mapping, worker, np.full(n, -1), fetch, start, end,
                               label=label, source="simulated", num_workers=workers)
