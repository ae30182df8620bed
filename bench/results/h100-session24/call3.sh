#!/usr/bin/env bash
set -u
repo=$PWD
source bench/experiments/device_setup.sh /tmp/call3
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
run_gpu_tests
L=yolov3.res1,yolov3.res2,vgg16.conv1_2,resnet50.conv2_x,yolov3.res3,vgg16.conv2_2
t=$SECONDS
OUT=/tmp/sab B_SOURCES=$repo/scratch_v9/b_cuda AB_ROUNDS=2 AB_ARGS="--backends ours --layout NHWC --layers $L" bash $repo/bench/experiments/source_ab.sh > $out/source_ab.txt 2>&1
echo "== source_ab (a new, b landed) $((SECONDS-t)) s"; tail -n 9 $out/source_ab.txt
export VARIANTS="stream=;plain=-DMW_NHWC_V_STREAMING=0" AB_ARGS="--layout NHWC --layers $L" AB_ROUNDS=2; run_defines_ab
