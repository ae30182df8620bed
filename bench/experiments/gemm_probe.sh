#!/usr/bin/env bash
# Where the Winograd GEMM's time goes (docs/experiments.md 62), from an installed megawino, run
# from any folder: the warpgroup-MMA rate of tile-shaped instruction patterns with no memory
# traffic (wgmma_rate.py), per-stage times of the suite layers in $STAGE_LAYERS (default: all;
# non-fused stages and the megakernel, profile_stages.py), and ncu's stall breakdown of the
# non-fused GEMM kernel on the layers in $NCU_LAYERS (default vgg16.conv4_2).
#   OUT=/tmp/probe bash bench/experiments/gemm_probe.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/gemm-probe
t=$SECONDS
python3 "$repo/bench/experiments/wgmma_rate.py" --json "$out/wgmma-rate.json" 2>&1 | tee "$out/wgmma-rate.log"
echo "== wgmma_rate: $((SECONDS - t)) s"
t=$SECONDS
python3 "$repo/bench/experiments/profile_stages.py" variants --variants ";" --mega --reps 10 \
  --layers "${STAGE_LAYERS:-$(python3 -c 'from megawino.core import suite; print(",".join(s.name for s in suite.load_suite(suite="winograd")))')}" --json "$out/stages.json" > "$out/stages.log" 2>&1
echo "== stages: exit $?, $((SECONDS - t)) s"
grep -E "^\|" "$out/stages.log" | head -24
for layer in ${NCU_LAYERS:-vgg16.conv4_2}; do
  t=$SECONDS
  ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis -k regex:mw_gemm_kernel -c 1 \
    python3 "$repo/bench/run_layer.py" "$layer" --algo nonfused --runs 1 > "$out/ncu-$layer.txt" 2>&1
  echo "== ncu $layer: exit $?, $((SECONDS - t)) s"
  grep -E "Duration|Throughput|Registers Per|Achieved Occupancy|Stall|Warp Cycles Per|Issued Warp|No Eligible|Active Warps|Eligible Warps|Pipe|Hit Rate" "$out/ncu-$layer.txt" | head -60
done
