#!/usr/bin/env bash
# How fast could the megakernel be if a stage cost nothing?  bench/compare.py on the suite in one
# call: the landed build (PyTorch's TF32 default beside it), then diagnostic builds whose outputs
# are wrong by design:
#   gemm_free_1   -DMW_GEMM_FREE=1      GEMM tasks only write their M block, GEMM_OUTPUT tasks form no products
#   gemm_free_2   -DMW_GEMM_FREE=2      the same, but V read once, as any GEMM must
#   transforms_free -DMW_TRANSFORMS_FREE  input and output tasks (and GEMM_OUTPUT's output phase) do nothing
#   all_free      both: what the filter tasks and the scheduler alone take
# Prints each layer's times and TF32 ratios and their geomeans, and what gemm_free_2 plus the GEMM
# at a fraction of the 3xTF32 tensor peak would give, hidden under the rest or added to it.
#   python3 -m pip install --no-deps --no-build-isolation . && OUT=/tmp/fb [LAYOUT=NHWC] bash bench/experiments/free_stage_bounds.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/free-stage-bounds
export MEGAWINO_CACHE_DIR=/tmp/mwc
variants=("landed:" "gemm_free_1:-DMW_GEMM_FREE=1" "gemm_free_2:-DMW_GEMM_FREE=2" "transforms_free:-DMW_TRANSFORMS_FREE"
          "all_free:-DMW_GEMM_FREE=1 -DMW_TRANSFORMS_FREE")
for variant in "${variants[@]}"; do
  name=${variant%%:*} defines=${variant#*:} t=$SECONDS
  backends=ours,prepared; [ "$name" = landed ] && backends=ours,prepared,cudnn_tf32
  MEGAWINO_CUDA_DEFINES="$defines" python3 "$repo/bench/compare.py" --backends $backends --f64-layers 0 \
    ${LAYOUT:+--layout $LAYOUT} --out "$out/$name.json" > "$out/$name.log" 2>&1
  echo "== $name ($defines): exit $?, $((SECONDS - t)) s"
done
python3 - "$out" "${variants[@]%%:*}" <<'PY' | tee "$out/summary.txt"
import json, math, sys, pathlib
out, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
runs = {n: {r["name"]: r for r in json.loads((out / f"{n}.json").read_text())["layers"]} for n in names}
us = lambda row, key: row["backends"][key]["median_us"]
geomean = lambda v: math.exp(sum(map(math.log, v)) / len(v))
ratios = {f"{n}{p}": [] for n in names for p in ("", " prepared")}
rest, peak, tf32 = [], [], []
print("| layer | TF32 us | " + " | ".join(names) + " | GEMM at 3xTF32 peak us |")
print("|---|---|" + "---|" * (len(names) + 1))
for layer, row in runs["landed"].items():
    tf = min(us(row, k) for k in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc"))
    cells = []
    for n in names:
        t, tp = us(runs[n][layer], "megakernel"), us(runs[n][layer], "megakernel_prepared")
        ratios[n].append(tf / t); ratios[f"{n} prepared"].append(tf / tp)
        cells.append(f"{t:.1f} ({tf / t:.3f})")
    gemm_peak = 3 * row["gemm"]["useful_flops"] / 495e12 * 1e6   # three TF32 products; H100 SXM dense TF32 495 TFLOP/s
    rest.append(us(runs["gemm_free_2"][layer], "megakernel")); peak.append(gemm_peak); tf32.append(tf)
    print(f"| {layer} | {tf:.1f} | " + " | ".join(cells) + f" | {gemm_peak:.1f} |")
print("\ngeomean TF32 time / megakernel time:")
for key, v in ratios.items():
    print(f"  {key}: {geomean(v):.3f}")
print("gemm_free_2 plus the GEMM at a fraction of the tensor peak:")
for eff in (1.0, 0.7, 0.5):
    hidden = geomean([tf / max(r, p / eff) for tf, r, p in zip(tf32, rest, peak)])
    added = geomean([tf / (r + p / eff) for tf, r, p in zip(tf32, rest, peak)])
    print(f"  {eff:.0%} of peak: hidden under the rest {hidden:.3f}, added to it {added:.3f}")
PY
tar czf "$out/runs.tgz" -C "$out" $(cd "$out" && ls *.json *.log) && (cd "$out" && rm -f *.json *.log) && rm -rf "$out/cache"
