"""Record measured megakernel traces of the suite for offline simulator work.

For every Winograd suite layer and each of three mapping choices (the untuned heuristic,
the shipped tuned table, the sequential mapping) this runs the megakernel with tracing
``--traces`` times and times it untraced (median of CUDA events, rotated inputs).  One
``.npz`` per layer and choice holds the raw per-ticket trace records (smid, fetch, start,
end in ns), the ticket order, the task parameters and the untraced times, so the
simulator can be fitted and checked on a CPU (``megawino.schedule.simulator``).

``python bench/collect_traces.py --out DIR [--layers a,b] [--batch 64] [--traces 3]``
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

from megawino.tuning import table as tuning  # noqa: E402
from megawino.core.task_sizes import default_params  # noqa: E402
from megawino.gpu.timing import suite_layer_inputs, time_cuda_stats  # noqa: E402


def choices(spec):
    """(name, TaskParams, mapping) of the three mapping choices recorded per layer."""
    heur_params, heur_map, _ = tuning.choose(spec, key=None)
    tuned_params, tuned_map, source = tuning.choose(spec, key=tuning.current_gpu_key())
    out = [("heuristic", heur_params, heur_map)]
    if source == "tuned":
        out.append(("tuned", tuned_params, tuned_map))
    out.append(("sequential", default_params(spec), "sequential"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the .npz files and index.json")
    ap.add_argument("--layers", default=None, help="comma-separated suite layer names")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--traces", type=int, default=3, help="traced runs per layer and choice")
    ap.add_argument("--reps", type=int, default=15, help="untraced timed runs")
    args = ap.parse_args(argv)
    import cupy
    from megawino import runtime
    if args.traces < 1 or args.reps < 1:
        raise ValueError("--traces and --reps must be >= 1")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = []
    for spec, xs, w, out in suite_layer_inputs(args.batch, args.layers):
        for name, params, mapping in choices(spec):
            plain = runtime.plan(spec, params=params, mapping=mapping)
            untraced = time_cuda_stats(lambda x, plan=plain: plan(x, w, out=out, check=False), xs,
                                       reps=args.reps, check=plain.check)
            traced = runtime.plan(spec, params=params, mapping=mapping, trace=True)
            records = []
            for i in range(args.traces):
                traced(xs[i % len(xs)], w, out=out)
                records.append(np.asarray(traced.trace(), dtype=np.int64))
            path = out_dir / f"{spec.name}.{name}.npz"
            meta = {"layer": spec.name, "shape": spec.shape_string, "choice": name,
                    "params": dataclasses.asdict(traced.graph.layout.params),
                    "mapping": mapping if isinstance(mapping, str) else dataclasses.asdict(mapping),
                    "grid": int(traced.workers), "blocks_per_sm": int(traced.blocks_per_sm),
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
