#!/usr/bin/env bash
# Where each suite layer's time goes on the current tree: the non-fused stages (input transform,
# GEMM, output transform) timed one by one, the megakernel beside them, and ncu's speed-of-light
# for the transform kernels of two layers.   OUT=/tmp/sp bash bench/experiments/stage_profile.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/stage-profile
export MEGAWINO_CACHE_DIR=/tmp/mwc
t0=$SECONDS
python3 "$repo/bench/experiments/profile_stages.py" variants --layers "" --variants ";" --mega --reps 15 \
  --json "$out/stages.json" > "$out/stages.log" 2>&1
echo "== stages: exit $?, $((SECONDS - t0)) s"
for layer in vgg16.conv1_2 resnet50.conv4_x; do
  t=$SECONDS
  ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
      -k regex:"mw_(input|output|gemm)_kernel" -c 3 \
      python3 "$repo/bench/experiments/profile_stages.py" ncu --layers $layer --batch 64 --variants "" \
      > "$out/ncu-$layer.txt" 2>&1
  echo "== ncu $layer: exit $?, $((SECONDS - t)) s"
  grep -E "mw_|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Block Size|Grid Size|Dynamic Shared" "$out/ncu-$layer.txt" | head -60
done
tail -n 30 "$out/stages.log"
