#!/usr/bin/env bash
# A/B of the Winograd GEMM's arithmetic on one GPU, from an installed megawino (run from any
# folder): the GPU tests of the runtime, then bench/compare.py with the default build and with
# each define set in $AB_DEFINES (space-separated; default: the mma.sync GEMM on sm_90a).
#   OUT=/tmp/ab bash bench/experiments/gemm_ab.sh [pytest -k expression]
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/gemm-ab
run_gpu_tests "${1:-}"
run_compare default ""
# The variants time megawino and the GEMM stage only ($AB_BACKENDS).
name_of() { local n=${1#-D}; echo "${n//=/_}"; }
for d in ${AB_DEFINES:--DMW_GEMM_WGMMA=0}; do run_compare "$(name_of "$d")" "$d" --backends "${AB_BACKENDS:-ours,gemm}"; done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
def rows(doc):
    return {r["name"]: r for r in doc.get("layers", [])}
def num(value):   # a ratio a variant run did not measure (its --backends) is None
    return float("nan") if value is None else value
names = list(rows(runs["default"]))
print("layer".ljust(22) + "".join(f"{k[:20]:>22}" for k in runs) + "   (ours us | gemm x sgemm | x best cuDNN)")
for n in names:
    cells = []
    for k, doc in runs.items():
        d = rows(doc).get(n, {}).get("derived", {})
        cells.append(f"{num(d.get('ours_us')):.0f}|{num(d.get('gemm_efficiency_vs_cublas')):.2f}"
                     f"|{num(d.get('ratio_cudnn_best_any_over_ours')):.2f}")
    print(n.ljust(22) + "".join(f"{c:>22}" for c in cells))
for k, doc in runs.items():
    s = doc.get("summary", {})
    print(k, {key: s.get(key) for key in ("geomean_cudnn_best_any_over_megakernel", "geomean_nonfused_over_megakernel",
                                          "median_gemm_efficiency_vs_cublas", "max_rel_err_vs_cudnn", "layers_timed")})
PY
# Optional: ncu's speed-of-light and warp-state sections of the non-fused GEMM kernel on the
# layers in $NCU_LAYERS (comma-separated), default build.
for layer in ${NCU_LAYERS:+${NCU_LAYERS//,/ }}; do
  ncu --section SpeedOfLight --section WarpStateStats --section Occupancy -k regex:mw_gemm_kernel -c 1 \
    python3 "$repo/bench/run_layer.py" "$layer" --algo nonfused --runs 1 > "$out/ncu-$layer.txt" 2>&1
  echo "== ncu $layer: exit $?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per Issued" "$out/ncu-$layer.txt" | head -20
done
