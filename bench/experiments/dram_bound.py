"""How fast could a layer run if V and M pass through DRAM once each?  Per suite layer of a
bench/compare.py results file: the DRAM floor (x read, V written and read, M written and read, y
written, at --dram-tbs), the GEMM at the tensor cores' dense peak for the file's arithmetic, their
larger one as the bound, and the bound against PyTorch's TF32 default measured in that file
(docs/experiments.md 75).

    python3 bench/experiments/dram_bound.py bench/results/h100-bf16x3.json --json bound.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from megawino.core import suite  # noqa: E402
from megawino.core.tasks import Layout  # noqa: E402
from megawino.tuning import table as tuning  # noqa: E402

# Dense tensor-core peaks of the H100 SXM (TFLOP/s) and the products each arithmetic issues per
# multiply-add: 3xTF32 three TF32 products, BF16x3 three BF16 products, FFMA on the FP32 pipe.
PEAK_TFLOPS = {"3xtf32": 495.0 / 3, "bf16x3": 989.0 / 3, "ffma": 67.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a bench/compare.py results file")
    ap.add_argument("--dram-tbs", type=float, default=3.35, help="DRAM bandwidth, TB/s (3.35: the H100 SXM's peak)")
    ap.add_argument("--json", default="", help="write the table here")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    gemm_math = data.get("settings", {}).get("megawino_gemm_math", "3xtf32")
    specs = {s.name: s for s in suite.load_suite(suite="winograd", batch=None)}
    rows = []
    for layer in data["layers"]:
        spec = specs[layer["name"]].with_(N=layer["N"])
        params, _, _ = tuning.choose(spec, tuning.table_key("h100", gemm_math), fallback="h100")
        lay = Layout(spec, params)
        x = 4 * spec.N * spec.C * spec.H * spec.W
        y = 4 * spec.N * spec.K * spec.out_h * spec.out_w
        v = 4 * lay.alpha2 * lay.tiles * lay.c_stride
        m = 4 * lay.alpha2 * lay.tiles * lay.k_stride
        dram_us = (x + y + 2 * v + 2 * m) / (args.dram_tbs * 1e12) * 1e6
        gemm_us = 2 * lay.alpha2 * lay.tiles * lay.c_stride * lay.k_stride / (PEAK_TFLOPS[gemm_math] * 1e12) * 1e6
        tf32_us = layer["derived"]["cudnn_tf32_us"]
        bound = max(dram_us, gemm_us)
        rows.append({"layer": layer["name"], "dram_floor_us": dram_us, "gemm_peak_us": gemm_us, "bound_us": bound,
                     "measured_us": layer["derived"]["ours_us"], "pytorch_tf32_us": tf32_us,
                     "bound_over_tf32": bound / tf32_us})
    beat = [r["layer"] for r in rows if r["bound_over_tf32"] < 1]
    geo = math.exp(sum(math.log(r["pytorch_tf32_us"] / r["bound_us"]) for r in rows) / len(rows))
    print(f"{'layer':20s} {'DRAM floor':>10s} {'GEMM peak':>10s} {'measured':>9s} {'TF32':>8s} {'bound/TF32':>10s}")
    for r in rows:
        print(f"{r['layer']:20s} {r['dram_floor_us']:10.0f} {r['gemm_peak_us']:10.0f} {r['measured_us']:9.0f} "
              f"{r['pytorch_tf32_us']:8.0f} {r['bound_over_tf32']:10.2f}")
    print(f"{gemm_math}, DRAM at {args.dram_tbs} TB/s: the bound beats PyTorch TF32 on {len(beat)} of {len(rows)} "
          f"layers; geomean TF32 / bound {geo:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": args.results, "gemm_math": gemm_math,
                                               "dram_tbs": args.dram_tbs, "peak_tflops": PEAK_TFLOPS[gemm_math],
                                               "rows": rows, "beats_tf32": beat,
                                               "geomean_tf32_over_bound": geo}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
