#!/usr/bin/env bash
# ncu's speed-of-light, memory and warp-state sections on the GEMM_OUTPUT task kernel (the non-fused
# module's mw_gemm_output_kernel, yolov3.res1 at batch 16) and on the probe kernel of the same
# task (bench/experiments/gemm_output.cu) at the same shape.   OUT=/tmp/ncu bash bench/experiments/ncu_gemm_output.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/ncu-gemm-output
cat > "$out/once.py" <<PY
import sys, dataclasses; sys.path.insert(0, "$repo/bench/experiments")
import cupy, numpy as np, megawino
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import default_params
from gemm_output_probe import GemmOutput
spec = LayerSpec(16, 32, 64, 208, 208)
p = dataclasses.replace(default_params(spec), tiles_per_group=64, gemm_k_per_task=32, fused_output=True,
                        input_tiles_per_task=None, output_tiles_per_task=None)
x = cupy.random.standard_normal(spec.input_shape, dtype=cupy.float32)
w = cupy.random.standard_normal(spec.weight_shape, dtype=cupy.float32)
plan = megawino.plan(spec, params=p, algo="nonfused")
y = plan(x, w)
T = 16 * 52 * 52
V = cupy.random.standard_normal((36, T, 32), dtype=cupy.float32)
Ut = cupy.random.standard_normal((36, 64, 32), dtype=cupy.float32)
GemmOutput()(V, Ut, y)
cupy.cuda.Device().synchronize()
PY
python3 "$out/once.py" && echo "== once ok"
sections="--section SourceCounters --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section InstructionStats"
ncu $sections -k regex:"mw_gemm_output_kernel|gemm_output_c" -f python3 "$out/once.py" > "$out/ncu-details.txt" 2>&1
echo "== ncu: exit $?"
rm -f "$out/once.py"
grep -E "Stall|stall|gemm_output|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible|Hit Rate|Throughput|Stall|Bank|Executed Ipc|L1/TEX" "$out/ncu-details.txt"  | head -120
