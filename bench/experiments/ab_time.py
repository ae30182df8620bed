"""Megakernel time of every suite layer with the runtime's own choice of task sizes and
mapping (the tuned table), one JSON line per layer: the unit of an A/B between two source
trees, run alternately from each (old, new, old, new) in one device call by
``bench/experiments/ab_trees.sh``; ``--summary FILE`` then prints, per layer, the best time of each tag and
their ratio, and the geomean (CPU).  GPU only for the timing::

    PYTHONPATH=$PWD python3 bench/experiments/ab_time.py [--layers a,b] [--tag new]
    python3 bench/experiments/ab_time.py --summary ab.jsonl
"""
import argparse
import collections
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from megawino import runtime  # noqa: E402
from megawino.tuning import table as tuning  # noqa: E402
from megawino.core.suite import load_suite, select_specs  # noqa: E402
from megawino.gpu.timing import rotated_inputs  # noqa: E402
from megawino.tuning.search import measure_us  # noqa: E402


def summary(path: str) -> None:
    """Best time per (layer, tag) of the JSON lines in ``path``; old / new ratios and geomean."""
    best = collections.defaultdict(dict)
    for line in open(path):
        if line.startswith("{"):
            row = json.loads(line)
            tags = best[row["layer"]]
            tags[row["tag"]] = min(tags.get(row["tag"], math.inf), row["us"])
    logs = []
    for layer, tags in best.items():
        if "old" in tags and "new" in tags:
            logs.append(math.log(tags["old"] / tags["new"]))
            print(f"{layer:22s} old {tags['old']:9.1f} new {tags['new']:9.1f}  x{tags['old'] / tags['new']:.3f}")
    if logs:
        print(f"geomean old / new x{math.exp(sum(logs) / len(logs)):.4f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layer names (default: all)")
    ap.add_argument("--tag", default="", help="a label copied into every line")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--summary", metavar="FILE", default=None,
                    help="summarise the JSON lines of an A/B (tags old / new) instead of timing")
    args = ap.parse_args(argv)
    if args.summary:
        summary(args.summary)
        return 0
    import cupy
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
