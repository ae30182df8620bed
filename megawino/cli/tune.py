"""``megawino tune``: search DIG, DGO, M and the task sizes on the GPU (see megawino.tuning.search);
with ``--check-near``, measure which of the table's entries may lend their parameters to near
shapes instead (see megawino.tuning.near)."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..gpu.nvrtc import GEMM_MATHS
from ..core.arguments import positive_float, positive_int
from .common import DEFAULT_LAYER_BATCH, resolve_layer


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="tune mapping and task parameters on the GPU")
    p.add_argument("target", metavar="TARGET",
                   help="a network (every 3x3 stride-1 layer), a layer name or shape string, "
                        "or 'suite' (the winograd layers of the benchmark suite)")
    p.add_argument("--suite", metavar="PATH", default=None,
                   help="the suite file for TARGET suite (default: the one shipped with megawino)")
    p.add_argument("--batch", type=positive_int, default=None, help="batch size (default 64)")
    p.add_argument("--budget", type=positive_float, default=None,
                   help="seconds for the whole run (600); each layer tuned gets at least its seeds "
                        "(the shipped tables' entries) and the confirmation, and layers whose "
                        "minimum does not fit are left untouched and listed")
    p.add_argument("--top", type=positive_int, default=None, help="candidates measured per layer after "
                                                                 "simulation ranks them (6)")
    p.add_argument("--reps", type=positive_int, default=10, help="timed runs per candidate (10)")
    p.add_argument("--check-near", action="store_true",
                   help="instead of tuning: time TARGET's layers at batch N/2 and N/3.2 with the "
                        "parameters of the table entry each borrows from against the heuristic's "
                        "(3 alternating rounds, outputs compared bit for bit) and write the entries' "
                        "near_check and lends_near: a shape the tables lack borrows only from an "
                        "entry that lost nowhere")
    p.add_argument("--gemm-math", default=None, choices=tuple(GEMM_MATHS),
                   help="the Winograd GEMM arithmetic of the tuned plans (default: the package's); "
                        "bf16x3 has a table of its own, <gpu>-bf16x3.json")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="table to write (default: the user's tuned table, <cache>/<gpu>.json)")
    p.set_defaults(func=cmd_tune)


def _targets(target: str, batch: int | None, suite_file: str | None = None):
    from ..core.networks import NETWORKS, network_layers
    from ..core.suite import load_suite
    batch_or_default = DEFAULT_LAYER_BATCH if batch is None else batch
    if target == "suite":
        return load_suite(suite_file, suite="winograd", batch=batch)
    if target.lower() in NETWORKS:
        return [layer.spec for layer in network_layers(target.lower(), batch_or_default,
                                                         winograd_only=True)]
    return [resolve_layer(target, batch)]


def cmd_tune(args, out: Console, err: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..tuning import search as tune
    from ..sweep import gpu_status
    if args.suite is not None and args.target != "suite":
        raise ValueError("--suite names the file for TARGET suite; the target is " + repr(args.target))
    specs = _targets(args.target, args.batch, args.suite)
    for spec in specs:
        spec.require_winograd()
    if args.check_near and (args.budget is not None or args.top is not None):
        raise ValueError("--check-near times the table's entries as they are; --budget and --top are for tuning")
    runtime, why = gpu_status()
    if runtime is None:
        raise ValueError(f"{'--check-near' if args.check_near else 'tuning'} measures on the GPU: "
                         f"{why or 'no GPU found'}")
    if args.check_near:
        return _check_near(specs, args, out, err)
    args.budget = 600.0 if args.budget is None else args.budget
    args.top = 6 if args.top is None else args.top
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True)
    with progress:
        bar = progress.add_task("tune", total=len(specs))
        table = tune.tune(specs, args.out, top=args.top, budget_s=args.budget, reps=args.reps,
                          on_start=lambda i, s: progress.update(bar, description=s.name),
                          on_done=lambda i, s, r: progress.advance(bar), gemm_math=args.gemm_math)
    view = Table(title=f"tuned on {table['gpu']}", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("layer", "t/grp", "DIG", "DGO", "M", "us", "×default", "×seq", "sim err"):
        view.add_column(col, justify="left" if col == "layer" else "right")
    wanted = {s.with_(layout="NCHW", name="").shape_string for s in specs}
    for key, e in table["layers"].items():
        if key not in wanted:
            continue
        seq = bool(e.get("sequential_order"))      # DIG = DGO = every ticket: the sequential order
        view.add_row(e["name"] or key, str(e["params"]["tiles_per_group"]),
                     "seq" if seq else str(e["mapping"]["dig"]), "seq" if seq else str(e["mapping"]["dgo"]),
                     str(e["mapping"]["m"]), f"{e['time_us']:.1f}",
                     f"{e['speedup_vs_default']:.2f}", f"{e['speedup_vs_sequential']:.2f}",
                     f"{100 * e['simulator_error']:.0f}%" if "simulator_error" in e else "-")
    out.print(view)
    summary = tune.summary({"layers": {k: v for k, v in table["layers"].items() if k in wanted}})
    if summary:
        out.print(Text(f"beat sequential on {summary['beat_sequential']}/{summary['layers']} "
                       f"(the sequential order itself is best on {summary['sequential_is_best']}); "
                       f"geomean ×{summary['geomean_speedup_vs_default']:.3f} over the untuned "
                       f"default" + ("" if summary["median_simulator_error"] is None else
                                     f"; median simulator makespan error "
                                     f"{100 * summary['median_simulator_error']:.0f}%"), style="bold"))
    if table["skipped"]:
        out.print(Text(f"left untouched (their minimum did not fit in --budget {args.budget:g} s): "
                       + ", ".join(s.name or s.shape_string for s in table["skipped"]), style="yellow"))
    out.print(f"wrote {table['path']}")
    return 0


def _check_near(specs, args, out: Console, err: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..tuning import near

    def row_line(row: dict) -> None:
        if "error" in row:
            text = f"cannot take the entry's parameters ({row['error']})"
        elif row.get("same_parameters"):
            text = "the heuristic's own parameters (×1.000)"
        else:
            text = (f"heuristic {row['heuristic_us']:.1f} us, lent {row['nearest_us']:.1f} us, "
                    f"×{row['heuristic_over_nearest']:.3f}" + ("" if row["bitwise_equal"] else ", outputs differ"))
        progress.console.print(f"{row['shape']} <- {row['entry']}: {text}")

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err, transient=True)
    with progress:
        bar = progress.add_task("check-near", total=None)
        table = near.check_near(specs, args.out, gemm_math=args.gemm_math, reps=args.reps,
                                on_start=lambda i, n, shape, e: progress.update(
                                    bar, completed=i, total=n, description=e.get("name") or shape),
                                on_row=row_line)
    view = Table(title=f"near shapes on {table['gpu']} (heuristic time / lent time)", box=box.SIMPLE_HEAD,
                 show_edge=False)
    for col in ("entry", "layer", "near shapes", "lends"):
        view.add_column(col)
    for shape in table["checked"]:
        entry = table["layers"][shape]
        ratios = ", ".join(f"{s} ×{r:.3f}" for s, r in entry["near_check"].items()) or "-"
        view.add_row(shape, entry.get("name", ""), ratios, "yes" if entry["lends_near"] else "no")
    out.print(view)
    lending = sum(table["layers"][s]["lends_near"] for s in table["checked"])
    out.print(Text(f"{lending} of {len(table['checked'])} entries lend their parameters to near shapes",
                   style="bold"))
    out.print(f"wrote {table['path']}")
    return 0
