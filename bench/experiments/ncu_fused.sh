#!/usr/bin/env bash
# ncu's full set on one launch of the fused F(2x2) probe kernel (bench/experiments/fused_f2.cu) at
# N C K H W (default 8 64 64 224 224: vgg16.conv1_2 at batch 8), details page and SASS source page.
#   OUT=/tmp/ncu SHAPE="8 64 64 224 224" bash bench/experiments/ncu_fused.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/ncu-fused
read -r N C K H W <<< "${SHAPE:-8 64 64 224 224}"
cat > "$out/once.py" <<PY
import sys; sys.path.insert(0, "$repo/bench/experiments")
import cupy, numpy as np
from fused_f2_probe import Fused, filter_slices
f = Fused()
x = cupy.random.standard_normal(($N, $C, $H, $W), dtype=cupy.float32)
u = cupy.asarray(filter_slices(np.random.default_rng(0).standard_normal(($K, $C, 3, 3)).astype(np.float32)))
y = cupy.empty(($N, $K, $H, $W), cupy.float32)
for _ in range(3):
    f(x, u, y)
cupy.cuda.Device().synchronize()
PY
python3 "$out/once.py"
ncu --set full --import-source no -k regex:fused_f2 --launch-skip 2 -c 1 -f -o "$out/ncu-fused" python3 "$out/once.py" > "$out/ncu.log" 2>&1
echo "== ncu: exit $?"
ncu -i "$out/ncu-fused.ncu-rep" --page details > "$out/ncu-fused-details.txt" 2>&1
ncu -i "$out/ncu-fused.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/ncu-fused-sass.csv.gz"
rm -f "$out/ncu-fused.ncu-rep" "$out/once.py"
grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per|Issued Warp|No Eligible|Hit Rate|Throughput|Pipe|Stall|Bank" "$out/ncu-fused-details.txt" | head -60
