"""``megawino mapping LAYER``: task counts and the ticket order of one layer (and the
mapping options and graph building that ``megawino timeline`` shares)."""
from __future__ import annotations

import argparse

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.arguments import non_negative_int, positive_int
from .common import DEFAULT_LAYER_BATCH, resolve_layer

# Graphs above this many tasks are refused before they are built: the mapping builder and
# the simulator take one Python step per ticket (the largest suite layer has about 31,000).
MAX_TASKS = 1_000_000
STRIP_LINES = 6               # the mapping strip: at most this many lines of the terminal


def _type_style():
    """(letters, colours) indexed by task type code, from the task-type registry."""
    from ..core import task_types
    return (task_types.by_code(lambda type_info: type_info.letter, "?"),
            task_types.by_code(lambda type_info: type_info.color, "default"))


def _add_mapping_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("layer", metavar="LAYER",
                   help="layer name (resnet50.conv2_x) or shape string (n64c64k64h56w56[r3s3][u1][p1]; "
                        "u and p may be h x w pairs: p0x3)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help=f"batch size (layer names: default {DEFAULT_LAYER_BATCH}; "
                        "shape strings: replaces n)")
    p.add_argument("--resolution", type=positive_int, default=None,
                   help="network input resolution (layer names only)")
    p.add_argument("--dig", type=non_negative_int, default=None,
                   help="min tickets input -> GEMM (default: the tuned table's, else a heuristic)")
    p.add_argument("--dgo", type=non_negative_int, default=None,
                   help="min tickets GEMM -> output (default: as --dig)")
    p.add_argument("--groups-per-column", "--m", dest="groups_per_column", metavar="M", type=positive_int,
                   default=None, help="groups per GEMM column, which share a filter matrix: the paper's M "
                                      "(the tables' key \"m\"; --m is the same flag) (default: as --dig)")
    p.add_argument("--sequential", action="store_true",
                   help="the sequential mapping (all F, I, G, then O) instead")


def add_parser(sub) -> None:
    p = sub.add_parser("mapping", help="task counts and ticket order of one layer")
    _add_mapping_options(p)
    p.set_defaults(func=cmd_mapping)


def _gpu():
    """The GPU whose tables apply: this machine's, else the default target
    (megawino.gpu.identity.DEFAULT_TARGET)."""
    from .. import sweep
    from ..gpu import identity
    return identity.current_identity() if sweep.gpu_runtime() is not None else identity.DEFAULT_TARGET


def _build_mapping(spec, args):
    """(graph, Mapping) for the layer with the command's mapping options; options not
    given come from the tuned table (``megawino.tuning.table.choose``), as the runtime's do,
    and are written back into ``args`` for display.  Mapping parameters are validated
    even with --sequential."""
    from ..tuning import choice
    from ..gpu.nvrtc import DEFAULT_GEMM_MATH
    from ..schedule.mapping import Mapping, MappingParams, build_interleaved, sequential_mapping
    from ..core.task_sizes import build_graph
    from ..core.tasks import Layout
    if not spec.winograd_eligible:
        raise ValueError(f"{spec.name} is a {spec.R}x{spec.S} stride-{spec.stride} layer: task "
                         "graphs, mappings and timelines are for 3x3 stride-1 (Winograd) layers")
    task_params, chosen, args.choice = choice.choose_for_gpu(spec, _gpu(), DEFAULT_GEMM_MATH)
    args.dig = chosen.dig if args.dig is None else args.dig
    args.dgo = chosen.dgo if args.dgo is None else args.dgo
    if args.groups_per_column is None:
        args.groups_per_column = chosen.groups_per_column
    params = MappingParams(args.dig, args.dgo, args.groups_per_column)
    tasks = Layout(spec, task_params).num_tasks
    if tasks > MAX_TASKS:
        raise ValueError(f"{spec.name or spec.shape_string} has {tasks:,} tasks; mappings and "
                         f"timelines are built for at most {MAX_TASKS:,} (use a smaller --batch "
                         "or shape)")
    graph = build_graph(spec, task_params)
    if args.sequential:
        return graph, Mapping(sequential_mapping(graph), "sequential", None, 0)
    return graph, build_interleaved(graph, params)


def _strip_lines(types, width: int, max_lines: int = STRIP_LINES):
    """Task types in ticket order as coloured lines of at most ``width`` characters:
    one character per ticket when that fits in ``max_lines`` lines, else per bucket of
    tickets (its majority type; lower case when the bucket is mixed).
    Returns (lines, tickets per character)."""
    import numpy as np
    letters, colors = _type_style()
    n = len(types)
    width = max(10, width)
    per = max(1, -(-n // (width * max_lines)))
    chars = -(-n // per)
    padded = np.full(chars * per, -1, dtype=np.int64)
    padded[:n] = types
    buckets = padded.reshape(chars, per)
    counts = np.stack([(buckets == t).sum(axis=1) for t in range(len(letters))], axis=1)
    major = counts.argmax(axis=1)
    pure = counts.max(axis=1) == (buckets >= 0).sum(axis=1)
    lines = []
    for start in range(0, chars, width):
        line = Text()
        for t, p in zip(major[start:start + width].tolist(), pure[start:start + width].tolist()):
            line.append(letters[t] if p else letters[t].lower(), style=colors[t])
        lines.append(line)
    return lines, per


def _legend() -> Text:
    from ..core import task_types
    text = Text()
    for type_info in task_types.registered():
        text.append(type_info.letter, style=f"bold {type_info.color}").append(f" {type_info.label}  ")
    return text


def cmd_mapping(args, out: Console, err: Console) -> int:
    import numpy as np

    from ..schedule.mapping import MappingError, dependency_distances, validate_mapping
    from ..core.tasks import TaskType
    spec = resolve_layer(args.layer, args.batch, args.resolution)
    try:
        graph, mapping = _build_mapping(spec, args)
        verdict = None
    except MappingError as exc:   # the builder's own check failed: report it, exit 1
        graph, mapping, verdict = None, None, str(exc)
    layout = graph.layout if graph is not None else None

    out.print(Text(f"{spec.name}  ", style="bold") + Text(spec.describe()))
    if layout is not None:
        p = layout.params
        out.print(Text(f"F({p.m}x{p.m},3x3), {layout.tiles} tiles; task params: {p.tiles_per_group} "
                       f"tiles/group; input task {p.input_channels_per_task} ch x "
                       f"{p.input_tiles_per_task} tiles; "
                       + (f"GEMM + output task {p.gemm_k_per_task} K (fused_output)" if p.fused_output else
                          f"GEMM task {p.gemm_k_per_task} K; output task {p.output_k_per_task} K x "
                          f"{p.output_tiles_per_task} tiles")
                       + f"; filter task {p.filter_pairs_per_task} pairs", style="dim"))
        counts = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("N_F", "S_I", "S_G", "S_O", "NG", "tasks", "counters"):
            counts.add_column(col, justify="right")
        counts.add_row(*map(str, (layout.num_filter_tasks, layout.inputs_per_group,
                                  layout.gemms_per_group, layout.outputs_per_group,
                                  layout.num_groups, graph.num_tasks, layout.num_counters)))
        out.print(counts)
        out.print(Text("N_F: filter-transform tasks (shared by all groups); S_I, S_G, S_O: input-"
                       "transform, GEMM and output-transform tasks per group; NG: task groups "
                       f"({p.tiles_per_group} tiles each); counters: the dependency counters "
                       "tasks wait on (1 + 2 x NG)", style="dim"))

    if args.sequential:
        out.print(Text("mapping: sequential (all F, then I, G, O)", style="bold"))
    else:
        out.print(Text(f"mapping: interleaved  DIG {args.dig}  DGO {args.dgo}  M {args.groups_per_column}",
                       style="bold")
                  + Text(f"  (defaults: {getattr(args, 'choice', 'given')})", style="dim"))

    if verdict is None:
        try:
            validate_mapping(graph, mapping.order)
        except MappingError as exc:
            verdict = str(exc)
    if verdict is None:
        out.print(Text("validator: ") + Text("valid", style="bold green")
                  + Text(" (a permutation of the tasks; every parent at an earlier ticket)",
                         style="dim"))
    else:
        out.print(Text("validator: ") + Text("invalid: ", style="bold red")
                  + Text(verdict, style="red"))
        return 1

    dist = dependency_distances(graph, mapping.order)
    types = graph.types
    parts = []
    product = graph.layout.product_type    # GEMM, or GEMM_OUTPUT (fused_output): the DIG distance
    targets = {product: ("DIG", args.dig), TaskType.OUTPUT: ("DGO", args.dgo)}
    for t in (product, TaskType.OUTPUT):
        sel = (types == int(t)) & (dist >= 0)
        if not sel.any():
            continue
        low = int(dist[sel].min())
        below = int((dist[sel] < targets[t][1]).sum()) if not args.sequential else 0
        text = f"{t.name} {low}"
        if not args.sequential:
            text += f" ({targets[t][0]} {targets[t][1]}, {below} below)"
        parts.append(text)
    out.print("min parent distance: " + ";  ".join(parts))
    if not args.sequential:
        out.print(f"relaxed placements: {mapping.relaxed}")
        out.print(Text("parent distance: tickets between a task and its latest parent (more "
                       "tickets: more time for the parent to finish before the child waits). "
                       "(DIG d, n below): the mapping's target distance d for GEMM tasks (DGO "
                       "for output tasks) and how many tasks sit closer than d; relaxed "
                       "placements: tasks the builder placed below their target because no "
                       "other task was left to put in between", style="dim"))

    ordered = types[np.asarray(mapping.order)]
    lines, per = _strip_lines(ordered, out.width)
    unit = "one character per ticket" if per == 1 else \
        f"one character per {per} tickets (majority type; lower case: mixed)"
    out.print(Text(f"ticket order, {len(ordered)} tickets, {unit}:", style="dim"))
    for line in lines:
        out.print(line, soft_wrap=True)
    out.print(_legend())
    return 0
