"""The ``megawino`` command line: argument parsing and rendering only.

Commands::

    megawino layers NETWORK      conv layers of a network (shapes, counts, FLOPs)
    megawino sweep NETWORK       run and check each layer; time, error, TFLOP/s
    megawino mapping LAYER       task counts and the ticket order of one layer
    megawino timeline LAYER      simulated (or measured) timeline of one layer
    megawino info                versions, GPU, nvcc

LAYER is a network layer name (``resnet50.conv2_x``, batch 64 unless ``--batch``)
or a shape string (``n64c64k64h56w56``, see :func:`megawino.spec.parse_shape`).
The work happens in the library (:mod:`megawino.sweep`, :mod:`megawino.mapping`,
:mod:`megawino.simulator`, ...), imported lazily so that ``--help`` and the CPU
commands never touch CUDA.  Bad input (ValueError) prints one red ``error:``
line on stderr and exits 2.
"""
from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import shutil
import sys

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

DEFAULT_LAYER_BATCH = 64      # layer names resolve at the paper's evaluation batch size
STRIP_LINES = 6               # the mapping strip: at most this many lines of the terminal
TYPE_LETTERS = "FIGO"
TYPE_COLORS = ("magenta", "cyan", "green", "blue")   # as in megawino.timeline


def _type_style():
    """(letters, colours) per TaskType, from the timeline module when it is there."""
    try:
        from .timeline import TYPE_COLORS as colors, TYPE_LETTERS as letters
        return letters, colors
    except ImportError:
        return TYPE_LETTERS, TYPE_COLORS


# ---------------------------------------------------------------------------
# Layer resolution (shared by every command)
# ---------------------------------------------------------------------------

def _all_layer_names() -> list[str]:
    from .networks import NETWORKS, network_layers
    names = []
    for network in NETWORKS:
        try:
            names += [l.name for l in network_layers(network, 1, None, winograd_only=False)]
        except ValueError:
            pass
    return names


def _suggest(text: str) -> list[str]:
    key = text.strip().lower()
    names = _all_layer_names()
    suffix = [n for n in names if n.endswith("." + key)]
    close = difflib.get_close_matches(key, names, n=4, cutoff=0.6)
    short = {n.split(".", 1)[1]: n for n in names}
    close += [short[s] for s in difflib.get_close_matches(key, list(short), n=4, cutoff=0.75)]
    return list(dict.fromkeys(suffix + close))[:5]


_SHAPE_LIKE = re.compile(r"^(?:[a-z]\d+)+$")


def resolve_layer(text: str, batch: int | None = None, resolution: int | None = None):
    """A LayerSpec from a layer name (``resnet50.conv2_x``; batch defaults to 64) or a
    shape string (``n64c64k64h56w56``; ``batch`` replaces its N when given).
    ValueError with close matches when ``text`` is neither."""
    from .networks import find_layer
    from .spec import parse_shape
    text = text.strip()
    if "." in text:
        return find_layer(text, DEFAULT_LAYER_BATCH if batch is None else batch, resolution)
    if _SHAPE_LIKE.match(text.lower()):
        spec = parse_shape(text)    # its own errors name the bad field
    else:
        close = _suggest(text)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown layer {text!r}: not a layer name (NETWORK.LAYER, e.g. "
                         f"resnet50.conv2_x) nor a shape string (e.g. n64c64k64h56w56){hint}")
    if resolution is not None:
        raise ValueError("--resolution applies to network layer names, not to shape strings")
    if batch is not None:
        spec = spec.with_(N=batch)
    return spec.with_(name=spec.shape_string)


# ---------------------------------------------------------------------------
# Small formatting helpers
# ---------------------------------------------------------------------------

def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def _fmt_err(err: float | None) -> str:
    if err is None:
        return "—"
    return "nan" if not math.isfinite(err) else f"{err:.1e}"


def _filter_text(spec) -> str:
    return f"{spec.R}x{spec.S}/{spec.stride}/{spec.padding}"


def _compact_shape(spec) -> str:
    """C→K HxW, plus the filter when it is not 3x3 stride 1."""
    text = f"{spec.C}→{spec.K} {spec.H}x{spec.W}"
    if not spec.winograd_eligible:
        text += f" {spec.R}x{spec.S}" + (f"/{spec.stride}" if spec.stride != 1 else "")
    return text


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")


# ---------------------------------------------------------------------------
# layers
# ---------------------------------------------------------------------------

def cmd_layers(args, out: Console, err: Console) -> int:
    from .networks import DEFAULT_RESOLUTION, network_layers
    layers = network_layers(args.network, args.batch, args.resolution, winograd_only=args.winograd)
    network = args.network.strip().lower()
    resolution = args.resolution or DEFAULT_RESOLUTION[network]
    table = Table(title=f"{network}: {'3x3 stride-1' if args.winograd else 'conv'} layers, "
                        f"batch {args.batch}, {resolution}x{resolution} input",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_footer=True,
                  collapse_padding=True, show_edge=False)
    table.add_column("layer", footer="total", overflow="fold")
    table.add_column("×", justify="right", footer=str(sum(l.count for l in layers)))
    for col in ("N", "C", "K"):
        table.add_column(col, justify="right")
    table.add_column("HxW", justify="right")
    table.add_column("RxS/s/p", justify="right")
    total = sum(l.total_flops for l in layers)
    table.add_column("GFLOP", justify="right", footer=f"{total / 1e9:.1f}")
    table.add_column("wino", justify="center")
    for layer in layers:
        s = layer.spec
        table.add_row(s.name, str(layer.count), str(s.N), str(s.C), str(s.K), f"{s.H}x{s.W}",
                      _filter_text(s), f"{s.direct_flops / 1e9:.2f}",
                      Text("yes", style="green") if s.winograd_eligible else Text("-", style="dim"))
    out.print(table)
    out.print(Text(f"GFLOP: direct convolution, one occurrence (total: × count); "
                   f"wino: 3x3 stride 1, runs as Winograd F(4x4,3x3). "
                   f"{len(layers)} distinct layers.", style="dim"))
    return 0


# ---------------------------------------------------------------------------
# sweep
# ---------------------------------------------------------------------------

def _check_writable(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"--json {path}: directory {parent} does not exist")


def cmd_sweep(args, out: Console, err: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import sweep
    from .networks import DEFAULT_RESOLUTION
    _positive("--batch", args.batch)
    backend = sweep.resolve_backend(args.backend)
    batch = args.batch if args.batch is not None else (DEFAULT_LAYER_BATCH if backend == "gpu" else 1)
    names = [n for n in args.layers.split(",") if n.strip()] if args.layers else None
    layers = sweep.select_layers(args.network, batch, args.resolution, args.all, names)
    if args.json:
        _check_writable(args.json)
    network = args.network.strip().lower()
    resolution = args.resolution or DEFAULT_RESOLUTION[network]
    if backend == "cpu":
        reason = "backend cpu" if args.backend == "cpu" else "no GPU found"
        out.print(Text(f"{reason}: running the CPU executor (timings are CPU timings)",
                       style="yellow"))
        if args.backend == "auto":
            why = sweep.gpu_status()[1]
            if why.startswith("CuPy does not import"):
                out.print(Text(why, style="dim"))

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    with progress:
        bar = progress.add_task("sweep", total=len(layers))
        result = sweep.run_sweep(
            layers, backend, seed=args.seed, network=network, batch=batch, resolution=resolution,
            on_start=lambda i, layer: progress.update(bar, description=layer.name),
            on_done=lambda i, r: progress.advance(bar), compare=args.compare)

    gpu = result.backend == "gpu"
    table = Table(title=f"{network} sweep: batch {batch}, {resolution}x{resolution}, "
                        f"{'GPU' if gpu else 'CPU'}",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_footer=True,
                  collapse_padding=True, show_edge=False)
    table.add_column("layer", footer="total", overflow="fold")
    table.add_column("×", justify="right",
                     footer=str(sum(r.count for r in result.layers if r.total_ms is not None)))
    table.add_column("C→K HxW", overflow="fold")
    table.add_column("backend", overflow="fold")
    table.add_column("ms", justify="right", footer=_fmt_ms(result.total_ms))
    worst = max((r.rel_error for r in result.layers if r.rel_error is not None), default=None)
    table.add_column("rel. err", justify="right", footer=_fmt_err(worst))
    if gpu:
        total_tf = result.total_flops / (result.total_ms * 1e-3) / 1e12 if result.total_ms else None
        table.add_column("TFLOP/s", justify="right",
                         footer=f"{total_tf:.1f}" if total_tf else "—")
    compared = gpu and args.compare == "cudnn"
    if compared:
        table.add_column("cuDNN", justify="right")
        geo = result.geomean_speedup
        table.add_column("×cuDNN", justify="right", footer=f"{geo:.2f} gm" if geo else "—")
    prefix = network + "."
    for r in result.layers:
        bad = r.passed is False
        short = r.name[len(prefix):] if r.name.startswith(prefix) else r.name
        row = [short, str(r.count), _compact_shape(r.spec),
               Text("skipped", style="dim") if r.skipped else Text(r.backend),
               _fmt_ms(r.time_ms),
               Text(_fmt_err(r.rel_error), style="bold red" if bad else "")]
        if gpu:
            row.append(f"{r.tflops:.1f}" if r.tflops is not None else "—")
        if compared:
            row += [_fmt_ms(r.cudnn_ms), f"{r.speedup:.2f}" if r.speedup else "—"]
        table.add_row(*row, style="red" if bad else None)
    out.print(table)
    for reason in dict.fromkeys(r.backend for r in result.layers if r.skipped):
        count = sum(r.backend == reason for r in result.layers)
        out.print(Text(f"{reason} ({count} layer{'s' if count != 1 else ''})", style="yellow"))
    tol = ", ".join(sorted({f"{r.tolerance:.0e}" for r in result.layers if r.tolerance}))
    out.print(Text(f"ms: {'median CUDA-event time' if gpu else 'best CPU wall time'}; total: "
                   f"sum of ms x count. rel. err: L2 vs float64 direct conv (threshold {tol or '—'})."
                   + (" TFLOP/s: direct-equivalent." if gpu else "")
                   + (" cuDNN: float32 (TF32 off), best of NCHW and channels_last; ×cuDNN = "
                      "cuDNN ms / ours, geomean in the total row." if compared else ""), style="dim"))
    if args.compare == "cudnn" and not gpu:
        out.print(Text("--compare cudnn needs a GPU: not compared", style="yellow"))
    if args.json:
        result.write_json(args.json)
        out.print(f"wrote {escape(args.json)}")
    for r in result.layers:
        if r.error:
            _error(err, f"{r.name}: {r.error}")
    if result.failures:
        names = ", ".join(r.name for r in result.failures)
        _error(err, f"{len(result.failures)} layer(s) failed or above the rel. error "
                    f"threshold: {names}")
        return 1
    return 0


# ---------------------------------------------------------------------------
# mapping
# ---------------------------------------------------------------------------

def _build_mapping(spec, args):
    """(graph, Mapping) for the layer with the command's mapping options.
    Mapping parameters are validated even with --sequential."""
    from .mapping import Mapping, MappingParams, build_interleaved, sequential_mapping
    from .tasks import build_graph
    params = MappingParams(args.dig, args.dgo, args.m)
    if not spec.winograd_eligible:
        raise ValueError(f"{spec.name} is a {spec.R}x{spec.S} stride-{spec.stride} layer: task "
                         "graphs, mappings and timelines are for 3x3 stride-1 (Winograd) layers")
    graph = build_graph(spec)
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
    letters, colors = _type_style()
    text = Text()
    for letter, name, color in zip(letters, ("filter", "input", "GEMM", "output"), colors):
        text.append(letter, style=f"bold {color}").append(f" {name}  ")
    return text


def cmd_mapping(args, out: Console, err: Console) -> int:
    import numpy as np

    from .mapping import MappingError, dependency_distances, validate_mapping
    from .tasks import TaskType
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
                       f"tiles/group, {p.input_channels_per_task} ch/input task, "
                       f"{p.gemm_k_per_task} K/GEMM task, {p.output_k_per_task} K/output task, "
                       f"{p.filter_pairs_per_task} pairs/filter task", style="dim"))
        counts = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("N_F", "S_I", "S_G", "S_O", "NG", "tasks", "counters"):
            counts.add_column(col, justify="right")
        counts.add_row(*map(str, (layout.num_filter_tasks, layout.inputs_per_group,
                                  layout.gemms_per_group, layout.outputs_per_group,
                                  layout.num_groups, graph.num_tasks, layout.num_counters)))
        out.print(counts)

    if args.sequential:
        out.print(Text("mapping: sequential (all F, then I, G, O)", style="bold"))
    else:
        out.print(Text(f"mapping: interleaved  DIG {args.dig}  DGO {args.dgo}  M {args.m}",
                       style="bold"))

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
    targets = {TaskType.GEMM: ("DIG", args.dig), TaskType.OUTPUT: ("DGO", args.dgo)}
    for t in (TaskType.GEMM, TaskType.OUTPUT):
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

    ordered = types[np.asarray(mapping.order)]
    lines, per = _strip_lines(ordered, out.width)
    unit = "one character per ticket" if per == 1 else \
        f"one character per {per} tickets (majority type; lower case: mixed)"
    out.print(Text(f"ticket order, {len(ordered)} tickets, {unit}:", style="dim"))
    for line in lines:
        out.print(line, soft_wrap=True)
    out.print(_legend())
    return 0


# ---------------------------------------------------------------------------
# timeline
# ---------------------------------------------------------------------------

def _measured_timeline(spec, graph, mapping, label: str):
    """Run the layer on the GPU with tracing (twice: the second launch is traced
    warm) and return the measured Timeline."""
    from . import sweep
    runtime = sweep.gpu_runtime()
    if runtime is None:
        raise ValueError("--measured needs a GPU and the GPU runtime; none was found")
    try:
        plan = runtime.plan(spec, params=graph.layout.params, mapping=mapping.order,
                            algo="megakernel", trace=True)
    except (TypeError, NotImplementedError) as exc:
        raise ValueError(f"the GPU runtime has no tracing ({exc})") from None
    if not callable(getattr(plan, "trace", None)):
        raise ValueError("the GPU runtime has no tracing (its plan has no trace())")
    import cupy
    import numpy as np

    from .timeline import Timeline
    x, w = sweep.random_inputs(spec, np.random.default_rng(0))
    if spec.layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    xd, wd = cupy.asarray(x), cupy.asarray(w)
    for _ in range(2):
        plan(xd, wd)
    cupy.cuda.Device().synchronize()
    return Timeline.from_gpu_trace(plan.trace(), mapping.order, graph, label=label)


def cmd_timeline(args, out: Console, err: Console) -> int:
    from .timeline import render
    _positive("--workers", args.workers)
    _positive("--lanes", args.lanes)
    width = args.width if args.width is not None else out.width
    if width < 30:
        raise ValueError(f"--width must be at least 30, got {width}")
    if args.export:
        parent = os.path.dirname(os.path.abspath(args.export))
        if not os.path.isdir(parent):
            raise ValueError(f"--export {args.export}: directory {parent} does not exist")
    spec = resolve_layer(args.layer, args.batch, args.resolution)
    graph, mapping = _build_mapping(spec, args)
    desc = "sequential mapping" if args.sequential else \
        f"interleaved DIG {args.dig} DGO {args.dgo} M {args.m}"
    if args.measured:
        timeline = _measured_timeline(spec, graph, mapping, spec.name)
    else:
        from .simulator import default_workers, simulate
        workers = args.workers if args.workers is not None else default_workers()
        timeline = simulate(graph, mapping.order, workers, label=f"{spec.name}, cost model")
    out.print(Text(f"{spec.name}  ", style="bold") + Text(spec.describe()))
    out.print(Text(f"{graph.num_tasks} tasks, {desc}, {timeline.num_workers} workers"
                   + ("" if args.measured else " (simulated: roofline cost model)"), style="dim"))
    out.print(render(timeline, width=width, lanes=args.lanes))
    if args.export:
        timeline.to_perfetto(args.export)
        out.print(f"wrote Perfetto trace {escape(args.export)}")
        out.print(Text("open it in https://ui.perfetto.dev (or chrome://tracing)", style="dim"))
    return 0


# ---------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------

def _version_of(module: str) -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(module)
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "installed"))
    except Exception as exc:   # a broken install can raise anything on import
        return f"not importable ({type(exc).__name__})"


def cmd_info(args, out: Console, err: Console) -> int:
    import platform

    from . import sweep
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("megawino", sweep.megawino_version())
    table.add_row("python", f"{platform.python_version()} ({sys.executable})")
    for module in ("numpy", "networkx", "rich"):
        table.add_row(module, _version_of(module))
    problem = sweep._cupy_problem()
    try:
        from importlib.metadata import packages_distributions, version
        dists = packages_distributions().get("cupy", [])
        cupy_version = f"{version(dists[0])} ({dists[0]})" if dists else "not installed"
    except Exception:
        cupy_version = "unknown"
    table.add_row("cupy", Text(f"{cupy_version}: {problem}", style="yellow") if problem
                  else cupy_version)
    runtime, why = sweep.gpu_status()
    if runtime is not None:
        gpu_name = sweep.machine_info("gpu").get("gpu", "yes")
        table.add_row("GPU", Text(f"yes: {gpu_name}", style="green"))
    else:
        why = "see cupy above" if why.startswith("CuPy does not import") else why
        table.add_row("GPU", Text(f"no: {why} (the CPU executor and the simulator work)",
                                  style="yellow"))
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
                nvcc = os.path.join(root, "bin", "nvcc")
                break
    table.add_row("nvcc", nvcc or "not found (not needed: kernels compile with NVRTC)")
    out.print(table)
    return 0


# ---------------------------------------------------------------------------
# Parser and main
# ---------------------------------------------------------------------------

def _add_mapping_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("layer", metavar="LAYER",
                   help="layer name (resnet50.conv2_x) or shape string (n64c64k64h56w56)")
    p.add_argument("--batch", type=int, default=None,
                   help=f"batch size (layer names: default {DEFAULT_LAYER_BATCH}; "
                        "shape strings: replaces n)")
    p.add_argument("--resolution", type=int, default=None,
                   help="network input resolution (layer names only)")
    p.add_argument("--dig", type=int, default=64, help="min tickets input -> GEMM (default 64)")
    p.add_argument("--dgo", type=int, default=128, help="min tickets GEMM -> output (default 128)")
    p.add_argument("--m", type=int, default=4, help="groups sharing a filter matrix (default 4)")
    p.add_argument("--sequential", action="store_true",
                   help="the sequential mapping (all F, I, G, then O) instead")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megawino",
        description="Winograd F(4x4,3x3) convolution as one persistent CUDA megakernel: "
                    "network sweeps, mappings and timelines (CPU executor and simulator "
                    "without a GPU).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("layers", help="conv layers of a network")
    p.add_argument("network", metavar="NETWORK", help="vgg16, resnet50, yolov3, densenet161, alexnet")
    p.add_argument("--batch", type=int, default=DEFAULT_LAYER_BATCH,
                   help=f"batch size (default {DEFAULT_LAYER_BATCH})")
    p.add_argument("--resolution", type=int, default=None, help="input resolution")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every conv layer (the default)")
    which.add_argument("--winograd", action="store_true", help="only the 3x3 stride-1 layers")
    p.set_defaults(func=cmd_layers)

    from . import cli_tune
    cli_tune.add_parser(sub)

    p = sub.add_parser("sweep", help="run and check the layers of a network")
    p.add_argument("network", metavar="NETWORK", help="vgg16, resnet50, yolov3, densenet161, alexnet")
    p.add_argument("--batch", type=int, default=None,
                   help=f"batch size (default {DEFAULT_LAYER_BATCH} on the GPU, 1 on the CPU)")
    p.add_argument("--resolution", type=int, default=None, help="input resolution")
    p.add_argument("--all", action="store_true",
                   help="every conv layer, not only the 3x3 stride-1 ones")
    p.add_argument("--layers", metavar="NAME,...", default=None,
                   help="only these layers (resnet50.conv2_x or conv2_x), comma-separated")
    p.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto (default): the GPU when there is one, else the CPU")
    p.add_argument("--json", metavar="PATH", default=None, help="write all results as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--compare", choices=("cudnn",), default=None,
                   help="also time cuDNN float32 through PyTorch (GPU only) and show the ratio")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("mapping", help="task counts and ticket order of one layer")
    _add_mapping_options(p)
    p.set_defaults(func=cmd_mapping)

    p = sub.add_parser("timeline", help="simulated (or measured) timeline of one layer")
    _add_mapping_options(p)
    p.add_argument("--workers", type=int, default=None,
                   help="persistent workers (default 132 SMs x 2)")
    p.add_argument("--width", type=int, default=None, help="columns (default: the terminal's)")
    p.add_argument("--lanes", type=int, default=16, help="worker lanes shown (default 16)")
    p.add_argument("--export", metavar="PATH", default=None,
                   help="write the timeline as Perfetto / Chrome trace JSON")
    p.add_argument("--measured", action="store_true",
                   help="run on the GPU with tracing and show the measured timeline")
    p.set_defaults(func=cmd_timeline)

    p = sub.add_parser("info", help="versions, GPU, nvcc")
    p.set_defaults(func=cmd_info)
    return parser


def _error(err: Console, message: str) -> None:
    err.print(Text("error: ", style="bold red") + Text(message, style="red"), soft_wrap=True)


def main(argv: list[str] | None = None, console: Console | None = None,
         err_console: Console | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 a check failed, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:          # --help, or argparse's own usage error (code 2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out = console if console is not None else Console()
    err = err_console if err_console is not None else Console(stderr=True)
    try:
        return args.func(args, out, err)
    except ValueError as exc:          # bad input: one line, no traceback
        _error(err, str(exc))
        return 2
    except OSError as exc:             # e.g. --json / --export path not writable
        _error(err, f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        return 2
    except KeyboardInterrupt:
        _error(err, "interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
