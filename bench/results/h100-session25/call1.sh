#!/usr/bin/env bash
# Session 25, call 1: where the time goes now (stage times, all layers), the TF32 ratio of the
# BF16x3 GEMM (half the tensor work) beside 3xTF32's in one run, GEMM_OUTPUT tasks on C=128/192
# layers, ncu speed-of-light of two narrow layers' megakernels.
set -u
cd "$(dirname "$0")/.." && repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1 || echo "install failed"
source bench/experiments/device_setup.sh /tmp/s25
export MEGAWINO_CACHE_DIR=/tmp/mwc
t=$SECONDS
python3 "$repo/bench/compare.py" --backends ours,cudnn_tf32 --f64-layers 0 --out "$out/tf32x3.json" > "$out/tf32x3.log" 2>&1
echo "== compare 3xtf32: exit $?, $((SECONDS - t)) s"
t=$SECONDS
python3 "$repo/bench/compare.py" --backends ours,cudnn_tf32 --f64-layers 0 --gemm-math bf16x3 --out "$out/bf16x3.json" > "$out/bf16x3.log" 2>&1
echo "== compare bf16x3: exit $?, $((SECONDS - t)) s"
t=$SECONDS
python3 "$repo/bench/experiments/profile_stages.py" variants --layers "" --variants ";" --mega --reps 15 \
  --json "$out/stages.json" > "$out/stages.log" 2>&1
echo "== stages: exit $?, $((SECONDS - t)) s"
for layer in vgg16.conv1_2 vgg16.conv2_2; do
  t=$SECONDS
  python3 "$repo/bench/experiments/megakernel_once.py" "$layer" --launches 2 > /dev/null 2>&1
  ncu --section SpeedOfLight --section MemoryWorkloadAnalysis -k regex:mw_megakernel --launch-skip 2 -c 1 \
    python3 "$repo/bench/experiments/megakernel_once.py" "$layer" --launches 4 > "$out/ncu-$layer.txt" 2>&1
  echo "== ncu $layer: exit $?, $((SECONDS - t)) s"
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\)|L2 Hit|Mem Busy|Max Bandwidth" "$out/ncu-$layer.txt" | head -14
done
# GEMM_OUTPUT tasks on wider C: the cap raised in a copy, installed over the landed package.
rm -rf /tmp/wide && cp -r "$repo" /tmp/wide && cd /tmp/wide
sed -i 's/^GEMM_OUTPUT_MAX_C_STRIDE = 64/GEMM_OUTPUT_MAX_C_STRIDE = 256/' megawino/core/tasks.py
sed -i 's/GEMM_OUTPUT_MAX_C_STRIDE = 64;/GEMM_OUTPUT_MAX_C_STRIDE = 256;/' cuda/generated_tasks.cuh
grep -n "GEMM_OUTPUT_MAX_C_STRIDE =" megawino/core/tasks.py cuda/generated_tasks.cuh
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1 || echo "install wide failed"
cd /tmp
t=$SECONDS
python3 /tmp/wide/bench/experiments/gemm_output_variants.py --layers vgg16.conv2_2,resnet50.conv3_x,yolov3.res3,densenet161.block1,densenet161.block2,densenet161.block3 \
  --variants ";" --json "$out/gemm-output-wide.json" > "$out/gemm-output-wide.log" 2>&1
echo "== gemm_output wide: exit $?, $((SECONDS - t)) s"; tail -n 20 "$out/gemm-output-wide.log"
cd "$repo" && python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(name):
    p = out / name
    return {r["name"]: r for r in json.loads(p.read_text())["layers"]} if p.exists() else {}
a, b = load("tf32x3.json"), load("bf16x3.json")
stages = {}
if (out / "stages.json").exists():
    for r in json.loads((out / "stages.json").read_text()):
        stages[r["layer"]] = r
print("| layer | 3xTF32 us | TF32 us | ratio | BF16x3 us | ratio | input | GEMM | output | mega(heur) |")
import math
ra, rb = [], []
for name, r in a.items():
    bk = r["backends"]
    tf = min(bk[k]["median_us"] for k in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc") if k in bk and bk[k].get("median_us"))
    us = bk["megakernel"]["median_us"]
    ub = b.get(name, {}).get("backends", {}).get("megakernel", {}).get("median_us")
    tfb = min(b[name]["backends"][k]["median_us"] for k in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc")) if name in b else None
    s = stages.get(name, {})
    ra.append(tf / us); rb.append(tfb / ub if ub else float("nan"))
    print(f"| {name} | {us:.1f} | {tf:.1f} | {tf/us:.3f} | {ub or 0:.1f} | {(tfb/ub) if ub else 0:.3f} | "
          f"{s.get('input_us',0):.1f} | {s.get('gemm_us',0):.1f} | {s.get('output_us',0):.1f} | {s.get('mega_us',0):.1f} |")
g = lambda v: math.exp(sum(math.log(x) for x in v) / len(v)) if v else float("nan")
print("geomean TF32 ratio 3xTF32", round(g(ra), 3), "BF16x3", round(g(rb), 3))
PY
