#!/usr/bin/env python3
"""The megakernel with F(2x2) against F(4x4) on chosen suite layers (docs/experiments.md 129):
per layer the shipped plan (m = 4, the tuned table's entry) and F(2x2) with the heuristic's task
sizes under each of the tuner's mapping distances, CUDA-event medians on rotated inputs, and each
F(2x2) output's relative L2 distance from the F(4x4) output.

    python3 bench/experiments/m_probe.py --layers densenet161.block4,resnet50.conv5_x --json /tmp/m.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="densenet161.block2,densenet161.block3,densenet161.block4,"
                                        "resnet50.conv4_x,resnet50.conv5_x,vgg16.conv5_2,yolov3.res5")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)

    import cupy
    import megawino
    from megawino.core.suite import load_suite, select_specs
    from megawino.core.task_sizes import default_params
    from megawino.core.tasks import Layout
    from megawino.gpu.timing import rotated_inputs, time_cuda_stats
    from megawino.core.task_sizes import DEFAULT_WORKERS
    from megawino.schedule.mapping import MappingParams
    from megawino.tuning.table import mapping_waves

    specs = select_specs(load_suite(suite="winograd", batch=64), args.layers)
    rng = np.random.default_rng(0)
    rows = []
    for spec in specs:
        xs, w = rotated_inputs(spec, rng)
        y = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)

        def timed(plan):
            us = time_cuda_stats(lambda x: plan(x, w, out=y, check=False), xs, reps=args.reps,
                                 check=plan.check)["median_us"]
            y.fill(np.nan)
            plan(xs[0], w, out=y)
            return us, y.copy()

        shipped = megawino.plan(spec)
        base_us, base_y = timed(shipped)
        row = {"layer": spec.name, "m4_shipped_us": base_us, "m4_params": dataclasses.asdict(shipped.params),
               "m2": []}
        params = default_params(spec, 2)
        groups = Layout(spec, params).num_groups
        for dig in mapping_waves(DEFAULT_WORKERS):
            for per_column in (1, 4):
                if per_column > groups:
                    continue
                mapping = MappingParams(dig, dig, per_column)
                us, out = timed(megawino.plan(spec, params=params, mapping=mapping))
                dist = float(cupy.linalg.norm(out - base_y) / cupy.linalg.norm(base_y))
                row["m2"].append({"mapping": dataclasses.asdict(mapping), "us": us, "rel_l2_vs_m4": dist})
        best = min(row["m2"], key=lambda r: r["us"])
        row["m2_best_us"] = best["us"]
        rows.append(row)
        print(f"{spec.name:22} F(4x4) shipped {base_us:9.1f} us   F(2x2) best {best['us']:9.1f} us "
              f"({best['mapping']})  m4/m2 {base_us / best['us']:.3f}  rel L2 {best['rel_l2_vs_m4']:.1e}", flush=True)
        del shipped
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
