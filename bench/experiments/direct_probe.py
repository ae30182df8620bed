"""Direct configs x flush chunk sizes on one layer: time and rel. error against float64
(the measurement behind docs/experiments.md 26).  GPU only::

    PYTHONPATH=$PWD python3 bench/experiments/direct_probe.py alexnet.conv2 \
        --top 16 --flush 512,256,0
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from megawino import direct  # noqa: E402
from megawino.direct import kernel  # noqa: E402
from megawino.core.suite import load_suite, select_specs  # noqa: E402
from megawino.gpu.timing import time_cuda_stats  # noqa: E402
from megawino.core.winograd import direct_conv_nchw  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("layer", help="a layer of the direct suite")
    ap.add_argument("--top", type=int, default=16, help="configs, best by the model first")
    ap.add_argument("--flush", default="512,256,0", help="flush chunk sizes (0: one chain)")
    args = ap.parse_args(argv)
    import cupy as cp
    flushes = [int(f) for f in args.flush.split(",")]
    spec = select_specs(load_suite(suite="direct"), [args.layer])[0]
    rng = cp.random.default_rng(0)
    x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
    ref = direct_conv_nchw(x.astype(cp.float64), w.astype(cp.float64), spec.stride, spec.padding, xp=cp)
    wt = kernel.pack_weights(w, "NCHW", xp=cp)
    table = kernel._device_table(spec)
    y = cp.empty(spec.output_shape, dtype=cp.float32)
    rows = []
    for cfg, _ in direct.rank(spec, top=args.top):
        for flush in flushes:
            if not direct.resource_ok(cfg, False, flush=flush):
                continue
            kern = kernel.compile_kernel(cfg, False, flush)
            run = lambda xin, kern=kern, cfg=cfg: kernel.launch(kern, cfg, spec, xin, wt, table, y)  # noqa: E731
            y.fill(cp.nan)
            run(x)
            cp.cuda.Device().synchronize()
            err = float(cp.linalg.norm(y.astype(cp.float64) - ref) / cp.linalg.norm(ref))
            us = time_cuda_stats(run, [x], warmup=3, reps=10)["median_us"]
            rows.append(dict(config=cfg.key, flush=flush, us=us, err=err,
                             tflops=spec.direct_flops / us / 1e6))
            print(json.dumps(rows[-1]), flush=True)
    rows.sort(key=lambda r: r["us"])
    print(f"\n{spec.name}: fastest 8")
    for r in rows[:8]:
        print(f"  {r['config']:28s} flush {r['flush']:4d} {r['us']:8.1f} us {r['tflops']:5.1f} TFLOP/s "
              f"err {r['err']:.2e}")
    for flush in flushes:
        best = min((r for r in rows if r["flush"] == flush), key=lambda r: r["us"], default=None)
        if best:
            print(f"  best with flush {flush}: {best['config']} {best['us']:.1f} us err {best['err']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
