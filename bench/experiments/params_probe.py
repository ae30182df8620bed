#!/usr/bin/env python3
"""The megakernel with the shipped table's task sizes against the same sizes with some fields
replaced (docs/experiments.md 130): per layer and override, the shipped mapping and each of the
tuner's DIG = DGO distances, CUDA-event medians on rotated inputs over alternating rounds, and the
output checked bitwise against the shipped plan's.

    python3 bench/experiments/params_probe.py --layers densenet161.block4 \
        --override '{"input_channels_per_task": 16}' --json /tmp/p.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="densenet161.block2,densenet161.block3,densenet161.block4,"
                                        "resnet50.conv4_x,resnet50.conv5_x")
    ap.add_argument("--override", action="append", required=True, help="JSON object of TaskParams fields")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--table", type=pathlib.Path, required=True, help="the shipped table (mapping/h100.json)")
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)

    import cupy
    import megawino
    from megawino.core.suite import load_suite, select_specs
    from megawino.core.task_sizes import DEFAULT_WORKERS
    from megawino.gpu.timing import rotated_inputs, time_cuda_stats
    from megawino.tuning import table as tuning

    specs = select_specs(load_suite(suite="winograd", batch=64), args.layers)
    overrides = [json.loads(o) for o in args.override]
    table = json.loads(args.table.read_text())
    rng = np.random.default_rng(0)
    rows, ok = [], True
    for spec in specs:
        xs, w = rotated_inputs(spec, rng)
        y = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)
        key = spec.with_(layout="NCHW", name="").shape_string
        _, shipped_params, shipped_mapping = tuning.entry_objects(key, table["layers"][key])
        shipped = megawino.plan(spec, params=shipped_params, mapping=shipped_mapping)
        plans = {"shipped": shipped}
        mappings = {"shipped": shipped_mapping}
        for override in overrides:
            params = dataclasses.replace(shipped_params, **override)
            label = ",".join(f"{k}={v}" for k, v in override.items())
            plans[f"{label} shipped-mapping"] = megawino.plan(spec, params=params, mapping=shipped_mapping)
            mappings[f"{label} shipped-mapping"] = shipped_mapping
            for dig in tuning.mapping_waves(DEFAULT_WORKERS):
                mapping = dataclasses.replace(shipped_mapping, dig=dig, dgo=dig)
                mappings[f"{label} dig=dgo={dig}"] = mapping
                plans[f"{label} dig=dgo={dig}"] = megawino.plan(spec, params=params, mapping=mapping)
        times = {name: [] for name in plans}
        digests = {}
        for _ in range(args.rounds):
            for name, plan in plans.items():
                times[name].append(time_cuda_stats(lambda x: plan(x, w, out=y, check=False), xs, reps=args.reps,
                                                   check=plan.check)["median_us"])
        for name, plan in plans.items():
            y.fill(np.nan)
            plan(xs[0], w, out=y)
            digests[name] = cupy.asnumpy(y).tobytes()
        base = statistics.mean(times["shipped"])
        for name in plans:
            us = statistics.mean(times[name])
            same = digests[name] == digests["shipped"]
            ok &= same
            rows.append({"layer": spec.name, "plan": name, "params": dataclasses.asdict(plans[name].params),
                         "mapping": dataclasses.asdict(mappings[name]), "us": times[name],
                         "speedup_vs_shipped": base / us, "same_bits": same})
            print(f"{spec.name:20} {name:48} {us:9.1f} us  x{base / us:.3f}  {'same bits' if same else 'BITS DIFFER'}",
                  flush=True)
        del plans, shipped
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
