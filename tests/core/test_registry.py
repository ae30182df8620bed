"""The task-type registry: a new task type is one registration (plus its CPU runner and its
cost), and it runs end to end on the CPU: task graph, executor, simulator, timeline."""
import io
import json

import numpy as np
import pytest
from rich.console import Console

from megawino.gpu import codegen
from megawino.schedule import mapping
from megawino.core import task_types
from megawino.cpu.executor import execute
from megawino.schedule.simulator import CostModel, simulate, task_work
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph
from megawino.core.task_graph import TaskGraph
from megawino.core.tasks import NO_COUNTER, TASK_RECORD_FIELDS, TaskParams, TaskType
from megawino.schedule.timeline import render

SPEC = LayerSpec(3, 20, 12, 30, 26)
PARAMS = TaskParams(tiles_per_group=64, input_channels_per_task=8, gemm_k_per_task=8,
                    output_k_per_task=8, filter_pairs_per_task=256)
COPY_CODE = max(int(t) for t in TaskType) + 1


def copy_v_runner(layout, buffers, group, index, tf):
    """The identity task: copies its group's rows of V (all positions, all channels)."""
    t0, t1 = layout.group_tile_range(group)
    buffers.__dict__.setdefault("copies", {})[group] = buffers.V[:, t0:t1, :].copy()


def copy_v_work(layout, group, index):
    """No flops; reads and writes the group's rows of V."""
    rows = layout.params.tiles_per_group * layout.alpha2 * layout.c_stride
    return np.zeros(len(group)), np.full(len(group), 8.0 * rows)


COPY = task_types.TaskTypeInfo(
    COPY_CODE, "COPY", "copy", "C", "yellow", copy_v_runner, copy_v_work,
    header="copy_task.cuh", device_call="copy_task(p, group)", nonfused_call="copy_task(p, group)")


def graph_with_copies(spec, params) -> TaskGraph:
    """build_graph plus one COPY task per group, after all input tasks of its group."""
    graph = build_graph(spec, params)
    layout = graph.layout
    groups = np.arange(layout.num_groups)
    extra = np.zeros(layout.num_groups, dtype=graph.typed_records.dtype)
    extra["type"], extra["group"], extra["index"] = COPY_CODE, groups, 0
    extra["wait_a"] = [layout.counter_inputs_done(g) for g in groups.tolist()]
    extra["need_a"] = layout.inputs_per_group
    extra["wait_b"], extra["need_b"], extra["signal"] = NO_COUNTER, 0, NO_COUNTER
    records = np.concatenate([graph.records, extra.view(np.int32).reshape(-1, len(TASK_RECORD_FIELDS))])
    return TaskGraph(layout, np.ascontiguousarray(records, dtype=np.int32))


@pytest.fixture
def copy_type():
    with task_types.register(COPY) as entry:
        yield entry
    with pytest.raises(ValueError, match="nonfused_gemm_smem"):
        task_types.TaskTypeInfo(COPY_CODE, "COPY", "copy", "C", "red", copy_v_runner, copy_v_work,
                                nonfused_shared="GemmSmem& smem = gemm_smem();")
    with pytest.raises(ValueError, match="nonfused_gemm_smem"):
        task_types.TaskTypeInfo(COPY_CODE, "COPY", "copy", "C", "red", copy_v_runner, copy_v_work,
                                nonfused_gemm_smem=True)
    with pytest.raises(ValueError, match="unknown task type"):
        task_types.info(COPY_CODE)
    assert [k.name for k in task_types.registered()] == [t.name for t in TaskType]


def test_dummy_type_runs_through_executor_simulator_and_timeline(copy_type):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(SPEC.input_shape).astype(np.float32)
    w = rng.standard_normal(SPEC.weight_shape).astype(np.float32)
    graph = graph_with_copies(SPEC, PARAMS)
    plain = build_graph(SPEC, PARAMS)
    groups = graph.layout.num_groups
    assert groups >= 2 and graph.num_tasks == plain.num_tasks + groups
    copies = np.flatnonzero(graph.types == COPY_CODE)
    # the copy tasks wait for every input task of their group
    for task in copies.tolist():
        g = int(graph.typed_records[task]["group"])
        parents = graph.task_parents(task)
        s_i = graph.layout.inputs_per_group
        assert set(parents.tolist()) == set(plain.ids_of(TaskType.INPUT)[g * s_i:(g + 1) * s_i].tolist())
    assert f"type-{COPY_CODE} g=1 #0" in graph.describe_task(int(copies[1]))

    order = mapping.sequential_mapping(graph)            # the registry's type order: COPY last
    assert order[-groups:].tolist() == copies.tolist()
    interleaved = mapping.build_interleaved(plain, mapping.MappingParams(4, 4, 1)).order
    # right after the last input of group 0, before that group's GEMMs have run
    group0_inputs = plain.ids_of(TaskType.INPUT)[:graph.layout.inputs_per_group]
    last = int(np.flatnonzero(np.isin(interleaved, group0_inputs)).max())
    early = np.concatenate([interleaved[:last + 1], copies[:1], interleaved[last + 1:], copies[1:]])
    for ticket_order in (order, early):
        mapping.validate_mapping(graph, ticket_order)
        buffers = execute(graph, ticket_order, x, w)
        np.testing.assert_array_equal(buffers.y, execute(plain, mapping.sequential_mapping(plain), x, w).y)
        assert sorted(buffers.copies) == list(range(groups))
        for g, copy in buffers.copies.items():
            t0, t1 = graph.layout.group_tile_range(g)
            assert not np.isnan(copy).any()                   # every input task had written V
            np.testing.assert_array_equal(copy, buffers.V[:, t0:t1, :])
    bad = np.concatenate([copies[:1], order[order != copies[0]]])
    with pytest.raises(mapping.MappingError):
        execute(graph, bad, x, w)

    flops, nbytes = task_work(graph)
    assert np.all(flops[copies] == 0) and np.all(nbytes[copies] > 0)
    model = CostModel(scale={COPY_CODE: 3.0})
    costs = model.task_costs(graph)
    np.testing.assert_allclose(costs[copies], 3.0 * CostModel().task_costs(graph)[copies])
    tl = simulate(graph, early, workers=6, cost_model=model)
    tl.validate()
    ticket_of = np.empty(graph.num_tasks, dtype=np.int64)
    ticket_of[tl.task] = np.arange(tl.tickets)
    for task in copies.tolist():
        t = ticket_of[task]
        parents_end = tl.end[ticket_of[graph.task_parents(task)]].max()
        assert tl.type[t] == COPY_CODE and tl.start[t] >= parents_end
        assert tl.durations[t] == pytest.approx(costs[task])
    summary = json.loads(json.dumps(tl.summary()))
    assert summary["tasks"]["COPY"] == groups
    assert summary["busy_us"]["COPY"] == pytest.approx(costs[copies].sum())
    assert sum(summary["busy_share"].values()) == pytest.approx(1.0)
    assert tl.running_counts(20).shape == (20, len(TaskType) + 1)
    events = tl.to_perfetto()["traceEvents"]
    assert sum(e.get("cat") == "COPY" for e in events) == groups
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(render(tl))
    text = console.file.getvalue()
    assert "C copy" in text and "COPY" in text

    # the CUDA side: one dispatch case and one non-fused kernel per registered device type
    dispatch = codegen.dispatch_text()
    assert "case TASK_COPY: copy_task(p, group); break;" in dispatch
    assert f"TASK_COPY = {COPY_CODE}," in codegen.header_text()
    assert '#include "copy_task.cuh"' in dispatch
    assert "mw_copy_kernel(" in codegen.nonfused_text()


def test_register_refuses_clashes_and_bad_entries():
    gemm = task_types.info(TaskType.GEMM)
    with pytest.raises(ValueError, match="clashes"):
        with task_types.register(gemm):
            pass
    with pytest.raises(ValueError, match="upper-case"):
        task_types.TaskTypeInfo(COPY_CODE, "copy", "copy", "C", "red", copy_v_runner, copy_v_work)
    with pytest.raises(ValueError, match="kernel_array"):
        task_types.TaskTypeInfo(COPY_CODE, "COPY", "copy", "C", "red", copy_v_runner, copy_v_work,
                                kernel_array="u")
    with pytest.raises(ValueError, match="go together"):
        task_types.TaskTypeInfo(COPY_CODE, "COPY", "copy", "C", "red", copy_v_runner, copy_v_work,
                                device_call="copy_task(p, group)")
    with pytest.raises(ValueError, match="unknown task type"):
        task_types.info(COPY_CODE)


def test_builtin_entries_are_the_task_types():
    kinds = task_types.registered()
    assert [(int(k.code), k.name) for k in kinds] == [(int(t), t.name) for t in TaskType]
    assert len({k.letter for k in kinds}) == len(kinds) and len({k.color for k in kinds}) == len(kinds)
    assert [k.kernel_array for k in kinds] == ["w", "x", None, "y", "y"]
    assert all(k.on_device for k in kinds)


def test_generated_headers_are_current():
    """cuda/generated_*.cuh must be regenerated (python -m megawino.gpu.codegen) after a change of
    the registry, the task record or the ABI."""
    for name, text in codegen.GENERATED.items():
        assert codegen.header_path(name).read_text() == text(), f"cuda/{name} is stale"
    dispatch = codegen.dispatch_text()
    for kind in task_types.registered():
        assert f"case TASK_{kind.name}: {kind.device_call}; break;" in dispatch
        assert f"{kind.kernel_name}(" in codegen.nonfused_text()
    assert "default: __trap();" in dispatch and "default: break;" not in dispatch


def test_record_and_trace_dtypes_match_the_generated_structs():
    """The NumPy views of the task records and the trace rows have the bytes the kernels read:
    int32 [tasks][8] and int64 [tickets][4], fields in the generated structs' order."""
    import re

    from megawino.core import abi
    from megawino.core.tasks import TASK_RECORD_DTYPE
    graph = build_graph(SPEC, PARAMS)
    typed = graph.typed_records
    assert typed.base is not None and np.shares_memory(typed, graph.records)
    assert graph.records.dtype == np.int32 and graph.records.shape == (graph.num_tasks, 8)
    for i, name in enumerate(TASK_RECORD_FIELDS):
        np.testing.assert_array_equal(typed[name], graph.records[:, i])
    header = codegen.header_text()
    for name, dtype, c_type in (("TaskRecord", TASK_RECORD_DTYPE, "int"),
                                ("TraceRow", abi.TRACE_DTYPE, "long long")):
        assert dtype.itemsize == 32
        fields = re.search(rf"struct alignas\(16\) {name} {{ {c_type} ([\w, ]+); }};", header).group(1)
        assert tuple(fields.split(", ")) == dtype.names
        for field in dtype.names:
            assert f"__builtin_offsetof({name}, {field}) == {dtype.fields[field][1]}" in header
    rows = np.arange(12, dtype=np.int64).reshape(3, 4).view(abi.TRACE_DTYPE).reshape(-1)
    assert rows["end"].tolist() == [3, 7, 11] and rows["sm"].tolist() == [0, 4, 8]
    from megawino.gpu import nvrtc
    from megawino.core.tasks import LANE_CHANNELS
    assert f"constexpr int BLOCK_THREADS = {nvrtc.BLOCK_THREADS};" in header
    assert f"constexpr int LANE_CHANNELS = {LANE_CHANNELS};" in header


def test_direct_kernel_arguments_come_from_one_list():
    """mw_direct_conv's signature is generated from abi.DIRECT_KERNEL_ARGS, each argument is a
    field of mw_direct::Params, and the launch passes the arguments in that order."""
    import re

    from megawino.core import abi
    from megawino.direct.kernel import kernel_args
    from megawino.core.resources import cuda_dir
    names = [name for name, _ in abi.DIRECT_KERNEL_ARGS]
    params_struct = (cuda_dir() / "direct_conv.cuh").read_text().split("struct Params {")[1].split("};")[0]
    fields = re.findall(r"\b(\w+)\s*[,;]", re.sub(r"//.*", "", params_struct))
    assert sorted(fields) == sorted(names)
    assert "mw_direct_conv(" + ", ".join(f"{c} {n}" for n, c in abi.DIRECT_KERNEL_ARGS) + ")" \
        in codegen.direct_text()
    arrays = {n: np.full(2, i, dtype=np.float32)
              for i, (n, c) in enumerate(abi.DIRECT_KERNEL_ARGS) if c != "int"}
    values = {**arrays, **{n: 100 + i for i, (n, c) in enumerate(abi.DIRECT_KERNEL_ARGS) if c == "int"}}
    args = kernel_args(dict(reversed(list(values.items()))))
    assert len(args) == len(names)
    for arg, (name, c_type) in zip(args, abi.DIRECT_KERNEL_ARGS):
        if c_type == "int":
            assert isinstance(arg, np.int32) and arg == values[name]
        else:
            assert arg is values[name]
