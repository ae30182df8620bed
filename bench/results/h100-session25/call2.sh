#!/usr/bin/env bash
# Session 25, call 2: the megakernel with the GEMM's math free (MW_GEMM_BOUND 1: M written only;
# 2: V read once too) against the landed build, PyTorch's TF32 in the same run.
set -u
cd "$(dirname "$0")/.." && repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1 || echo "install failed"
source bench/experiments/device_setup.sh /tmp/s25b
export MEGAWINO_CACHE_DIR=/tmp/mwc
t=$SECONDS
python3 "$repo/bench/compare.py" --backends ours,prepared,cudnn_tf32 --f64-layers 0 --out "$out/landed.json" > "$out/landed.log" 2>&1
echo "== landed: exit $?, $((SECONDS - t)) s"
for b in 1 2; do
  t=$SECONDS
  MEGAWINO_CUDA_DEFINES="-DMW_GEMM_BOUND=$b" python3 "$repo/bench/compare.py" --backends ours,prepared --f64-layers 0 --out "$out/bound$b.json" > "$out/bound$b.log" 2>&1
  echo "== bound $b: exit $?, $((SECONDS - t)) s"
done
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, math, sys, pathlib
out = pathlib.Path(sys.argv[1])
load = lambda n: {r["name"]: r["backends"] for r in json.loads((out / n).read_text())["layers"]}
a, b1, b2 = load("landed.json"), load("bound1.json"), load("bound2.json")
us = lambda bk, k: (bk.get(k) or {}).get("median_us")
rows = {k: [] for k in ("landed", "landed_prep", "b1", "b1_prep", "b2", "b2_prep")}
print("| layer | TF32 us | landed | prepared | bound1 | bound1 prep | bound2 | bound2 prep | (TF32 ratios) |")
for name, bk in a.items():
    tf = min(us(bk, k) for k in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc"))
    vals = [us(bk, "megakernel"), us(bk, "megakernel_prepared"), us(b1[name], "megakernel"), us(b1[name], "megakernel_prepared"),
            us(b2[name], "megakernel"), us(b2[name], "megakernel_prepared")]
    for key, v in zip(rows, vals):
        rows[key].append(tf / v)
    print(f"| {name} | {tf:.1f} | " + " | ".join(f"{v:.1f} ({tf / v:.3f})" for v in vals) + " |")
g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
print("geomean TF32 ratio:", {k: round(g(v), 3) for k, v in rows.items()})
PY
tar czf "$out/call2.tgz" -C "$out" landed.json bound1.json bound2.json landed.log bound1.log bound2.log
rm -f "$out"/*.json "$out"/*.log; rm -rf "$out/cache"
