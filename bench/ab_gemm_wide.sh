#!/usr/bin/env bash
# A/B of the opt-in wide GEMM tile (MW_GEMM_WIDE=1, bench/NOTES.md experiment 19), one device call
# (~3-4 min on the H100, most of it NVRTC/ptxas compiles):
#   1. GEMM stage alone and megakernel, per layer the order old / new / old / new in one process
#      (bench/profile_stages.py --stages=gemm --mega; each run checks V / M / y against the first
#      variant and the megakernel against the non-fused path bitwise, and records the driver's
#      registers / local bytes of mw_megakernel).  resnet50.conv2_x (K 64: narrow tiles only in
#      both builds) is the control for "the narrow tile is not slower with the wide one compiled in".
#   2. tests/test_gpu.py with -DMW_GEMM_WIDE=1 added to every runtime compile (runtime.compile_options
#      wrapped in-process: the tests have no switch for extra defines), then in the same process:
#      a layer run with task sizes that mix 128- and 64-row wide tiles and two column spans per task
#      (tiles_per_group 192, gemm_k_per_task 200 = K: spans of 128 and 72 columns) compared
#      bitwise with narrow-only task sizes (64 / 64), megakernel and non-fused; and the driver's
#      registers / local bytes of mw_megakernel (8 variants) and mw_gemm_kernel (4) as built there.
# Usage (repository root):  bash bench/ab_gemm_wide.sh        logs under $OUT (or ./gpu-logs)
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
  tail -n "${TAIL:-40}" "$out/$name.log"
}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"

OLD="-DMW_GEMM_WIDE=0"
NEW="-DMW_GEMM_WIDE=1"
step ab python3 bench/profile_stages.py variants \
  --layers vgg16.conv3_2,vgg16.conv4_2,yolov3.res3,yolov3.res5,resnet50.conv4_x,resnet50.conv5_x,resnet50.conv2_x \
  --variants="$OLD;$NEW;$OLD;$NEW" --stages=gemm --mega --reps "${REPS:-15}" --json "$out/ab_gemm_wide.json"

# GEMM-stage A/B table from the json (the profile_stages table lists runs, not the change).
python3 - "$out/ab_gemm_wide.json" <<'EOF' | tee "$out/ab_gemm_table.txt"
import json, sys
rows = json.load(open(sys.argv[1]))
print("| layer | GEMM old (us) | GEMM new (us) | change | TFLOP/s old / new | mega old | mega new | change | all bitwise |")
print("|---|---|---|---|---|---|---|---|---|")
def runs(xs, k):
    return " / ".join("%.1f" % x[k] for x in xs)


def mean(xs, k):
    return sum(x[k] for x in xs) / len(xs)


for lay in dict.fromkeys(r["layer"] for r in rows):
    rs = [r for r in rows if r["layer"] == lay]
    old = [r for r in rs if r["variant"] == "-DMW_GEMM_WIDE=0"]
    new = [r for r in rs if r["variant"] == "-DMW_GEMM_WIDE=1"]
    ok = all(all(r["same"].values()) and not r["nan"] and r.get("mega_same_as_nonfused", False) for r in rs)
    print("| %s | %s | %s | %+.1f%% | %.1f / %.1f | %s | %s | %+.1f%% | %s |" % (
        lay, runs(old, "gemm_us"), runs(new, "gemm_us"), 100 * (mean(new, "gemm_us") / mean(old, "gemm_us") - 1),
        mean(old, "gemm_tflops"), mean(new, "gemm_tflops"), runs(old, "mega_us"), runs(new, "mega_us"),
        100 * (mean(new, "mega_us") / mean(old, "mega_us") - 1), ok))
print("mega regs / local bytes (driver):", sorted({(r["variant"], r["mega_regs"], r["mega_local_bytes"]) for r in rows}))
EOF

step gpu-tests-wide python3 - <<'EOF'
import sys

import pytest

import megawino.runtime as rt

_orig = rt.compile_options


def compile_options(*args, **kwargs):
    return _orig(*args, **kwargs) + ("-DMW_GEMM_WIDE=1",)


rt.compile_options = compile_options
print("compile options now:", rt.compile_options(4, "NCHW", False), flush=True)
rc = pytest.main(["-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_gpu.py"])

# Wide tiles of both heights and two column spans per task against narrow-only task sizes.
import cupy as cp
import numpy as np
from megawino.spec import LayerSpec
from megawino.tasks import TaskParams
bad = 0
for layout in ("NCHW", "NHWC"):
    spec = LayerSpec(3, 64, 200, 22, 22, layout=layout)
    rng = cp.random.default_rng(5)
    x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
    w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
    ys = {}
    for name, tp in (("narrow 64/64", TaskParams(m=4, tiles_per_group=64, gemm_k_per_task=64)),
                     ("wide 192/200", TaskParams(m=4, tiles_per_group=192, gemm_k_per_task=200)),
                     ("wide 128/128", TaskParams(m=4, tiles_per_group=128, gemm_k_per_task=128))):
        for algo in ("megakernel", "nonfused"):
            ys[(name, algo)] = cp.asnumpy(rt.plan(spec, params=tp, algo=algo)(x, w))
    ref = ys[("narrow 64/64", "nonfused")]
    for key, y in ys.items():
        same = bool(np.array_equal(y, ref)) and not np.isnan(y).any()
        bad += not same
        print(f"decomposition check {layout} {key}: bitwise equal to narrow non-fused: {same}", flush=True)

# Driver registers / local bytes of every flagged module (compiled here if the tests did not).
from cupy_backends.cuda.api import driver
for kind, fn_name in (("megakernel", "mw_megakernel"), ("nonfused", "mw_gemm_kernel")):
    for m in (4, 2):
        for layout in ("NCHW", "NHWC"):
            for trace in ((False, True) if kind == "megakernel" else (False,)):
                fn = rt.module(kind, m, layout, trace).get_function(fn_name)
                ptr = int(getattr(fn, "kernel", fn).ptr)
                regs = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, ptr)
                local = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, ptr)
                print(f"driver {fn_name} m{m} {layout}{' trace' if trace else ''} MW_GEMM_WIDE=1: "
                      f"{regs} registers, {local} local bytes", flush=True)
sys.exit(int(rc) or int(bad > 0))
EOF
