"""Run one suite layer a few times with one algorithm: a target for ncu or compute-sanitizer.

``python bench/run_layer.py LAYER [--suite direct] [--algo direct] [--batch 64] [--runs 3]``
e.g. ``ncu --set full -k regex:mw_direct -c 1 python bench/run_layer.py resnet50.conv4_x.1x1a --suite direct``
"""
import argparse
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from megawino.core.suite import load_suite  # noqa: E402
from megawino.sweep import random_inputs  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layer")
    ap.add_argument("--suite", default="winograd", choices=("winograd", "direct"))
    ap.add_argument("--algo", default=None, help="megakernel, nonfused or direct (default: by suite)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gemm-math", default=None, help="the Winograd GEMM's arithmetic (default: the runtime's)")
    args = ap.parse_args(argv)
    import cupy
    from megawino import runtime
    specs = {s.name: s for s in load_suite(suite=args.suite, batch=args.batch)}
    if args.layer not in specs:
        raise ValueError(f"unknown layer {args.layer!r}; {args.suite} suite has {sorted(specs)}")
    spec = specs[args.layer]
    algo = args.algo or ("direct" if args.suite == "direct" else "megakernel")
    x, w = (cupy.asarray(a) for a in random_inputs(spec, np.random.default_rng(0)))
    plan = runtime.plan(spec, algo=algo, **({"gemm_math": args.gemm_math} if args.gemm_math else {}))
    for _ in range(args.runs):
        y = plan(x, w)
    cupy.cuda.Device().synchronize()
    print(f"{spec.name} {algo}: {plan}, output finite: {bool(cupy.isfinite(y).all())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
