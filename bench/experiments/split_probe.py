"""Megakernel time with and without tile-split transform tasks (docs/experiments.md 32): for each
layer the tuned table's entry as it is and with default_params' split rule applied to its
transform tasks, and the heuristic without and with the split.  Configurations are measured
in alternating rounds (A B C D, A B C D, ...) and each keeps its best round's median, so a
slow drift of the GPU's clock does not favour one of them.  GPU only::

    PYTHONPATH=$PWD python3 bench/experiments/split_probe.py \
        [--layers a,b] [--rounds 2] [--json PATH]
"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from megawino import runtime  # noqa: E402
from megawino.tuning import table as tuning  # noqa: E402
from megawino.core.suite import load_suite, select_specs  # noqa: E402
from megawino.core.task_sizes import with_transform_split  # noqa: E402
from megawino.gpu.timing import rotated_inputs  # noqa: E402
from megawino.tuning.search import measure_us  # noqa: E402


def whole_groups(params):
    """The same task sizes with every transform task covering its whole group."""
    return dataclasses.replace(params, input_tiles_per_task=params.tiles_per_group,
                               output_tiles_per_task=params.tiles_per_group)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layer names (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy
    suite = load_suite()
    specs = select_specs(suite, args.layers.split(",")) if args.layers else suite
    results = []
    for spec in specs:
        xs, w = rotated_inputs(spec, np.random.default_rng(0))
        table_params, table_mapping, source = tuning.choose(spec, key=runtime.gpu_name_key())
        heur_params, heur_mapping, _ = tuning.choose(spec, key=None)
        configs = {
            "table": (whole_groups(table_params), table_mapping),
            "table+split": (with_transform_split(spec, table_params), table_mapping),
            "heuristic-whole": (whole_groups(heur_params), heur_mapping),
            "heuristic": (heur_params, heur_mapping),
        }
        best = {name: float("inf") for name in configs}
        for _ in range(args.rounds):
            for name, (params, mp) in configs.items():
                best[name] = min(best[name], measure_us(runtime, spec, params, mp, xs, w))
        row = {"layer": spec.name, "table_source": source, "us": best,
               "params": {name: dataclasses.asdict(p) for name, (p, _) in configs.items()},
               "mapping": {name: dataclasses.asdict(mp) for name, (_, mp) in configs.items()}}
        results.append(row)
        print(f"{spec.name:22s} table {best['table']:8.1f}  +split {best['table+split']:8.1f} "
              f"(x{best['table'] / best['table+split']:.3f})   heuristic whole {best['heuristic-whole']:8.1f}  "
              f"split {best['heuristic']:8.1f} (x{best['heuristic-whole'] / best['heuristic']:.3f})", flush=True)
        del xs, w
        cupy.get_default_memory_pool().free_all_blocks()
    geo = lambda a, b: float(np.exp(np.mean([np.log(r["us"][a] / r["us"][b]) for r in results])))  # noqa: E731
    summary = {"table_over_table_split": geo("table", "table+split"),
               "heuristic_whole_over_split": geo("heuristic-whole", "heuristic"),
               "table_over_heuristic_split": geo("table", "heuristic")}
    print("geomean speed-ups: " + ", ".join(f"{k} x{v:.3f}" for k, v in summary.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"layers": results, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
