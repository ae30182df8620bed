"""Megakernel time over a grid of DIG / DGO / M, with the default and the tuned task sizes
(the measurement behind docs/experiments.md 26: is the tuner missing a mapping?).  GPU only::

    PYTHONPATH=$PWD python3 bench/experiments/mapping_probe.py \
        resnet50.conv2_x,vgg16.conv1_2 --dig 16,66,264 --dgo 33,264 --m 1,4
"""
import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from megawino import runtime  # noqa: E402
from megawino.tuning import table as tuning  # noqa: E402
from megawino.schedule.mapping import MappingParams  # noqa: E402
from megawino.core.suite import load_suite, select_specs  # noqa: E402
from megawino.gpu.timing import rotated_inputs  # noqa: E402
from megawino.tuning.search import measure_us  # noqa: E402


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layers", help="comma-separated suite layer names")
    ap.add_argument("--dig", type=_ints, default=[66, 264, 528])
    ap.add_argument("--dgo", type=_ints, default=[66, 264, 528])
    ap.add_argument("--m", type=_ints, default=[1, 4])
    args = ap.parse_args(argv)
    import cupy
    for spec in select_specs(load_suite(), args.layers.split(",")):
        xs, w = rotated_inputs(spec, np.random.default_rng(0))
        tuned_params, tuned_mapping, _ = tuning.choose(spec, key=runtime.gpu_name_key())
        default_params, default_mapping, _ = tuning.choose(spec, key=None)
        t_tuned = measure_us(runtime, spec, tuned_params, tuned_mapping, xs, w)
        t_default = measure_us(runtime, spec, default_params, default_mapping, xs, w)
        rows = []
        for params, tag in ((default_params, "default task sizes"), (tuned_params, "tuned task sizes")):
            for dig, dgo, m in itertools.product(args.dig, args.dgo, args.m):
                t = measure_us(runtime, spec, params, MappingParams(dig, dgo, m), xs, w)
                rows.append((t, tag, dig, dgo, m))
        rows.sort()
        print(f"{spec.name}: default {t_default:.1f} us ({default_mapping}), tuned {t_tuned:.1f} us "
              f"({tuned_mapping}, tiles_per_group {tuned_params.tiles_per_group})")
        for t, tag, dig, dgo, m in rows[:6]:
            print(f"   {t:8.1f} us  x{t_default / t:.3f} vs default  {tag}  DIG {dig} DGO {dgo} M {m}")
        print(f"   slowest {rows[-1][0]:.1f} us", flush=True)
        del xs, w
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
