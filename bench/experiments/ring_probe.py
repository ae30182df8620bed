"""V and M as a ring of L2-sized slots (TaskParams.buffer_groups): megakernel time of a layer
with and without the ring, for its tuned parameters and a few smaller windows (docs/experiments.md 72).

    python3 bench/experiments/ring_probe.py --layers vgg16.conv1_2,resnet50.conv2_x --gemm-math bf16x3

Each configuration is "tiles_per_group/dig/dgo/m" ("tuned": the shipped table's); with a ring,
buffer_groups is the fewest slots the configuration's ticket order allows at --distance tickets
(megawino.schedule.mapping.ring_buffer_groups).  Every run's output is compared bitwise with the
first configuration's.
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
from megawino.core.task_sizes import build_graph, with_transform_split
from megawino.schedule.mapping import MappingParams, build_interleaved, ring_buffer_groups
from megawino.tuning import table as tuning

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from common import synchronous_median_us  # noqa: E402

CONFIGS = "tuned,tuned/66/66,128/66/66/1,128/132/132/1,64/132/132/1,256/66/66/1"


def configs_for(spec, names, workers):
    tuned_params, tuned_mapping, _ = tuning.choose(spec, tuning.current_gpu_key(), 4, workers)
    for name in names.split(","):
        parts = name.split("/")
        if parts[0] == "tuned":
            params, mp = tuned_params, tuned_mapping
            if len(parts) == 3:
                mp = MappingParams(int(parts[1]), int(parts[2]), tuned_mapping.groups_per_column)
        else:
            tpg, dig, dgo, m = (int(v) for v in parts)
            params = with_transform_split(spec, dataclasses.replace(
                tuned_params, tiles_per_group=tpg, input_tiles_per_task=None, output_tiles_per_task=None), workers)
            mp = MappingParams(dig, dgo, m)
        yield name, params, mp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="vgg16.conv1_2")
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--distance", default="1", help="comma-separated least ticket distances of the ring's waits")
    ap.add_argument("--gemm-math", default="bf16x3")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import cupy as cp
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for spec in suite.select_specs(suite.load_suite(suite="winograd", batch=64), args.layers):
        rng = cp.random.default_rng(3)
        x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
        ref = None
        for name, params, mp in configs_for(spec, args.configs, 2 * sms):
            graph = build_graph(spec, params)
            order = build_interleaved(graph, mp).order
            lay = graph.layout
            variants = [("none", params)]
            for d in (int(v) for v in args.distance.split(",")):
                ring = ring_buffer_groups(graph, order, d)
                if ring < lay.num_groups:
                    variants.append((f"ring d={d}", dataclasses.replace(params, buffer_groups=ring)))
            for what, par in variants:
                plan = megawino.plan(spec, params=par, mapping=mp, algo="megakernel", gemm_math=args.gemm_math)
                tl = plan.task_layout
                y = cp.full(spec.output_shape, np.nan, dtype=cp.float32)
                plan(x, w, out=y)
                cp.cuda.get_current_stream().synchronize()
                ref = y.copy() if ref is None else ref
                us = synchronous_median_us(lambda: plan(x, w, out=y), args.reps)
                vm_bytes = 4 * tl.alpha2 * tl.buffer_tiles * (tl.c_stride + tl.k_stride)
                row = {"layer": spec.name, "config": name, "params": dataclasses.asdict(par),
                       "mapping": dataclasses.asdict(mp), "ring": what, "buffer_groups": tl.buffer_groups,
                       "groups": tl.num_groups, "vm_mb": vm_bytes / 1e6, "us": us,
                       "same": bool(cp.array_equal(y, ref))}
                rows.append(row)
                print(f"{spec.name:20s} {name:16s} {what:10s} slots {tl.buffer_groups:5d}/{tl.num_groups:5d} "
                      f"V+M {row['vm_mb']:8.1f} MB  {row['us']:9.1f} us  same={row['same']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gemm_math": args.gemm_math, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
