"""The task graph of one layer: its task records (the table the kernels read) and the networkx
graph derived from them (:mod:`megawino.core.tasks` defines the types, sizes and layout;
:func:`megawino.core.task_sizes.build_graph` builds it)."""
from __future__ import annotations

import dataclasses
import functools

import networkx as nx
import numpy as np

from .tasks import TASK_RECORD_DTYPE, TASK_RECORD_FIELDS, Layout, TaskType


@dataclasses.dataclass(frozen=True)
class TaskGraph:
    """All tasks of one layer as a record table, plus the derived networkx graph.

    Task ids: filter tasks first, then input tasks (group-major), GEMM tasks
    (group-major, then j), output tasks (group-major); with fused_output GEMM_OUTPUT tasks
    (group-major, then K block) instead of the GEMM and output tasks.  ``records[id]`` holds the
    TASK_RECORD_FIELDS of that task.
    """

    layout: Layout
    records: np.ndarray          # int32 [num_tasks][len(TASK_RECORD_FIELDS)]

    @property
    def num_tasks(self) -> int:
        return int(self.records.shape[0])

    @property
    def typed_records(self) -> np.ndarray:
        """The records as a [num_tasks] array of TASK_RECORD_DTYPE (a view: same memory)."""
        return self.records.view(TASK_RECORD_DTYPE).reshape(-1)

    def field(self, name: str) -> np.ndarray:
        return self.typed_records[name]

    @property
    def types(self) -> np.ndarray:
        return self.field("type")

    def ids_of(self, task_type: TaskType) -> np.ndarray:
        return np.flatnonzero(self.types == int(task_type))

    @functools.cached_property
    def counter_need(self) -> np.ndarray:
        """Signals each counter receives per launch (= the counter node's in-degree)."""
        signal = self.field("signal")
        return np.bincount(signal[signal >= 0], minlength=self.layout.num_counters).astype(np.int64)

    @functools.cached_property
    def counter_parents(self) -> list[np.ndarray]:
        """Task ids signalling each counter."""
        signal = self.field("signal")
        order = np.argsort(signal, kind="stable")
        sorted_signal = signal[order]
        bounds = np.searchsorted(sorted_signal, np.arange(self.layout.num_counters + 1))
        return [order[bounds[c]:bounds[c + 1]] for c in range(self.layout.num_counters)]

    def describe_task(self, task: int) -> str:
        rec = self.typed_records[task]
        code, group, index = int(rec["type"]), int(rec["group"]), int(rec["index"])
        type_name = TaskType(code).name if code in TaskType._value2member_map_ else f"type-{code}"
        if type_name in ("INPUT", "OUTPUT"):
            slices = self.layout.input_slices if type_name == "INPUT" else self.layout.output_slices
            (t0, t1), (c0, c1) = slices(group, index)
            return f"{type_name} g={group} #{index} (tiles {t0}..{t1 - 1}, channels {c0}..{c1 - 1})"
        if type_name == "GEMM_OUTPUT":
            k0, k1 = self.layout.gemm_k_range(index)
            return f"GEMM_OUTPUT g={group} K block {index} (channels {k0}..{min(k1, self.layout.spec.K) - 1})"
        return {"FILTER": f"FILTER #{index}", "GEMM": f"GEMM g={group} j={index}"}.get(
            type_name, f"{type_name} g={group} #{index}")

    def to_networkx(self) -> nx.DiGraph:
        """Tasks are nodes ``("task", id)``; counters are join nodes ``("counter", i)``
        with edges parent -> counter -> child."""
        graph = nx.DiGraph()
        records = [dict(zip(TASK_RECORD_FIELDS, rec)) for rec in self.records.tolist()]
        for task, rec in enumerate(records):
            task_type = TaskType(rec["type"]) if rec["type"] in TaskType._value2member_map_ else rec["type"]
            graph.add_node(("task", task), type=task_type, group=rec["group"], index=rec["index"])
        graph.add_nodes_from(("counter", counter) for counter in range(self.layout.num_counters))
        for task, rec in enumerate(records):
            if rec["signal"] >= 0:
                graph.add_edge(("task", task), ("counter", rec["signal"]))
            graph.add_edges_from((("counter", rec[w]), ("task", task))
                                 for w in ("wait_a", "wait_b") if rec[w] >= 0)
        return graph

    def task_parents(self, task: int) -> np.ndarray:
        rec = self.typed_records[task]
        parts = [self.counter_parents[rec[w]] for w in ("wait_a", "wait_b") if rec[w] >= 0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
