"""The tuner's check: the simulator against measured makespans on recorded megakernel traces.

``--collect`` (GPU) first records the traces: for every Winograd suite layer and each of three
mapping choices (the untuned heuristic, the shipped tuned table, the sequential mapping) it runs
the megakernel with tracing ``--traces`` times and times it untraced; one ``.npz`` per layer and
choice (``DIR/index.json`` lists them) holds the per-ticket trace records (smid, fetch, start,
end in ns), the ticket order, the task parameters and the untraced times.  Then, on any machine,
for every layer with traces this calibrates the cost model on the heuristic
choice's traces exactly as the tuner does (``megawino.tuning.search.calibrate_on_traces``), then
simulates the heuristic (in-sample), the tuned and the sequential mapping (out-of-sample:
the same calibrated model, other mappings and task sizes) and compares each with the
median makespan of that choice's traces.

    python3 bench/sim_check.py --collect         # GPU: record the traces, then check
    python3 bench/sim_check.py [--data DIR] [--layers a,b] [--calib-traces N] [--bar 0.15] [--json PATH]

Writes ``bench/results/<gpu>/sim_check.json`` (``<gpu>`` from the traces' GPU; ``--json``).
"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from megawino.schedule.simulator import simulate  # noqa: E402
from megawino.core.spec import parse_shape  # noqa: E402
from megawino.core.task_sizes import build_graph  # noqa: E402
from megawino.core.tasks import TaskParams  # noqa: E402
from megawino.gpu import identity  # noqa: E402
from megawino.gpu.nvrtc import DEFAULT_GEMM_MATH  # noqa: E402
from megawino.tuning import choice  # noqa: E402
from megawino.core.task_sizes import default_params  # noqa: E402
from megawino.tuning.search import calibrate_on_traces  # noqa: E402

CHOICES = ("heuristic", "tuned", "sequential")
DEFAULT_DATA = Path(__file__).resolve().parent.parent / ".mwdata" / "traces"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def load_choice(path: Path):
    """(meta, graph, order, records) of one recorded .npz."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        order, records = np.asarray(z["order"]), np.asarray(z["records"])
    spec = parse_shape(meta["shape"]).with_(name=meta["layer"])
    graph = build_graph(spec, TaskParams(**meta["params"]))
    return meta, graph, order, records


def choices(spec):
    """(name, TaskParams, mapping) of the three mapping choices recorded per layer."""
    heur_params, heur_map, _ = choice.choose(spec, key=None)
    tuned_params, tuned_map, source = choice.choose_for_gpu(spec, identity.current_identity(), DEFAULT_GEMM_MATH)
    out = [("heuristic", heur_params, heur_map)]
    if source.kind != "heuristic":          # this GPU's table entry, or its architecture's
        out.append(("tuned", tuned_params, tuned_map))
    out.append(("sequential", default_params(spec), "sequential"))
    return out


def collect(out_dir: Path, layers: str | None, batch: int | None, traces: int, reps: int) -> None:
    """Record each suite layer's traces and untraced times per mapping choice into ``out_dir``."""
    import cupy
    from megawino import runtime
    from megawino.gpu.timing import suite_layer_inputs, time_cuda_stats
    if traces < 1 or reps < 1:
        raise ValueError("--traces and --reps must be >= 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    index = []
    for spec, xs, w, out in suite_layer_inputs(batch, layers):
        for name, params, mapping in choices(spec):
            plain = runtime.plan(spec, params=params, mapping=mapping)
            untraced = time_cuda_stats(lambda x, plan=plain: plan(x, w, out=out, check=False), xs,
                                       reps=reps, check=plain.check)
            traced = runtime.plan(spec, params=params, mapping=mapping, trace=True)
            records = []
            for i in range(traces):
                traced(xs[i % len(xs)], w, out=out)
                records.append(np.asarray(traced.trace(), dtype=np.int64))
            path = out_dir / f"{spec.name}.{name}.npz"
            meta = {"layer": spec.name, "shape": spec.shape_string, "choice": name,
                    "params": dataclasses.asdict(traced.graph.layout.params),
                    "mapping": mapping if isinstance(mapping, str) else dataclasses.asdict(mapping),
                    "grid": int(traced.workers), "blocks_per_sm": int(traced.blocks_per_sm),
                    "gpu": identity.current_gpu_key(),
                    "untraced_median_us": untraced["median_us"],
                    "untraced_min_us": untraced["min_us"]}
            np.savez_compressed(path, records=np.stack(records), order=np.asarray(traced.order),
                                meta=json.dumps(meta))
            spans = [(r[:, 3].max() - r[:, 1].min()) / 1e3 for r in records]
            meta["trace_makespans_us"] = [float(s) for s in spans]
            index.append(meta)
            print(f"{spec.name:22s} {name:10s} untraced {untraced['median_us']:9.1f} us  traced "
                  + " ".join(f"{s:9.1f}" for s in spans), flush=True)
            del plain, traced
        del xs
        cupy.get_default_memory_pool().free_all_blocks()
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")



def check_layer(data: Path, layer: str, calib_traces: int | None = None) -> dict:
    """Calibrate on the heuristic traces; per choice the simulated and measured makespans."""
    meta, graph, order, records = load_choice(data / f"{layer}.heuristic.npz")
    use = records if calib_traces is None else records[:calib_traces]
    model, _, _ = calibrate_on_traces(use, order, graph, meta["blocks_per_sm"], label=layer)
    row = {"layer": layer, "tasks": int(graph.num_tasks), "grid": meta["grid"],
           "model": {"scale": model.scale, "solo": model.solo, "handoff_us": model.handoff_us},
           "choices": {}}
    for choice in CHOICES:
        path = data / f"{layer}.{choice}.npz"
        if not path.is_file():
            continue
        run_meta, g, o, recs = (meta, graph, order, records) if choice == "heuristic" else load_choice(path)
        spans = [float((r[:, 3].max() - r[:, 1].min()) / 1e3) for r in recs]
        measured = float(np.median(spans))
        sim = simulate(g, o, run_meta["grid"], model).makespan
        row["choices"][choice] = {
            "simulated_us": sim, "measured_us": measured, "trace_us": spans,
            "untraced_us": run_meta.get("untraced_median_us"), "error": (sim - measured) / measured,
            "in_sample": choice == "heuristic", "params": run_meta["params"], "mapping": run_meta["mapping"]}
    return row


def summarise(rows: list[dict], bar: float) -> dict:
    out = {}
    for choice in CHOICES:
        errs = np.array([abs(r["choices"][choice]["error"]) for r in rows if choice in r["choices"]])
        if len(errs):
            out[choice] = {"layers": int(len(errs)), "within_bar": int((errs <= bar).sum()),
                           "median_abs_error": float(np.median(errs)),
                           "p90_abs_error": float(np.percentile(errs, 90)),
                           "max_abs_error": float(errs.max())}
    return out


def render(rows: list[dict], summary: dict, bar: float):
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    table = Table(box=box.SIMPLE, title="simulated vs measured makespan (us; measured = median "
                  "of traces; heuristic in-sample, others out-of-sample)")
    table.add_column("layer")
    for choice in CHOICES:
        table.add_column(f"{choice[:5]} sim/meas", justify="right")
        table.add_column("err", justify="right")
    for r in rows:
        cells = [r["layer"]]
        for choice in CHOICES:
            c = r["choices"].get(choice)
            if c is None:
                cells += ["-", "-"]
                continue
            style = "red" if abs(c["error"]) > bar else ""
            cells += [f"{c['simulated_us']:.1f}/{c['measured_us']:.1f}",
                      Text(f"{100 * c['error']:+.1f}%", style=style)]
        table.add_row(*cells)
    lines = [Text(f"{choice}: {s['within_bar']}/{s['layers']} within {bar:.0%}, |error| median "
                  f"{s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}, max {s['max_abs_error']:.1%}")
             for choice, s in summary.items()]
    return Group(table, *lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="folder of the recorded traces")
    ap.add_argument("--collect", action="store_true", help="GPU: record the traces into --data first")
    ap.add_argument("--batch", type=int, default=None, help="with --collect: the suite's batch (default 64)")
    ap.add_argument("--traces", type=int, default=3, help="with --collect: traced runs per layer and choice")
    ap.add_argument("--reps", type=int, default=15, help="with --collect: untraced timed runs")
    ap.add_argument("--layers", default=None, help="comma-separated layer names (default: all)")
    ap.add_argument("--calib-traces", type=int, default=None,
                    help="calibrate on the first N heuristic traces (default: all, as the tuner)")
    ap.add_argument("--bar", type=float, default=0.15, help="relative error bar")
    ap.add_argument("--json", default=None,
                    help="results file (default bench/results/<gpu>/sim_check.json)")
    args = ap.parse_args(argv)
    data = Path(args.data)
    if args.collect:
        collect(data, args.layers, args.batch, args.traces, args.reps)
    index = json.loads((data / "index.json").read_text())
    layers = list(dict.fromkeys(e["layer"] for e in index))
    if args.layers:
        wanted = args.layers.split(",")
        unknown = sorted(set(wanted) - set(layers))
        if unknown:
            raise ValueError(f"no traces for {unknown}; have {layers}")
        layers = [name for name in layers if name in wanted]
    rows = [check_layer(data, name, args.calib_traces) for name in layers]
    summary = summarise(rows, args.bar)
    from rich.console import Console
    Console(width=140).print(render(rows, summary, args.bar))
    gpu = index[0].get("gpu") if index else None
    out = Path(args.json) if args.json else RESULTS_DIR / (gpu or "unknown-gpu") / "sim_check.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"tool": "bench/sim_check.py", "gpu": gpu, "bar": args.bar, "rows": rows,
                               "summary": summary}, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
