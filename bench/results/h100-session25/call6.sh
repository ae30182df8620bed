#!/usr/bin/env bash
# Session 25, call 6: the Winograd GEMM stage against cuBLAS SGEMM and cuBLAS TF32 (CUPY_TF32=1)
# on the same batched shapes, one call.
set -u
cd "$(dirname "$0")/.." && repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1 || echo "install failed"
source bench/experiments/device_setup.sh /tmp/s25f
export MEGAWINO_CACHE_DIR=/tmp/mwc
t=$SECONDS
python3 "$repo/bench/compare.py" --backends gemm --f64-layers 0 --out "$out/gemm-fp32.json" > "$out/gemm-fp32.log" 2>&1
echo "== gemm fp32: exit $?, $((SECONDS - t)) s"
t=$SECONDS
CUPY_TF32=1 python3 "$repo/bench/compare.py" --backends gemm --f64-layers 0 --out "$out/gemm-tf32.json" > "$out/gemm-tf32.log" 2>&1
echo "== gemm tf32: exit $?, $((SECONDS - t)) s"
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, math, sys, pathlib
out = pathlib.Path(sys.argv[1])
load = lambda n: {r["name"]: r for r in json.loads((out / n).read_text())["layers"]}
a, b = load("gemm-fp32.json"), load("gemm-tf32.json")
g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
print("| layer | C | ours us | cuBLAS SGEMM us | cuBLAS TF32 us (CUPY_TF32=1) | TF32 sample err | ours / SGEMM | ours x3 / TF32 (per tensor product) |")
r1, r3 = [], []
for name, row in a.items():
    o = row["backends"]["gemm_ours"]["median_us"]; s = row["backends"]["gemm_cublas"]["median_us"]
    t = b[name]["backends"]["gemm_cublas"]["median_us"]; e = b[name]["backends"]["gemm_cublas"]["rel_err_sample_vs_f64"]
    r1.append(s / o); r3.append(3 * t / o)
    print(f"| {name} | {row['C']} | {o:.1f} | {s:.1f} | {t:.1f} | {e:.1e} | {s / o:.2f} | {3 * t / o:.2f} |")
print("geomean ours/SGEMM", round(g(r1), 3), " ours x3 / TF32", round(g(r3), 3))
wide = [x for x, (n, r) in zip(r3, a.items()) if r["C"] >= 256]
print("C >= 256: median ours x3 / TF32", sorted(wide)[len(wide) // 2] if wide else None)
PY
tar czf "$out/runs.tgz" -C "$out" gemm-fp32.json gemm-tf32.json gemm-fp32.log gemm-tf32.log && rm -f "$out"/gemm-*.json "$out"/gemm-*.log; rm -rf "$out/cache"
