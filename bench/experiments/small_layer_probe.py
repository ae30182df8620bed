"""Where a small layer's megakernel time goes, measured warm: CUDA-event medians of the
megakernel, its traced build and the non-fused path (inputs rotated past the L2), and of the
traced build's per-launch timelines (``--traces`` launches, each after ``--warmup`` others, the
same rotation): the span from the first ticket fetch to the last task end, and per task type the
median task duration, the phase's first start and last end (medians over the launches).
The rest of the event time is the launch, the first fetch and the exit.

``python bench/experiments/small_layer_probe.py [--json PATH] [--reps 50] [--traces 20]``
"""
import argparse
import json
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from megawino.core.spec import LayerSpec  # noqa: E402
from megawino.core.tasks import TaskType  # noqa: E402
from megawino.gpu.timing import rotated_inputs, time_cuda_stats  # noqa: E402

SPECS = [LayerSpec(1, 8, 8, 4, 4), LayerSpec(64, 192, 48, 7, 7), LayerSpec(1, 64, 64, 56, 56),
         LayerSpec(1, 512, 512, 7, 7)]


def warm_traces(traced, xs, w, out, warmup: int, count: int) -> list[np.ndarray]:
    """``count`` traces of ``traced``, each [tickets][fetch, start, end] ns from the launch's
    first fetch, taken after ``warmup`` calls of the same plan whose traces are not kept."""
    import cupy
    found = []
    for i in range(warmup + count):
        traced(xs[i % len(xs)], w, out=out, check=False)
        if i >= warmup:
            cupy.cuda.get_current_stream().synchronize()
            tr = np.asarray(traced.trace(), dtype=np.int64)[:, 1:4]
            found.append(tr - tr[:, 0].min())
    traced.check()
    return found


def summarize(traces: list[np.ndarray], types: np.ndarray) -> dict:
    spans = [float(t[:, 2].max()) / 1e3 for t in traces]
    row = {"span_us": float(np.median(spans))}
    for task_type in TaskType:
        sel = types == int(task_type)
        if not sel.any():
            continue
        dur = [float(np.median(t[sel, 2] - t[sel, 1])) / 1e3 for t in traces]
        first = [float(t[sel, 1].min()) / 1e3 for t in traces]
        last = [float(t[sel, 2].max()) / 1e3 for t in traces]
        row[task_type.name.lower()] = {"tasks": int(sel.sum()), "median_task_us": float(np.median(dur)),
                                       "phase_start_us": float(np.median(first)),
                                       "phase_end_us": float(np.median(last))}
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--traces", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy
    import megawino
    rng = np.random.default_rng(0)
    results = {}
    for spec in SPECS:
        xs, w = rotated_inputs(spec, rng, budget_bytes=256 << 20)
        out = cupy.empty(spec.output_shape, cupy.float32)
        row = {}
        for name, kwargs in (("megakernel", {}), ("nonfused", {"algo": "nonfused"}),
                             ("megakernel traced", {"trace": True})):
            plan = megawino.plan(spec, **kwargs)
            row[f"{name} us"] = time_cuda_stats(lambda x: plan(x, w, out=out, check=False), xs,
                                                reps=args.reps, check=plan.check)["median_us"]
            if kwargs.get("trace"):
                types = np.asarray(plan.graph.types)[np.asarray(plan.order)]
                row["warm trace"] = summarize(warm_traces(plan, xs, w, out, args.warmup, args.traces), types)
        results[spec.shape_string] = row
        del xs
    print(f"{'layer':16s} {'mega':>7s} {'traced':>7s} {'nonfused':>8s} {'span':>6s}  per type: tasks x median us [phase start-end]")
    for shape, row in results.items():
        tr = row["warm trace"]
        phases = "  ".join(f"{k} {v['tasks']}x{v['median_task_us']:.1f} [{v['phase_start_us']:.1f}-{v['phase_end_us']:.1f}]"
                           for k, v in tr.items() if isinstance(v, dict))
        print(f"{shape:16s} {row['megakernel us']:7.1f} {row['megakernel traced us']:7.1f} {row['nonfused us']:8.1f} "
              f"{tr['span_us']:6.1f}  {phases}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
