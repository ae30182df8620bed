"""Megakernel time of every suite layer with the runtime's own choice of task sizes and
mapping (the tuned table), one JSON line per layer: the unit of an A/B between two source
trees, run alternately from each (old, new, old, new) in one device call.  GPU only::

    PYTHONPATH=$PWD MEGAWINO_SUITE=.mwdata/layers.json python3 bench/ab_time.py [--layers a,b] [--tag new]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from megawino import runtime, tuning  # noqa: E402
from megawino.suite import load_suite, select_specs  # noqa: E402
from megawino.timing import rotated_inputs  # noqa: E402
from megawino.tune import measure_us  # noqa: E402


def main(argv=None) -> int:
    import cupy
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layer names (default: all)")
    ap.add_argument("--tag", default="", help="a label copied into every line")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    suite = load_suite()
    specs = select_specs(suite, args.layers.split(",")) if args.layers else suite
    for spec in specs:
        xs, w = rotated_inputs(spec, np.random.default_rng(0))
        params, mapping, source = tuning.choose(spec, key=runtime.gpu_name_key())
        us = measure_us(runtime, spec, params, mapping, xs, w, reps=args.reps)
        print(json.dumps({"tag": args.tag, "layer": spec.name, "us": us, "source": source}), flush=True)
        del xs, w
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
