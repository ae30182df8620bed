"""Experiment: direct configs x flush chunk sizes on one layer: time and rel. error vs float64."""
import sys, json, time, math
sys.path.insert(0, ".")
import numpy as np, cupy as cp
from megawino.suite import load_suite, select_specs
from megawino import direct
from megawino.direct import kernel as K
from megawino.winograd import direct_conv_nchw
from megawino.timing import time_cuda_stats

layer, top = sys.argv[1], int(sys.argv[2])
flushes = [int(f) for f in sys.argv[3].split(",")]
spec = select_specs(load_suite(suite="direct"), [layer])[0]
rng = cp.random.default_rng(0)
x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
ref = direct_conv_nchw(x.astype(cp.float64), w.astype(cp.float64), spec.stride, spec.padding, xp=cp)
wt = K.pack_weights(w, "NCHW", xp=cp)
table = K._device_table(spec)
y = cp.empty(spec.output_shape, dtype=cp.float32)
ranked = [c for c, _ in direct.rank(spec, top=top)]
rows = []
for cfg in ranked:
    for fl in flushes:
        if not direct.resource_ok(cfg, False, flush=fl):
            continue
        kern = K.compile_kernel(cfg, False, fl)
        run = lambda _x: K.launch(kern, cfg, spec, _x, wt, table, y)
        y.fill(cp.nan); run(x); cp.cuda.Device().synchronize()
        err = float(cp.linalg.norm(y.astype(cp.float64) - ref) / cp.linalg.norm(ref))
        st = time_cuda_stats(run, [x], warmup=3, reps=10)
        rows.append(dict(config=cfg.key, flush=fl, us=st["median_us"], err=err,
                         tflops=spec.direct_flops / st["median_us"] / 1e6))
        print(json.dumps(rows[-1]), flush=True)
rows.sort(key=lambda r: r["us"])
print(f"\n{layer}: best 8")
for r in rows[:8]:
    print(f"  {r['config']:28s} flush {r['flush']:4d} {r['us']:8.1f} us {r['tflops']:5.1f} TFLOP/s err {r['err']:.2e}")
for fl in flushes:
    b = min((r for r in rows if r["flush"] == fl), key=lambda r: r["us"], default=None)
    if b: print(f"  best with flush {fl}: {b['config']} {b['us']:.1f} us err {b['err']:.2e}")
