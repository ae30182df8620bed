"""Does the megakernel keep V and M in L2?  Time (and, under ncu, DRAM bytes) of one layer's
megakernel for mapping distances and group sizes (docs/experiments.md 62).

    python3 bench/experiments/l2_reuse.py --layer vgg16.conv1_2 --json out.json
    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum -k regex:mw_megakernel \
        python3 bench/experiments/l2_reuse.py --layer vgg16.conv1_2 --once

Each configuration is "tiles_per_group/dig/dgo/m"; MEGAWINO_CUDA_DEFINES selects the build (the
L2 discard and eviction-hint defines that entry 62 measured are in the commit "Experiment 62
(measured, not kept)", not in this tree).  With --once every configuration launches exactly once,
in the order given, so that ncu's kernel rows line up with them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

import megawino
from megawino.core import suite
from megawino.core.task_sizes import default_params
from megawino.schedule.mapping import MappingParams

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import synchronous_median_us  # noqa: E402

CONFIGS = "256/264/264/1,256/66/66/1,256/132/132/1,256/528/528/1,128/264/264/1,128/132/132/1,128/66/66/4,64/132/132/4"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="vgg16.conv1_2")
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import cupy as cp
    spec = suite.select_specs(suite.load_suite(suite="winograd", batch=64), args.layer)[0]
    rng = cp.random.default_rng(3)
    x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
    ref = None
    rows = []
    for config in args.configs.split(","):
        tpg, dig, dgo, m = (int(v) for v in config.split("/"))
        params = dataclasses.replace(default_params(spec), tiles_per_group=tpg, input_tiles_per_task=None,
                                     output_tiles_per_task=None)
        plan = megawino.plan(spec, params=params, mapping=MappingParams(dig, dgo, m), algo="megakernel")
        y = cp.full(spec.output_shape, np.nan, dtype=cp.float32)
        plan(x, w, out=y)
        cp.cuda.get_current_stream().synchronize()
        if args.once:
            continue
        ref = y.copy() if ref is None else ref
        us = synchronous_median_us(lambda: plan(x, w, out=y), args.reps)
        row = {"config": config, "us": us, "same": bool(cp.array_equal(y, ref))}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"layer": spec.name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
