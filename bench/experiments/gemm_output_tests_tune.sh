#!/usr/bin/env bash
# GEMM_OUTPUT tasks on the GPU: their tests and test_gpu.py, then the C <= 64 suite layers re-tuned
# with GEMM_OUTPUT candidates and compared, shipped table against shipped + retuned entries
# (retune_layers.sh).   OUT=/tmp/go bash bench/experiments/gemm_output_tests_tune.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/gemm-output-tune
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider "$repo/tests/test_gemm_output.py" "$repo/tests/test_gpu.py" > "$out/tests.log" 2>&1
echo "== tests: exit $?, $((SECONDS - t)) s"; tail -n 6 "$out/tests.log"
OUT=$out/retune LAYERS=${LAYERS:-yolov3.res1,resnet50.conv2_x,vgg16.conv1_2,yolov3.res2} TOP=${TOP:-8} BUDGET=${BUDGET:-60} \
  bash "$repo/bench/experiments/retune_layers.sh"
tar czf "$out/retune.tgz" -C "$out/retune" $(cd "$out/retune" && ls *.json *.log) && rm -rf "$out/retune"
