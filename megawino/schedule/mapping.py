"""Ticket -> task mappings (seed 002, section 5.5) and their validator.

``interleaved_mapping`` follows Algorithm 1: filter tasks first, then DIG input
tasks, then GEMM *columns* (the M GEMM tasks of M consecutive groups that share
filter matrix j) each preceded by about M*S_I/S_G input tasks and followed by
about M*S_O/S_G output tasks (the paper's M is ``MappingParams.groups_per_column`` here; ``m``
is the Winograd tile size F(m x m, 3x3) everywhere in code).  The paper's warm-up (no output tasks for the
first DGO tickets) and its tail fall out of two rules applied at every step:

* a GEMM column is placed only once the last input task of its groups is at
  least DIG tickets back, an output task only once the last GEMM of its group
  is at least DGO tickets back;
* when the pattern's next task cannot be placed, an input task is placed
  instead (inputs have no parents); when no input is left, the earliest
  eligible task is placed even if its distance is short (``relaxed``).

Every placed task's parents are therefore at smaller tickets, which is what
keeps the persistent scheduler deadlock-free.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..core import task_types
from ..core.task_graph import TaskGraph
from ..core.tasks import INT32_MAX, NO_COUNTER, TaskType, _positive_int


def _non_negative(name: str, value) -> int:
    # Ticket distances: a value past the last ticket means "after every parent" (int32 tickets).
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= INT32_MAX:
        raise ValueError(f"mapping parameter {name} must be an integer in 0..{INT32_MAX}, got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class MappingParams:
    """The paper's DIG (least ticket distance input -> GEMM), DGO (GEMM -> output) and M: the
    groups of one GEMM column, which share a filter matrix."""

    dig: int = 64
    dgo: int = 128
    groups_per_column: int = 4

    def __post_init__(self):
        _non_negative("DIG", self.dig)
        _non_negative("DGO", self.dgo)
        _positive_int("mapping parameter groups_per_column (the paper's M)", self.groups_per_column)


@dataclasses.dataclass(frozen=True)
class Mapping:
    """A ticket order plus how it was made (``relaxed``: tasks placed below their distance)."""

    order: np.ndarray      # int32 [num_tasks]: ticket -> task id
    pattern: str           # "interleaved" or "sequential"
    params: MappingParams | None = None
    relaxed: int = 0


def sequential_mapping(graph: TaskGraph) -> np.ndarray:
    """All filter, then all input, all GEMM, all output tasks (the paper's Fig. 3a): the tasks
    of each registered type in type-code order."""
    types = graph.types
    return np.concatenate([np.flatnonzero(types == t) for t in task_types.codes().tolist()]).astype(np.int32)


def interleaved_mapping(graph: TaskGraph, dig: int = 64, dgo: int = 128, groups_per_column: int = 4) -> np.ndarray:
    return build_interleaved(graph, MappingParams(dig, dgo, groups_per_column)).order


def build_interleaved(graph: TaskGraph, params: MappingParams) -> Mapping:
    layout = graph.layout
    groups = layout.num_groups
    s_i, s_g, s_o = layout.inputs_per_group, layout.gemms_per_group, layout.outputs_per_group
    per_column = min(params.groups_per_column, groups)     # the paper's M
    ids = {t: graph.ids_of(t) for t in TaskType}
    inputs = ids[TaskType.INPUT].reshape(groups, s_i)
    gemms = ids[layout.product_type].reshape(groups, s_g)   # GEMM or GEMM_OUTPUT tasks
    outputs = ids[TaskType.OUTPUT].reshape(groups, s_o).ravel()

    order: list[int] = list(ids[TaskType.FILTER].tolist())
    flat_inputs = inputs.ravel()
    next_input = 0
    # Ticket of the last input of each group (set when it is placed), of the last GEMM.
    last_input_ticket = np.full(groups, -1, dtype=np.int64)
    gemms_placed = np.zeros(groups, dtype=np.int64)
    last_gemm_ticket = np.full(groups, -1, dtype=np.int64)
    next_output = 0
    relaxed = 0

    def place_input():
        nonlocal next_input
        task = int(flat_inputs[next_input])
        g = next_input // s_i
        next_input += 1
        if next_input % s_i == 0:
            last_input_ticket[g] = len(order)
        order.append(task)

    def output_ready(strict: bool) -> bool:
        if next_output >= outputs.size:
            return False
        g = next_output // s_o
        if gemms_placed[g] < s_g:
            return False
        return not strict or len(order) - last_gemm_ticket[g] >= params.dgo

    def place_output():
        nonlocal next_output
        order.append(int(outputs[next_output]))
        next_output += 1

    for _ in range(min(params.dig, flat_inputs.size)):
        place_input()

    # GEMM columns in order: block of per_column groups, then j.
    columns = [(g0, j) for g0 in range(0, groups, per_column) for j in range(s_g)]
    input_share = per_column * s_i / s_g
    output_share = per_column * s_o / s_g
    input_credit = output_credit = 0.0
    for g0, j in columns:
        block = range(g0, min(g0 + per_column, groups))
        input_credit += input_share
        while input_credit >= 1 and next_input < flat_inputs.size:
            place_input()
            input_credit -= 1
        # Make sure the column's inputs are placed and far enough back.
        while next_input < flat_inputs.size and (
                last_input_ticket[block[-1]] < 0
                or len(order) - last_input_ticket[block[-1]] < params.dig):
            place_input()
        if last_input_ticket[block[-1]] >= 0 and \
                len(order) - last_input_ticket[block[-1]] < params.dig:
            relaxed += len(block)
        for g in block:
            last_gemm_ticket[g] = len(order)
            gemms_placed[g] += 1
            order.append(int(gemms[g, j]))
        output_credit += output_share
        while output_credit >= 1 and output_ready(strict=True):
            place_output()
            output_credit -= 1
        output_credit = min(output_credit, 1.0)   # no bursts after a stall
    while next_input < flat_inputs.size:          # only when S_G columns ran out first
        place_input()
    while next_output < outputs.size:
        if not output_ready(strict=True):
            relaxed += 1
        place_output()
    result = np.asarray(order, dtype=np.int32)
    validate_mapping(graph, result)
    return Mapping(result, "interleaved", params, relaxed)


class MappingError(ValueError):
    """A ticket order the megakernel must not run."""


def sequential_equivalent(graph: TaskGraph) -> MappingParams | None:
    """Interleaving parameters whose order is exactly :func:`sequential_mapping`'s (DIG and DGO
    past the last ticket, groups_per_column 1: every GEMM waits behind all inputs and every output behind all
    GEMMs), or None if they do not reproduce it.  This lets a tuned table, which stores
    MappingParams, hold the sequential order when that is the fastest one."""
    params = MappingParams(graph.num_tasks, graph.num_tasks, 1)
    same = np.array_equal(build_interleaved(graph, params).order, sequential_mapping(graph))
    return params if same else None


def validate_mapping(graph: TaskGraph, order) -> None:
    """Raise MappingError naming the first offending ticket: a task id out of range,
    repeated or missing, or a child at an earlier ticket than one of its parents."""
    order = np.asarray(order)
    n = graph.num_tasks
    if order.ndim != 1:
        raise MappingError(f"a mapping is a 1-D array of task ids, got shape {order.shape}")
    bad = np.flatnonzero((order < 0) | (order >= n))
    if bad.size:
        t = int(bad[0])
        raise MappingError(f"ticket {t} holds task id {int(order[t])}, outside 0..{n - 1}")
    seen = np.full(n, -1, dtype=np.int64)
    first_ticket = np.full(n, -1, dtype=np.int64)
    # first occurrence of each task; any later occurrence is a repeat
    uniq, first = np.unique(order, return_index=True)
    first_ticket[uniq] = first
    repeats = np.flatnonzero(first_ticket[order] != np.arange(order.size))
    if repeats.size:
        t = int(repeats[0])
        raise MappingError(f"ticket {t} repeats task {int(order[t])} "
                           f"({graph.describe_task(int(order[t]))}), first at ticket "
                           f"{int(first_ticket[order[t]])}")
    if order.size != n:
        missing = int(np.flatnonzero(first_ticket < 0)[0])
        raise MappingError(f"mapping has {order.size} tickets for {n} tasks; "
                           f"task {missing} ({graph.describe_task(missing)}) is missing")
    seen[order] = np.arange(n)
    ticket_of = seen
    # Latest ticket among each counter's signallers.
    signal = graph.field("signal")
    last_parent = np.full(graph.layout.num_counters, -1, dtype=np.int64)
    has = signal >= 0
    np.maximum.at(last_parent, signal[has], ticket_of[np.flatnonzero(has)])
    worst = np.full(n, -1, dtype=np.int64)
    for col in ("wait_a", "wait_b"):
        wait = graph.field(col)
        w = wait >= 0
        worst[w] = np.maximum(worst[w], last_parent[wait[w]])
    late = np.flatnonzero(worst >= ticket_of)
    if late.size:
        child = int(late[np.argmin(ticket_of[late])])
        parents = graph.task_parents(child)
        parent = int(parents[np.argmax(ticket_of[parents])])
        raise MappingError(
            f"ticket {int(ticket_of[child])} ({graph.describe_task(child)}) comes before "
            f"its parent at ticket {int(ticket_of[parent])} ({graph.describe_task(parent)})")


def ring_buffer_groups(graph: TaskGraph, order, min_distance: int = 1) -> int:
    """The fewest V / M slots (TaskParams.buffer_groups) that ``order`` allows: group g may use
    group g - R's slot only if every GEMM of that group comes at least ``min_distance`` tickets
    before g's first input, and every output of it that far before g's first GEMM (the waits
    build_graph adds for a ring).  The number of groups means no ring."""
    layout = graph.layout
    groups = layout.num_groups
    _positive_int("min_distance", min_distance)
    if layout.params.fused_output:
        return groups            # no M to ring (TaskParams.fused_output)
    order = np.asarray(order)
    ticket_of = np.empty(graph.num_tasks, dtype=np.int64)
    ticket_of[order] = np.arange(order.size)

    def tickets(task_type):
        ids = graph.ids_of(task_type)
        return ticket_of[ids].reshape(groups, -1)
    first_input = tickets(TaskType.INPUT).min(axis=1)
    gemm = tickets(TaskType.GEMM)
    first_gemm, last_gemm = gemm.min(axis=1), gemm.max(axis=1)
    last_output = tickets(TaskType.OUTPUT).max(axis=1)
    for ring in range(1, groups):
        if np.all(first_input[ring:] - last_gemm[:-ring] >= min_distance) and \
                np.all(first_gemm[ring:] - last_output[:-ring] >= min_distance):
            return ring
    return groups


def dependency_distances(graph: TaskGraph, order) -> np.ndarray:
    """Per task: its ticket minus the latest parent's ticket (-1 for tasks without parents)."""
    order = np.asarray(order)
    ticket_of = np.empty(graph.num_tasks, dtype=np.int64)
    ticket_of[order] = np.arange(order.size)
    signal = graph.field("signal")
    last_parent = np.full(graph.layout.num_counters, -1, dtype=np.int64)
    has = signal >= 0
    np.maximum.at(last_parent, signal[has], ticket_of[np.flatnonzero(has)])
    dist = np.full(graph.num_tasks, -1, dtype=np.int64)
    for col in ("wait_a", "wait_b"):
        wait = graph.field(col)
        w = wait >= 0
        d = ticket_of[w] - last_parent[wait[w]]
        dist[w] = np.where(dist[w] < 0, d, np.minimum(dist[w], d))
    return dist


def resolve_order(graph, mapping) -> np.ndarray:
    """None -> interleaved (default MappingParams); MappingParams -> interleaved with
    them; "sequential" / "interleaved"; or an explicit ticket order (validated)."""
    if mapping is None or (isinstance(mapping, str) and mapping == "interleaved"):
        return build_interleaved(graph, MappingParams()).order
    if isinstance(mapping, MappingParams):
        return build_interleaved(graph, mapping).order
    if isinstance(mapping, str):
        if mapping == "sequential":
            return sequential_mapping(graph)
        raise ValueError(f"mapping must be None, 'interleaved', 'sequential', MappingParams "
                         f"or a ticket order, got {mapping!r}")
    if isinstance(mapping, Mapping):
        mapping = mapping.order
    order = np.asarray(mapping.get() if hasattr(mapping, "get") else mapping)
    if order.dtype.kind not in "iu":
        raise MappingError(f"a mapping holds integer task ids, got dtype {order.dtype}")
    validate_mapping(graph, order)
    return order.astype(np.int32)


def without_filter_tasks(graph: TaskGraph, order: np.ndarray) -> tuple[TaskGraph, np.ndarray]:
    """The graph and ticket order once U is ready: the filter tasks (the first ids) are gone,
    the GEMMs no longer wait for them, and the remaining tickets keep their relative order."""
    n_f = graph.layout.num_filter_tasks
    kept_graph = TaskGraph(graph.layout, np.array(graph.records[n_f:], dtype=np.int32))   # a copy
    records = kept_graph.typed_records
    on_filters = records["wait_a"] == graph.layout.counter_filters_done()
    records["wait_a"][on_filters] = NO_COUNTER
    records["need_a"][on_filters] = 0
    order = np.asarray(order)
    kept = order[order >= n_f] - n_f
    return kept_graph, kept.astype(np.int32)
