#!/usr/bin/env bash
# One device call: the torch GPU tests (unless $SKIP_TESTS), flag_access_host_time.py, models.py at
# batch 1 (unless $SKIP_MODELS), then defines_ab.sh over $VARIANTS (if set); results under $OUT.
#   SKIP_MODELS=1 VARIANTS="base=;new=-DMW_X=1" AB_ROUNDS=3 bash bench/experiments/session_call.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/session-call
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
export COLUMNS=200
if [ -z "${SKIP_TESTS:-}" ]; then
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider "$repo/tests/test_gpu_torch.py" "$repo/tests/test_gpu_torch_fast.py" \
  "$repo/tests/test_gpu_runtime.py" > "$out/torch-tests.log" 2>&1
echo "== torch GPU tests: exit $?, $((SECONDS - t)) s"; tail -n 2 "$out/torch-tests.log"
fi
python3 "$repo/bench/experiments/flag_access_host_time.py" > "$out/flag-access.log" 2>&1; cat "$out/flag-access.log"
if [ -z "${SKIP_MODELS:-}" ]; then
t=$SECONDS
python3 "$repo/bench/models.py" --models resnet50,yolov3 --batches 1 --json "$out/models-b1.json" > "$out/models-b1.log" 2>&1
echo "== models b1: exit $?, $((SECONDS - t)) s"
fi
[ -n "${VARIANTS:-}" ] && run_defines_ab
rm -rf "$out/cache"
[ -f "$out/models-b1.json" ] || exit 0
python3 - "$out/models-b1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["model"], r["batch"], "fp32", round(r["pytorch_fp32_ms"], 3), "tf32", round(r["pytorch_tf32_ms"], 3),
          "megawino", round(r["megawino_ms"], 3), "x fp32", round(r["pytorch_fp32_ms"] / r["megawino_ms"], 3), r["algos"])
for r in d.get("host_overhead", []):
    print(r)
PY
