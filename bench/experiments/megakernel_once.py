"""One suite layer's megakernel, launched a few times with the shipped table (for ncu:
``ncu -k mw_megakernel --launch-skip 2 -c 1 python3 bench/experiments/megakernel_once.py yolov3.res1``;
variants through MEGAWINO_CUDA_DEFINES).
"""
import argparse
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layer", help="a suite layer name, e.g. yolov3.res1")
    ap.add_argument("--launches", type=int, default=3)
    args = ap.parse_args(argv)
    import cupy
    import megawino
    from megawino.gpu.timing import suite_layer_inputs
    for spec, xs, w, out in suite_layer_inputs(None, args.layer):
        plan = megawino.plan(spec)
        for i in range(args.launches):
            plan(xs[i % len(xs)], w, out=out)
        cupy.cuda.get_current_stream().synchronize()
        plan.check()
        print(spec.name, plan, "shared bytes", plan._mega.shared_bytes, "finite", bool(np.isfinite(out.get()).all()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
