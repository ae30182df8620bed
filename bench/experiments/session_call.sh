#!/usr/bin/env bash
# One device call: the torch GPU tests (unless $SKIP_TESTS), flag_access_host_time.py, models.py at
# batch 1 (unless $SKIP_MODELS), then defines_ab.sh over $VARIANTS (if set); results under $OUT.
#   SKIP_MODELS=1 VARIANTS="base=;new=-DMW_X=1" AB_ROUNDS=3 bash bench/experiments/session_call.sh
set -u
repo="$(cd "$(dirname "$0")/../.." && pwd)"
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
cd /tmp
export MEGAWINO_CACHE_DIR=/tmp/mwc PYTHONUNBUFFERED=1 COLUMNS=200
if [ -z "${SKIP_TESTS:-}" ]; then
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider "$repo/tests/test_gpu_torch.py" "$repo/tests/test_gpu_torch_fast.py" \
  "$repo/tests/test_gpu_runtime.py" > "$OUT/torch-tests.log" 2>&1
echo "== torch GPU tests: exit $?, $((SECONDS - t)) s"; tail -n 2 "$OUT/torch-tests.log"
fi
python3 "$repo/bench/experiments/flag_access_host_time.py" > "$OUT/flag-access.log" 2>&1; cat "$OUT/flag-access.log"
if [ -z "${SKIP_MODELS:-}" ]; then
t=$SECONDS
python3 "$repo/bench/models.py" --models resnet50,yolov3 --batches 1 --json "$OUT/models-b1.json" > "$OUT/models-b1.log" 2>&1
echo "== models b1: exit $?, $((SECONDS - t)) s"
fi
if [ -n "${VARIANTS:-}" ]; then
  t=$SECONDS
  OUT=/tmp/ab bash "$repo/bench/experiments/defines_ab.sh" > "$OUT/ab.txt" 2>&1
  echo "== ab: $((SECONDS - t)) s"; tail -n 24 "$OUT/ab.txt"
  rm -rf /tmp/ab/cache; tar czf "$OUT/ab.tgz" -C /tmp ab
fi
[ -f "$OUT/models-b1.json" ] || exit 0
python3 - "$OUT/models-b1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["model"], r["batch"], "fp32", round(r["pytorch_fp32_ms"], 3), "tf32", round(r["pytorch_tf32_ms"], 3),
          "megawino", round(r["megawino_ms"], 3), "x fp32", round(r["pytorch_fp32_ms"] / r["megawino_ms"], 3), r["algos"])
for r in d.get("host_overhead", []):
    print(r)
PY
