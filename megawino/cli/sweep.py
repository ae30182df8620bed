"""``megawino sweep NETWORK``: run and check each layer; the rendering of
:mod:`megawino.sweep` (which does the work) as a table."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..core.arguments import non_negative_int
from .common import (DEFAULT_LAYER_BATCH, OUTPUT_PATH_HELP, OutputFile, _compact_shape, _error, _fmt_err, _fmt_ms,
                     add_network_arguments)


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="run and check the layers of a network")
    add_network_arguments(p, None, f"batch size (default {DEFAULT_LAYER_BATCH} on the GPU, 1 on the CPU)")
    p.add_argument("--all", action="store_true",
                   help="every conv layer, not only the 3x3 stride-1 ones")
    p.add_argument("--layers", metavar="NAME,...", default=None,
                   help="only these layers (resnet50.conv2_x or conv2_x), comma-separated")
    p.add_argument("--backend", choices=("auto", "cpu", "gpu"), default="auto",
                   help="auto (default): the GPU when there is one, else the CPU")
    p.add_argument("--json", metavar="PATH", default=None, help="write all results as JSON: " + OUTPUT_PATH_HELP)
    p.add_argument("--seed", type=non_negative_int, default=0,
                   help="seed of the random inputs (default 0)")
    p.add_argument("--compare", choices=("cudnn",), default=None,
                   help="also time cuDNN float32 through PyTorch (GPU only) and show the ratio")
    p.add_argument("--yes", action="store_true",
                   help="run a CPU sweep even when its estimate is large (over a minute or 4 GiB)")
    p.set_defaults(func=cmd_sweep)


def _check_cpu_estimate(layers, args, out: Console) -> None:
    """Estimate a CPU sweep's time and memory and refuse a large one without --yes."""
    from ..sweep import cpu as sweep_cpu
    specs = [layer.spec for layer in layers]
    estimate = sweep_cpu.estimate_cpu(specs)
    out.print(Text(f"estimate on this CPU: {estimate.describe()}", style="dim"))
    ram = sweep_cpu.physical_memory_bytes()
    if ram is not None and estimate.peak_bytes > ram:
        raise ValueError(f"this CPU sweep needs {estimate.peak_bytes / 2**30:.1f} GiB, more than "
                         f"this machine's {ram / 2**30:.1f} GiB: use a smaller --batch or --resolution")
    if estimate.large and not args.yes:
        smaller = sweep_cpu.smaller_batch(specs, estimate)
        hint = f", or a smaller --batch (--batch {smaller} fits)" if smaller else \
            ", or a smaller --batch or --resolution"
        raise ValueError(f"this CPU sweep would take {estimate.describe()} (more than "
                         f"{sweep_cpu.CONFIRM_SECONDS:.0f} s or {sweep_cpu.CONFIRM_BYTES / 2**30:.0f} "
                         f"GiB): rerun with --yes to go on{hint}")


def cmd_sweep(args, out: Console, err: Console) -> int:
    output = OutputFile(args.json, "--json") if args.json else None
    try:
        code = _sweep(args, out, err, output)
    except BaseException:
        if output is not None:
            output.discard()
        raise
    return code


def _sweep(args, out: Console, err: Console, output: OutputFile | None) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import sweep
    from ..core.networks import DEFAULT_RESOLUTION
    backend = sweep.resolve_backend(args.backend)
    batch = args.batch if args.batch is not None else (DEFAULT_LAYER_BATCH if backend == "gpu" else 1)
    names = [n for n in args.layers.split(",") if n.strip()] if args.layers else None
    layers = sweep.select_layers(args.network, batch, args.resolution, args.all, names)
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
        _check_cpu_estimate(layers, args, out)

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
    compared = gpu and args.compare == "cudnn"
    out.print(sweep_table(result, network, batch, resolution, compared))
    for reason in dict.fromkeys(r.backend for r in result.layers if r.skipped):
        count = sum(r.backend == reason for r in result.layers)
        out.print(Text(f"{reason} ({count} layer{'s' if count != 1 else ''})", style="yellow"))
    tol = ", ".join(sorted({f"{r.tolerance:.0e}" for r in result.layers if r.tolerance}))
    out.print(Text(f"ms: {'median CUDA-event time' if gpu else 'best CPU wall time'}; total: "
                   f"sum of ms x count. rel. err: L2 vs float64 direct conv (threshold {tol or '—'})."
                   + (" TFLOP/s: direct-equivalent. mega: the megakernel; direct: the direct path."
                      if gpu else "")
                   + (" cuDNN: float32 (TF32 off), best of NCHW and channels_last; ×cuDNN = "
                      "cuDNN ms / ours, geomean in the total row." if compared else ""), style="dim"))
    if args.compare == "cudnn" and not gpu:
        out.print(Text("--compare cudnn needs a GPU: not compared", style="yellow"))
    if output is not None:
        output.write_text(result.to_json())
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


# Short backend names keep the GPU table (with the cuDNN columns) inside 80 columns.
_SHORT_BACKEND = {"megakernel": "mega", "gpu-direct": "direct"}


def sweep_table(result, network: str, batch: int, resolution: int, compared: bool) -> Table:
    """The sweep's table: one row per layer, totals in the footer."""
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
    tflops = gpu and not compared      # with the cuDNN columns TFLOP/s stays in the JSON only
    if tflops:
        total_tf = result.total_flops / (result.total_ms * 1e-3) / 1e12 if result.total_ms else None
        table.add_column("TFLOP/s", justify="right",
                         footer=f"{total_tf:.1f}" if total_tf else "—")
    if compared:
        table.add_column("cuDNN", justify="right")
        geo = result.geomean_speedup
        table.add_column("×cuDNN", justify="right", footer=f"{geo:.2f} gm" if geo else "—")
    prefix = network + "."
    for r in result.layers:
        bad = r.passed is False
        short = r.name[len(prefix):] if r.name.startswith(prefix) else r.name
        row = [short, str(r.count), _compact_shape(r.spec),
               Text("skipped", style="dim") if r.skipped else Text(_SHORT_BACKEND.get(r.backend, r.backend)),
               _fmt_ms(r.time_ms),
               Text(_fmt_err(r.rel_error), style="bold red" if bad else "")]
        if tflops:
            row.append(f"{r.tflops:.1f}" if r.tflops is not None else "—")
        if compared:
            row += [_fmt_ms(r.cudnn_ms), f"{r.speedup:.2f}" if r.speedup else "—"]
        table.add_row(*row, style="red" if bad else None)
    return table
