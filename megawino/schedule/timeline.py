"""Task timelines of the persistent megakernel: simulated or measured, one row per ticket.

A :class:`Timeline` holds, per ticket (the order in which persistent workers
claimed tasks), the task id and type, the worker that ran it, the SM (-1 when
unknown), and three times in microseconds from the kernel's first fetch:
``fetch`` (ticket claimed), ``start`` (parents done, work begins) and ``end``.
``wait = start - fetch`` is the time a worker spent claiming the ticket and
waiting on its parents' counters.

Views: :meth:`Timeline.summary` (JSON-able numbers), :meth:`Timeline.running_counts`
(the paper's Fig. 3: running tasks of each type over time), :meth:`Timeline.to_perfetto`
(Chrome / Perfetto trace-event JSON) and :func:`render` (a rich renderable for an
80-column terminal).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..core import task_types
from ..core.abi import TRACE_DTYPE, TRACE_FIELDS
from ..core.tasks import TaskType
_SHADES = " ▁▂▃▄▅▆▇█"
_EPS = 1e-9


def _occupancy(lo: np.ndarray, hi: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Integral over each bin [edges[b], edges[b+1]) of the number of intervals
    [lo, hi) covering the time: sum_i clip(x - lo_i, 0, hi_i - lo_i), differenced."""
    def cumulative(points):
        points = np.sort(points)
        prefix = np.concatenate([[0.0], np.cumsum(points)])
        k = np.searchsorted(points, edges, side="right")
        return k * edges - prefix[k]
    if len(lo) == 0:
        return np.zeros(len(edges) - 1)
    return np.diff(cumulative(np.asarray(lo, float)) - cumulative(np.asarray(hi, float)))


@dataclasses.dataclass
class Timeline:
    """Per-ticket arrays (index = ticket) plus metadata."""

    task: np.ndarray
    type: np.ndarray
    worker: np.ndarray
    sm: np.ndarray
    fetch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    label: str = ""
    source: str = "simulated"         # "simulated" or "measured"
    num_workers: int = 0
    group: np.ndarray | None = None   # task group per ticket (for names); None if unknown
    index: np.ndarray | None = None   # index within the group per ticket

    def __post_init__(self):
        for name in ("task", "type", "worker", "sm"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        for name in ("fetch", "start", "end"):
            setattr(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        n = len(self.task)
        for name in ("type", "worker", "sm", "fetch", "start", "end"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Timeline.{name} has {len(getattr(self, name))} entries, task has {n}")
        if n:
            self.num_workers = max(int(self.num_workers), int(self.worker.max()) + 1)

    @classmethod
    def from_graph(cls, graph, mapping, worker, sm, fetch, start, end, **meta) -> "Timeline":
        """Timeline whose task types and names come from the graph's records."""
        task = np.asarray(mapping, dtype=np.int64)
        rec = graph.typed_records[task]
        return cls(task=task, type=rec["type"], worker=worker, sm=sm, fetch=fetch, start=start,
                   end=end, group=rec["group"].astype(np.int64), index=rec["index"].astype(np.int64), **meta)

    @classmethod
    def from_gpu_trace(cls, records, mapping, graph, label: str = "") -> "Timeline":
        """Timeline from the megakernel's raw trace: per ticket (smid, fetch_ns, start_ns,
        end_ns) read from %smid / %globaltimer.

        The trace does not say which resident block ran a ticket, so tickets are put
        on lanes per SM: in fetch order, each ticket goes to the lane of its SM whose
        last end is the latest one still <= its fetch (a block fetches right after
        its previous task ends), or to a new lane.  Slices on one lane never overlap.
        """
        rec = np.ascontiguousarray(records, dtype=np.int64)
        mapping = np.asarray(mapping, dtype=np.int64)
        if rec.ndim != 2 or rec.shape[1] != len(TRACE_FIELDS) or rec.shape[0] != len(mapping):
            raise ValueError(f"GPU trace must be int64 [{len(mapping)}][{len(TRACE_FIELDS)}] "
                             f"({', '.join(TRACE_FIELDS)}), got shape {rec.shape}")
        rows = rec.view(TRACE_DTYPE).reshape(-1)
        smid, f_ns, s_ns, e_ns = (rows[name] for name in TRACE_FIELDS)
        bad = np.flatnonzero((s_ns < f_ns) | (e_ns < s_ns))
        if len(bad):
            t = int(bad[0])
            raise ValueError(f"GPU trace ticket {t}: times out of order (fetch {f_ns[t]}, "
                             f"start {s_ns[t]}, end {e_ns[t]} ns)")
        lane = np.zeros(len(rec), dtype=np.int64)
        lanes: dict[int, list[int]] = {}
        for t in np.lexsort((np.arange(len(rec)), f_ns)).tolist():
            ends = lanes.setdefault(int(smid[t]), [])
            fetch, best = int(f_ns[t]), -1
            for j, last in enumerate(ends):
                if last <= fetch and (best < 0 or last > ends[best]):
                    best = j
            if best < 0:
                ends.append(0)
                best = len(ends) - 1
            ends[best] = int(e_ns[t])
            lane[t] = best
        offset, total = {}, 0
        for s in sorted(lanes):
            offset[s] = total
            total += len(lanes[s])
        worker = np.array([offset[int(s)] for s in smid.tolist()], dtype=np.int64) + lane
        t0 = f_ns.min() if len(rec) else 0
        us = lambda a: (a - t0).astype(np.float64) / 1000.0  # noqa: E731
        return cls.from_graph(graph, mapping, worker, smid, us(f_ns), us(s_ns), us(e_ns),
                              label=label, source="measured", num_workers=total).validate()

    # ---- basic views ---------------------------------------------------
    @property
    def tickets(self) -> int:
        return len(self.task)

    @property
    def wait(self) -> np.ndarray:
        return self.start - self.fetch

    @property
    def durations(self) -> np.ndarray:
        return self.end - self.start

    def task_durations(self, num_tasks: int | None = None) -> np.ndarray:
        """Duration (us) per task id, e.g. to replay a measured trace in the simulator."""
        out = np.zeros(num_tasks if num_tasks is not None else self.tickets)
        out[self.task] = self.durations
        return out

    @property
    def makespan(self) -> float:
        return float(self.end.max() - self.fetch.min()) if self.tickets else 0.0

    @property
    def total_wait(self) -> float:
        return float(self.wait.sum())

    @property
    def max_wait(self) -> float:
        return float(self.wait.max()) if self.tickets else 0.0

    def busy_share(self) -> dict[int, float]:
        """Share of the total busy worker-time (sum of start..end) per task type code."""
        busy = self.durations
        total = busy.sum()
        return {t: float(busy[self.type == t].sum() / total) if total > 0 else 0.0
                for t in task_types.codes().tolist()}

    def wait_by_type(self) -> dict[int, float]:
        """Total wait (us) of the tickets of each task type code."""
        wait = self.wait
        return {t: float(wait[self.type == t].sum()) for t in task_types.codes().tolist()}

    def describe(self, ticket: int) -> str:
        type_info = task_types.info(int(self.type[ticket]))
        if self.group is None or self.index is None:
            return f"{type_info.name} task {int(self.task[ticket])}"
        if type_info.code == TaskType.FILTER:
            return f"FILTER #{int(self.index[ticket])}"
        return f"{type_info.name} g={int(self.group[ticket])} {type_info.index_label}={int(self.index[ticket])}"

    def worker_names(self, short: bool = False) -> list[str]:
        """'SM 12 slot 1' where the SM is known, else 'worker 7' (short: 'SM12.1', 'w7')."""
        sm_of = np.full(self.num_workers, -1, dtype=np.int64)
        sm_of[self.worker[::-1]] = self.sm[::-1]          # SM of each worker's first ticket
        names, slots = [], {}
        for w, s in enumerate(sm_of.tolist()):
            if s < 0:
                names.append(f"w{w}" if short else f"worker {w}")
            else:
                slot = slots[s] = slots.get(s, -1) + 1
                names.append(f"SM{s}.{slot}" if short else f"SM {s} slot {slot}")
        return names

    def _edges(self, bins: int) -> np.ndarray:
        t0 = float(self.fetch.min()) if self.tickets else 0.0
        return np.linspace(t0, t0 + max(self.makespan, _EPS), bins + 1)

    def running_counts(self, bins: int) -> np.ndarray:
        """[bins][types]: average number of running tasks of each registered type (column i:
        ``task_types.registered()[i]``) per time bin."""
        edges = self._edges(bins)
        width = edges[1] - edges[0]
        type_infos = task_types.registered()
        out = np.zeros((bins, len(type_infos)))
        for i, type_info in enumerate(type_infos):
            sel = self.type == type_info.code
            out[:, i] = _occupancy(self.start[sel], self.end[sel], edges) / width
        return out

    def waiting_counts(self, bins: int) -> np.ndarray:
        """[bins]: average number of workers between fetch and start per time bin."""
        edges = self._edges(bins)
        return _occupancy(self.fetch, self.start, edges) / (edges[1] - edges[0])

    def validate(self) -> "Timeline":
        """Raise ValueError unless end >= start >= fetch, every task appears once and
        the tickets of each worker do not overlap.  Returns self."""
        n = self.tickets
        if len(np.unique(self.task)) != n:
            raise ValueError("timeline: a task appears on more than one ticket")
        times = np.stack([self.fetch, self.start, self.end])
        if not np.all(np.isfinite(times)):
            raise ValueError("timeline: non-finite times")
        for lo, hi, what in ((self.fetch, self.start, "start < fetch"), (self.start, self.end, "end < start")):
            bad = np.flatnonzero(hi < lo - _EPS)
            if len(bad):
                raise ValueError(f"timeline: ticket {int(bad[0])} ({self.describe(int(bad[0]))}): {what}")
        if n and (self.worker.min() < 0 or self.worker.max() >= self.num_workers):
            raise ValueError("timeline: worker id out of range")
        order = np.lexsort((self.fetch, self.worker))
        same = self.worker[order[1:]] == self.worker[order[:-1]]
        clash = np.flatnonzero(same & (self.fetch[order[1:]] < self.end[order[:-1]] - _EPS))
        if len(clash):
            a, b = int(order[clash[0]]), int(order[clash[0] + 1])
            raise ValueError(f"timeline: tickets {a} and {b} overlap on worker {int(self.worker[a])}")
        return self

    def summary(self) -> dict:
        busy = self.durations
        workers = max(self.num_workers, 1)
        return {
            "label": self.label, "source": self.source, "tickets": self.tickets,
            "workers": self.num_workers, "makespan_us": self.makespan,
            "utilisation": float(busy.sum() / (workers * self.makespan)) if self.makespan > 0 else 0.0,
            "busy_share": {task_types.info(t).name: v for t, v in self.busy_share().items()},
            "busy_us": {k.name: float(busy[self.type == k.code].sum()) for k in task_types.registered()},
            "tasks": {k.name: int((self.type == k.code).sum()) for k in task_types.registered()},
            "total_wait_us": self.total_wait, "max_wait_us": self.max_wait,
            "wait_by_type_us": {task_types.info(t).name: v for t, v in self.wait_by_type().items()},
        }

    # ---- Perfetto / Chrome trace-event export ---------------------------
    def to_perfetto(self, path=None) -> dict:
        """Trace-event JSON: one lane (tid) per worker, an "X" slice per task and one per
        wait (fetch..start), "M" events naming the process and each lane.  ts and dur
        are microseconds.  Writes the file when ``path`` is given."""
        events = [{"ph": "M", "pid": 0, "tid": 0, "name": "process_name",
                   "args": {"name": f"megawino {self.label} ({self.source})".replace("  ", " ")}}]
        for w, name in enumerate(self.worker_names()):
            events.append({"ph": "M", "pid": 0, "tid": w, "name": "thread_name", "args": {"name": name}})
            events.append({"ph": "M", "pid": 0, "tid": w, "name": "thread_sort_index",
                           "args": {"sort_index": w}})
        fetch, start, end = (np.round(a, 3).tolist() for a in (self.fetch, self.start, self.end))
        for i, (w, task, t) in enumerate(zip(self.worker.tolist(), self.task.tolist(), self.type.tolist())):
            args = {"ticket": i, "task": task}
            if start[i] > fetch[i]:
                events.append({"name": "wait", "cat": "wait", "ph": "X", "pid": 0, "tid": w,
                               "ts": fetch[i], "dur": round(start[i] - fetch[i], 3), "args": args})
            events.append({"name": self.describe(i), "cat": task_types.info(t).name, "ph": "X", "pid": 0,
                           "tid": w, "ts": start[i], "dur": round(end[i] - start[i], 3), "args": args})
        trace = {"traceEvents": events, "displayTimeUnit": "ns"}
        if path is not None:
            with open(path, "w") as fh:
                json.dump(trace, fh)
        return trace


# ---- terminal rendering ----------------------------------------------------
def _legend():
    from rich.text import Text
    text = Text()
    for type_info in task_types.registered():
        text.append(type_info.letter, style=f"bold {type_info.color}").append(f" {type_info.label}  ")
    text.append("·", style="dim").append(" wait  ").append("space idle")
    return text


def _strip(tl: Timeline, bins: int):
    from rich.text import Text
    running, waiting = tl.running_counts(bins), tl.waiting_counts(bins)
    peak = max(float(running.max()), float(waiting.max()), _EPS)
    rows = []
    series = [(type_info.name[:6], type_info.color, running[:, i])
              for i, type_info in enumerate(task_types.registered())]
    series.append(("wait", "dim", waiting))
    for name, color, values in series:
        levels = np.clip(np.ceil(values / peak * 8), 0, 8).astype(int)
        row = Text(f"{name:<7}")
        row.append("".join(_SHADES[v] for v in levels), style=color)
        row.append(f"{values.max():7.1f}")
        rows.append(row)
    span = f"{tl.makespan:.1f} us"
    rows.append(Text(f"{'':7}0" + span.rjust(bins - 1) + "   peak", style="dim"))
    return rows, peak


def _lanes(tl: Timeline, bins: int, lanes: int):
    from rich.text import Text
    edges = tl._edges(bins)
    width = edges[1] - edges[0]
    names = tl.worker_names(short=True)
    chosen = np.unique(np.round(np.linspace(0, tl.num_workers - 1, min(lanes, tl.num_workers))).astype(int))
    rows = []
    type_infos = task_types.registered()
    for w in chosen.tolist():
        mine = tl.worker == w
        occ = [_occupancy(tl.start[mine & (tl.type == k.code)], tl.end[mine & (tl.type == k.code)], edges)
               for k in type_infos]
        occ.append(_occupancy(tl.fetch[mine], tl.start[mine], edges))
        occ = np.stack(occ, axis=1) / width            # [bins][types + 1]: share of each bin
        row = Text(f"{names[w][:7]:<8}")
        for b in range(bins):
            if occ[b].sum() < 0.25:
                row.append(" ")
            else:
                k = int(np.argmax(occ[b]))
                row.append(*(("·", "dim") if k == len(type_infos) else (type_infos[k].letter, type_infos[k].color)))
        rows.append(row)
    return rows, len(chosen)


def render(timeline: Timeline, width: int = 80, lanes: int = 16):
    """Rich renderable (a Group of panels) no wider than ``width`` columns: running tasks
    by type over time, sampled worker lanes, and a summary table."""
    from rich import box
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    tl = timeline
    title = f"{tl.label} ({tl.source})" if tl.label else tl.source
    if tl.tickets == 0:
        return Group(Panel(Text("empty timeline"), title=title, width=width))
    bins = max(10, width - 20)
    strip, peak = _strip(tl, bins)
    lane_rows, shown = _lanes(tl, bins, lanes)
    s = tl.summary()
    head = Text(f"makespan {s['makespan_us']:.1f} us   tickets {s['tickets']}   "
                f"workers {s['workers']}   busy {s['utilisation']:.0%}")
    head2 = Text(f"wait: total {s['total_wait_us']:.1f} us, max {s['max_wait_us']:.2f} us, "
                 f"mean {s['total_wait_us'] / s['tickets']:.2f} us")
    table = Table(box=box.SIMPLE, pad_edge=False, show_edge=False)
    for col in ("type", "tasks", "busy share", "busy us", "wait us", "mean wait"):
        table.add_column(col, justify="left" if col == "type" else "right")
    for type_info in task_types.registered():
        n = s["tasks"][type_info.name]
        wait = s["wait_by_type_us"][type_info.name]
        table.add_row(Text(type_info.name, style=type_info.color), str(n), f"{s['busy_share'][type_info.name]:.1%}",
                      f"{s['busy_us'][type_info.name]:.1f}", f"{wait:.1f}", f"{wait / n:.2f}" if n else "-")
    return Group(
        Panel(Group(*strip), title=f"running tasks by type: {title}", title_align="left",
              subtitle=f"shade = avg running / {peak:.1f}", width=width),
        Panel(Group(*lane_rows), title=f"{shown} of {tl.num_workers} worker lanes",
              title_align="left", width=width),
        Panel(Group(head, head2, table), title="summary", title_align="left", width=width),
        _legend(),
    )
