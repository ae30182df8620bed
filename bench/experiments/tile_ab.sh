#!/usr/bin/env bash
# A/B of two builds of one tree on one GPU (the default and a -D variant), from an installed
# megawino (run from any folder): the GPU tests of the default build, then bench/compare.py
# alternating the default build (all backends, float64 errors on every layer) and the build with
# $AB_DEFINES (megakernel, non-fused and the GEMM stage only), twice each, so that the run-to-run
# spread shows beside the difference; per-layer time ratios last.
#   OUT=/tmp/ab AB_DEFINES="-DMW_X=1" bash bench/experiments/tile_ab.sh [pytest -k expression]
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/tile-ab
run_gpu_tests "${1:-}"
run_compare a1 "" --f64-layers 18
run_compare b1 "$AB_DEFINES" --backends ours,nonfused,gemm
run_compare a2 "" --backends ours,nonfused,gemm
run_compare b2 "$AB_DEFINES" --backends ours,nonfused,gemm
python3 - "$out" <<'PY'
import json, math, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
rows = {k: {r["name"]: r for r in doc.get("layers", [])} for k, doc in runs.items()}
def num(v): return float("nan") if v is None else v
def geo(xs):
    xs = [x for x in xs if x == x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
names = list(rows["a1"])
print(f"{'layer':22}{'mega a1':>9}{'b1':>8}{'a2':>8}{'b2':>8}{'b/a':>7}{'nf b/a':>8}{'gemm a':>8}{'gemm b':>8}{'gemm b/a':>9}{'err a':>9}")
ratio, nf_ratio, g_ratio = [], [], []
for n in names:
    d = {k: rows[k][n]["derived"] for k in rows}
    b = {k: rows[k][n]["backends"] for k in rows}
    mega = {k: num(d[k].get("ours_us")) for k in d}
    nf = {k: num(b[k].get("nonfused", {}).get("median_us")) for k in b}
    gemm = {k: num(b[k].get("gemm_ours", {}).get("median_us")) for k in b}
    r = (mega["b1"] + mega["b2"]) / (mega["a1"] + mega["a2"])
    rn = (nf["b1"] + nf["b2"]) / (nf["a1"] + nf["a2"])
    rg = (gemm["b1"] + gemm["b2"]) / (gemm["a1"] + gemm["a2"])
    ratio.append(r); nf_ratio.append(rn); g_ratio.append(rg)
    err = b["a1"].get("megakernel", {}).get("rel_err_vs_f64")
    print(f"{n:22}{mega['a1']:9.0f}{mega['b1']:8.0f}{mega['a2']:8.0f}{mega['b2']:8.0f}{r:7.3f}{rn:8.3f}"
          f"{(gemm['a1'] + gemm['a2']) / 2:8.0f}{(gemm['b1'] + gemm['b2']) / 2:8.0f}{rg:9.3f}{num(err):9.2e}")
print(f"geomean time b / a: megakernel {geo(ratio):.3f}, non-fused {geo(nf_ratio):.3f}, GEMM {geo(g_ratio):.3f}")
for k in runs:
    wide = sorted(rows[k][n]["derived"].get("gemm_efficiency_vs_cublas") or float("nan") for n in names if rows[k][n]["C"] >= 256)
    print(k, "GEMM x cuBLAS SGEMM on C >= 256, median:", f"{wide[len(wide) // 2]:.3f}")
for k, doc in runs.items():
    s = doc.get("summary", {})
    print(k, {key: s.get(key) for key in ("geomean_cudnn_best_any_over_megakernel", "geomean_tf32_over_megakernel",
                                          "median_gemm_efficiency_vs_cublas", "median_gemm_efficiency_vs_cublas_wide",
                                          "max_rel_err_vs_cudnn", "layers_timed")})
PY
echo "== tests (again): $(tail -n 1 "$out/tests.log")"
