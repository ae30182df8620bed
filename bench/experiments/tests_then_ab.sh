#!/usr/bin/env bash
# Installs this checkout, runs the GPU tests of test_gpu.py and test_gpu_reliability.py on it, then
# source_ab.sh against $B_SOURCES with the megakernel only ($AB_ROUNDS alternations, default 3);
# the A/B folder is tarred.
#   mkdir -p bench/experiments/b_cuda && git archive REV cuda | tar x --strip-components=1 -C bench/experiments/b_cuda
#   OUT=/tmp/ab bash bench/experiments/tests_then_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/tests-then-ab
(cd "$repo" && python3 -m pip install -q --no-deps --no-build-isolation .) > "$out/pip.log" 2>&1 \
  || { echo "pip failed"; tail "$out/pip.log"; exit 1; }
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider "$repo/tests/test_gpu.py" "$repo/tests/test_gpu_reliability.py" \
  > "$out/tests.log" 2>&1
echo "== tests exit $? $((SECONDS - t)) s"; tail -n 3 "$out/tests.log"
AB_ARGS="--backends ours" AB_ROUNDS=${AB_ROUNDS:-3} OUT=$out/ab \
  B_SOURCES=${B_SOURCES:-$repo/bench/experiments/b_cuda} bash "$repo/bench/experiments/source_ab.sh" 2>&1 | tail -25
cd "$out" && rm -rf ab/cache cache && tar czf ab.tgz ab/*.json ab/*.log && rm -rf ab
