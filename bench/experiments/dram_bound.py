"""How fast could a Winograd layer run if V and M pass through DRAM once each?  Per suite layer
of a bench/compare.py results file and per output tile size m: the DRAM floor (x read, V written
and read, M written and read, y written, at --dram-tbs), the GEMM at the tensor cores' dense peak
for the file's arithmetic, the larger of the two as the bound, and the bound against PyTorch's
TF32 default measured in that file (docs/experiments.md 75).

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
from megawino.core.tasks import CHANNEL_ALIGN, K_ALIGN, round_up  # noqa: E402

# Dense tensor-core peaks of the H100 SXM (TFLOP/s) over the products each arithmetic issues per
# multiply-add: 3xTF32 three TF32 products, BF16x3 three BF16 products; FFMA on the FP32 pipe.
PEAK_TFLOPS = {"3xtf32": 495.0 / 3, "bf16x3": 989.0 / 3, "ffma": 67.0}


def bound_row(spec, m: int, gemm_math: str, dram_tbs: float) -> dict:
    tiles = spec.N * math.ceil(spec.out_h / m) * math.ceil(spec.out_w / m)
    alpha2 = (m + 2) ** 2
    c, k = round_up(spec.C, CHANNEL_ALIGN), round_up(spec.K, K_ALIGN)
    x = 4 * spec.N * spec.C * spec.H * spec.W
    y = 4 * spec.N * spec.K * spec.out_h * spec.out_w
    v, mm = 4 * alpha2 * tiles * c, 4 * alpha2 * tiles * k
    dram_us = (x + y + 2 * v + 2 * mm) / (dram_tbs * 1e12) * 1e6
    gemm_us = 2 * alpha2 * tiles * c * k / (PEAK_TFLOPS[gemm_math] * 1e12) * 1e6
    return {"m": m, "dram_floor_us": dram_us, "gemm_peak_us": gemm_us, "bound_us": max(dram_us, gemm_us)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a bench/compare.py results file")
    ap.add_argument("--dram-tbs", type=float, default=3.35, help="DRAM bandwidth, TB/s (3.35: the H100 SXM's peak)")
    ap.add_argument("--tile-sizes", default="2,4,6", help="output tile sizes m of F(m x m, 3 x 3)")
    ap.add_argument("--json", default="", help="write the table here")
    args = ap.parse_args(argv)
    data = json.loads(Path(args.results).read_text())
    gemm_math = data.get("settings", {}).get("megawino_gemm_math", "3xtf32")
    specs = {s.name: s for s in suite.load_suite(suite="winograd", batch=None)}
    sizes = [int(v) for v in args.tile_sizes.split(",")]
    rows, summary = [], {}
    for layer in data["layers"]:
        spec = specs[layer["name"]].with_(N=layer["N"])
        tf32_us = layer["derived"]["cudnn_tf32_us"]
        for m in sizes:
            row = bound_row(spec, m, gemm_math, args.dram_tbs)
            row.update(layer=layer["name"], measured_us=layer["derived"]["ours_us"], pytorch_tf32_us=tf32_us,
                       bound_over_tf32=row["bound_us"] / tf32_us)
            rows.append(row)
    print(f"{'layer':20s} {'m':>2s} {'DRAM floor':>10s} {'GEMM peak':>10s} {'measured':>9s} {'TF32':>8s} {'bound/TF32':>10s}")
    for r in rows:
        print(f"{r['layer']:20s} {r['m']:2d} {r['dram_floor_us']:10.0f} {r['gemm_peak_us']:10.0f} "
              f"{r['measured_us']:9.0f} {r['pytorch_tf32_us']:8.0f} {r['bound_over_tf32']:10.2f}")
    for m in sizes:
        of_m = [r for r in rows if r["m"] == m]
        beat = [r["layer"] for r in of_m if r["bound_over_tf32"] < 1]
        geo = math.exp(sum(math.log(r["pytorch_tf32_us"] / r["bound_us"]) for r in of_m) / len(of_m))
        summary[m] = {"beats_tf32": beat, "geomean_tf32_over_bound": geo}
        print(f"{gemm_math}, F({m}x{m}), DRAM at {args.dram_tbs} TB/s: the bound beats PyTorch TF32 on "
              f"{len(beat)} of {len(of_m)} layers; geomean TF32 time / bound {geo:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": args.results, "gemm_math": gemm_math,
                                               "dram_tbs": args.dram_tbs, "peak_tflops": PEAK_TFLOPS[gemm_math],
                                               "rows": rows, "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
