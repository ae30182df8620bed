#!/usr/bin/env bash
set -u
repo=$PWD
source bench/experiments/device_setup.sh /tmp/call1
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
run_gpu_tests
L=vgg16.conv3_2,vgg16.conv4_2,vgg16.conv5_2,yolov3.res4,yolov3.res5,resnet50.conv4_x,resnet50.conv5_x,resnet50.conv2_x
t=$SECONDS
OUT=/tmp/sab B_SOURCES=$repo/scratch_v9/b_cuda AB_ROUNDS=3 AB_ARGS="--backends ours --layers $L" bash $repo/bench/experiments/source_ab.sh > $out/source_ab.txt 2>&1
echo "== source_ab $((SECONDS-t)) s"; tail -n 14 $out/source_ab.txt
export VARIANTS="onebar=;paired=-DMW_GEMM_ONE_BARRIER=0" AB_ARGS="--layers $L" AB_ROUNDS=2; run_defines_ab
cd $repo/scratch_v9
t=$SECONDS
timeout 200 python3 fused_f2_probe.py --chunk 16 --json $out/v8.json > $out/v8.log 2>&1; echo "== v8 rc $? $((SECONDS-t)) s"; tail -n 12 $out/v8.log
t=$SECONDS
timeout 200 python3 fused_f2_probe.py --chunk 16 --cluster --json $out/v9.json > $out/v9.log 2>&1; echo "== v9 rc $? $((SECONDS-t)) s"; tail -n 12 $out/v9.log
