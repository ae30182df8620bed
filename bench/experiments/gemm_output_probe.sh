#!/usr/bin/env bash
# The GEMM + output task probe (gemm_output_probe.py) and, in the same call, the non-fused stage
# times and the megakernel of the same layers (profile_stages.py).   OUT=/tmp/go bash bench/experiments/gemm_output_probe.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/gemm-output
layers=${LAYERS:-resnet50.conv2_x,vgg16.conv1_2,yolov3.res1,yolov3.res2}
t=$SECONDS
python3 "$repo/bench/experiments/gemm_output_probe.py" --layers "$layers" --json "$out/gemm-output.json" > "$out/gemm-output.log" 2>&1
echo "== gemm-output probe: exit $?, $((SECONDS - t)) s"; tail -n 12 "$out/gemm-output.log"
t=$SECONDS
python3 "$repo/bench/experiments/profile_stages.py" variants --layers "$layers" --variants ";" --mega --reps 15 \
  --json "$out/stages.json" > "$out/stages.log" 2>&1
echo "== stages: exit $?, $((SECONDS - t)) s"; tail -n 12 "$out/stages.log"
