#!/usr/bin/env bash
# A/B of the megakernel NCHW output store lane map 8 channels x 4 adjacent tiles per warp store
# (MW_MEGA_OUTPUT_LANES, bench/NOTES.md experiment 21), one device call (~3-4 min on the H100,
# most of it NVRTC/ptxas compiles):
#   1. megakernel A/B in one process, per layer the order old / new / old / new
#      (bench/profile_stages.py --mega --stages=none; each run checks V / M / y against the first
#      variant and the megakernel against the non-fused path bitwise, and records the driver's
#      registers / local bytes of mw_megakernel: look for mega_local_bytes > 0);
#   2. tests/test_gpu.py with -DMW_MEGA_OUTPUT_LANES=1 added to every runtime compile
#      (runtime.compile_options wrapped in-process: the tests have no switch for extra defines),
#      so every NCHW megakernel in the tests (m = 4 / 2, trace) runs the new output code and is
#      compared bitwise with the non-fused path and across mappings (NHWC builds are unchanged
#      by the flag: byte-identical PTX).
# Usage (repository root):  bash bench/ab_output_lanes.sh        logs under $OUT (or ./gpu-logs)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-$PWD}"
out="${OUT:-gpu-logs}"
mkdir -p "$out"
if [ -z "${MEGAWINO_SUITE:-}" ] && [ ! -f ../shared/suite/layers.json ] && [ ! -f shared/suite/layers.json ] \
   && [ -f .mwdata/layers.json ]; then
  export MEGAWINO_SUITE=.mwdata/layers.json
fi
step() {   # step NAME COMMAND...: run, keep the log, print its tail
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-30}" "$out/$name.log"
}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

OLD="-DMW_MEGA_OUTPUT_LANES=0"
NEW="-DMW_MEGA_OUTPUT_LANES=1"
step ab python3 bench/profile_stages.py variants \
  --layers vgg16.conv1_2,yolov3.res1,yolov3.res2,resnet50.conv2_x,densenet161.block1,vgg16.conv4_2 \
  --variants="$OLD;$NEW;$OLD;$NEW" --mega --stages=none --reps "${REPS:-15}" --json "$out/ab_output_lanes.json"

step gpu-tests-output-lanes python3 - <<'PYEOF'
import sys

import pytest

import megawino.runtime as rt

_orig = rt.compile_options


def compile_options(*args, **kwargs):
    return _orig(*args, **kwargs) + ("-DMW_MEGA_OUTPUT_LANES=1",)


rt.compile_options = compile_options
print("compile options now:", rt.compile_options(4, "NCHW", False), flush=True)
sys.exit(pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"]))
PYEOF
