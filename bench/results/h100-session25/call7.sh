#!/usr/bin/env bash
# Session 25, call 7: the Winograd GEMM stage (compare.py's gemm columns) and cuBLAS through
# torch.bmm with TF32 off and on, on the same batched shapes, in one call.
set -u
cd "$(dirname "$0")/.." && repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1 || echo "install failed"
source bench/experiments/device_setup.sh /tmp/s25g
export MEGAWINO_CACHE_DIR=/tmp/mwc
t=$SECONDS
python3 "$repo/bench/compare.py" --backends gemm --f64-layers 0 --out "$out/gemm.json" > "$out/gemm.log" 2>&1
echo "== compare gemm: exit $?, $((SECONDS - t)) s"
t=$SECONDS
python3 "$repo/bench/experiments/cublas_tf32_gemm.py" --json "$out/cublas.json" > "$out/cublas.log" 2>&1
echo "== cublas tf32: exit $?, $((SECONDS - t)) s"; tail -n 3 "$out/cublas.log"
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, math, sys, pathlib
out = pathlib.Path(sys.argv[1])
a = {r["name"]: r for r in json.loads((out / "gemm.json").read_text())["layers"]}
c = {r["layer"]: r for r in json.loads((out / "cublas.json").read_text())}
g = lambda v: math.exp(sum(map(math.log, v)) / len(v))
print("| layer | C | ours us | cupy SGEMM us | torch SGEMM us | torch TF32 us | TF32 err | ours / SGEMM | 3 x TF32 time / ours |")
r1, r3, wide = [], [], []
for name, row in a.items():
    o = row["backends"]["gemm_ours"]["median_us"]; s = row["backends"]["gemm_cublas"]["median_us"]; k = c[name]
    r1.append(s / o); r3.append(3 * k["tf32_us"] / o)
    if row["C"] >= 256:
        wide.append(3 * k["tf32_us"] / o)
    print(f"| {name} | {row['C']} | {o:.1f} | {s:.1f} | {k['sgemm_us']:.1f} | {k['tf32_us']:.1f} | {k['tf32_rel_err']:.1e} | {s / o:.2f} | {3 * k['tf32_us'] / o:.2f} |")
print("geomean ours / SGEMM", round(g(r1), 3), "; 3 x cuBLAS TF32 time / ours", round(g(r3), 3),
      "; C >= 256 median", round(sorted(wide)[len(wide) // 2], 3))
PY
tar czf "$out/runs.tgz" -C "$out" gemm.json gemm.log cublas.json cublas.log && rm -f "$out"/gemm.* "$out"/cublas.*; rm -rf "$out/cache"
