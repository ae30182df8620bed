"""What tracing costs: the megakernel with and without ``trace=True`` (same task
parameters and mapping), median CUDA-event times with rotated inputs.

``python bench/experiments/trace_overhead.py [--layers a,b] [--batch 64] [--json PATH]``
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

from megawino.gpu.timing import suite_layer_inputs, time_cuda_stats  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layer names")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy
    from megawino import runtime
    rows = []
    for spec, xs, w, out in suite_layer_inputs(args.batch, args.layers):
        times = {}
        for traced in (False, True):
            plan = runtime.plan(spec, trace=traced)
            times[traced] = time_cuda_stats(lambda x: plan(x, w, out=out, check=False), xs,
                                            reps=args.reps, check=plan.check)["median_us"]
        overhead = times[True] / times[False] - 1
        rows.append({"layer": spec.name, "plain_us": times[False], "traced_us": times[True],
                     "overhead": overhead})
        print(f"{spec.name:24s} {times[False]:10.1f} us  traced {times[True]:10.1f} us  "
              f"{100 * overhead:+6.2f}%", flush=True)
        del xs
        cupy.get_default_memory_pool().free_all_blocks()
    worst = max(r["overhead"] for r in rows)
    median = float(np.median([r["overhead"] for r in rows]))
    print(f"tracing overhead: median {100 * median:+.2f}%, worst {100 * worst:+.2f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"layers": rows, "median": median, "worst": worst},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
