"""The megakernel of each suite layer at one and at two resident blocks an SM: the shipped plan
launched with a grid of SMs x blocks, CUDA-event medians (variants through MEGAWINO_CUDA_DEFINES,
e.g. the free-stage builds of free_stage_bounds.sh: how much each side of the work needs the
second block).

    MEGAWINO_CUDA_DEFINES=-DMW_TRANSFORMS_FREE python3 bench/experiments/grid_probe.py --json /tmp/g.json
"""
import argparse
import json
import os
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layers (default: all)")
    ap.add_argument("--blocks", default="2,1", help="resident blocks an SM to launch, comma-separated")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import cupy
    import megawino
    from megawino.gpu.timing import suite_layer_inputs, time_cuda_stats
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for spec, xs, w, out in suite_layer_inputs(None, args.layers):
        plan = megawino.plan(spec)
        row = {"layer": spec.name, "defines": os.environ.get("MEGAWINO_CUDA_DEFINES", ""), "sms": sms}
        for blocks in (int(b) for b in args.blocks.split(",")):
            plan.workers = sms * blocks
            stats = time_cuda_stats(lambda x: plan(x, w, out=out), xs, reps=args.reps, check=plan.check)
            row[f"us_{blocks}"] = stats["median_us"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del plan
        cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
