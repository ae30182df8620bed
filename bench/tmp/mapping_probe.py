"""Experiment: megakernel time over a grid of DIG / DGO / M (task sizes as in the tuned table)."""
import sys, json, itertools, time
sys.path.insert(0, ".")
import numpy as np
from megawino.suite import load_suite, select_specs
from megawino import runtime, tuning
from megawino.mapping import MappingParams
from megawino.tune import measure_us
from megawino.timing import rotated_inputs

layers = sys.argv[1].split(",")
digs = [int(v) for v in sys.argv[2].split(",")]
dgos = [int(v) for v in sys.argv[3].split(",")]
ms = [int(v) for v in sys.argv[4].split(",")]
for spec in select_specs(load_suite(), layers):
    xs, w = rotated_inputs(spec, np.random.default_rng(0))
    tuned_p, tuned_mp, src = tuning.choose(spec, key=runtime.gpu_name_key())
    def_p, def_mp, _ = tuning.choose(spec, key=None)
    rows = []
    t_tuned = measure_us(runtime, spec, tuned_p, tuned_mp, xs, w)
    t_def = measure_us(runtime, spec, def_p, def_mp, xs, w)
    for params, tag in ((def_p, "default params"), (tuned_p, "tuned params")):
        for dig, dgo, m in itertools.product(digs, dgos, ms):
            mp = MappingParams(dig, dgo, m)
            t = measure_us(runtime, spec, params, mp, xs, w)
            rows.append((t, tag, dig, dgo, m))
    rows.sort()
    print(f"{spec.name}: default {t_def:.1f} us ({def_mp}), tuned {t_tuned:.1f} us ({tuned_mp}, tpg {tuned_p.tiles_per_group})")
    for t, tag, dig, dgo, m in rows[:6]:
        print(f"   {t:8.1f} us  x{t_def / t:.3f} vs default  {tag}  DIG {dig} DGO {dgo} M {m}")
    print(f"   worst {rows[-1][0]:.1f} us", flush=True)
    del xs, w
    import cupy; cupy.get_default_memory_pool().free_all_blocks()
