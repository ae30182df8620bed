#!/usr/bin/env python3
"""A/B of GEMM_OUTPUT task builds (cuda/gemm_output.cuh's -D variants, through MEGAWINO_CUDA_DEFINES)
on the suite layers with C <= 64: per variant and layer the non-fused GEMM_OUTPUT kernel alone
(its V and U from a full run of the same plan) and the megakernel with fused_output, both
CUDA-event medians, and the megakernel's y checked bitwise against the first variant's
(docs/experiments.md 120).

    python3 bench/experiments/gemm_output_variants.py --variants ";-DMW_SOME_DEFINE=1" --json /tmp/v.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

import numpy as np


def fused_params(spec, table):
    """The table's entry where it has fused_output, else the heuristic's sizes with 64-tile groups
    and GEMM_OUTPUT tasks (and the heuristic mapping for them)."""
    from megawino.core.task_sizes import build_graph, default_params
    from megawino.core.tasks import GEMM_OUTPUT_CHANNELS
    from megawino.tuning import table as tuning
    key = spec.with_(layout="NCHW", name="").shape_string
    entry = table.get("layers", {}).get(key) if table else None
    if entry and entry["params"].get("fused_output"):
        _, params, mapping = tuning.entry_objects(key, entry)
        return params, mapping
    params = dataclasses.replace(default_params(spec), tiles_per_group=64, gemm_k_per_task=GEMM_OUTPUT_CHANNELS,
                                 fused_output=True, input_tiles_per_task=None, output_tiles_per_task=None)
    return params, tuning.default_mapping_params(build_graph(spec, params).layout, 264)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="yolov3.res1,resnet50.conv2_x,vgg16.conv1_2,yolov3.res2")
    ap.add_argument("--variants", default=";", help="';'-separated -D option sets (the first is the reference)")
    ap.add_argument("--table", type=pathlib.Path, help="a mapping table whose fused_output entries to use")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)

    import cupy
    import megawino
    from megawino.core.suite import load_suite, select_specs
    from megawino.core.tasks import TaskType
    from megawino.gpu.timing import rotated_inputs, time_cuda_stats

    table = json.loads(args.table.read_text()) if args.table else None
    specs = select_specs(load_suite(suite="winograd", batch=64), args.layers)
    rng = np.random.default_rng(0)
    data = {spec.name: rotated_inputs(spec, rng) for spec in specs}
    reference, rows = {}, []
    for defines in args.variants.split(";"):
        os.environ["MEGAWINO_CUDA_DEFINES"] = defines
        for spec in specs:
            xs, w = data[spec.name]
            params, mapping = fused_params(spec, table)
            y = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)
            nonfused = megawino.plan(spec, params=params, mapping=mapping, algo="nonfused")
            nonfused(xs[0], w, out=y)
            stage_us = time_cuda_stats(lambda x: nonfused.launch_stage(TaskType.GEMM_OUTPUT, y), xs,
                                       reps=args.reps)["median_us"]
            mega = megawino.plan(spec, params=params, mapping=mapping)
            mega_us = time_cuda_stats(lambda x: mega(x, w, out=y, check=False), xs, reps=args.reps,
                                      check=mega.check)["median_us"]
            y.fill(np.nan)
            mega(xs[0], w, out=y)
            digest = cupy.asnumpy(y).tobytes()
            same = reference.setdefault(spec.name, digest) == digest
            row = {"variant": defines or "(default)", "layer": spec.name, "params": dataclasses.asdict(params),
                   "mapping": dataclasses.asdict(mapping), "gemm_output_stage_us": stage_us,
                   "megakernel_us": mega_us, "same_bits_as_first": same}
            rows.append(row)
            print(f"{row['variant']:52} {spec.name:18} GEMM_OUTPUT stage {stage_us:8.1f} us  "
                  f"megakernel {mega_us:8.1f} us  {'same bits' if same else 'BITS DIFFER'}", flush=True)
            del nonfused, mega
    if args.json:
        args.json.write_text(json.dumps({"argv": sys.argv[1:], "rows": rows}, indent=1))
    return 0 if all(r["same_bits_as_first"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
