#!/usr/bin/env bash
# One device call for a kernel change that is the new default: every GPU test and the sanitizers
# on the default build, then defines_ab.sh over $VARIANTS (the first the default, "" defines).
#   VARIANTS="new=;old=-DMW_X=0" AB_ARGS="--layers a,b" OUT=/tmp/o bash bench/experiments/tests_sanitize_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/tests-sanitize-ab
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider "$repo/tests" > "$out/gpu-tests.log" 2>&1
echo "== GPU tests: exit $?, $((SECONDS - t)) s"; tail -n 2 "$out/gpu-tests.log"
t=$SECONDS
OUT=$out/san bash "$repo/bench/sanitize.sh" > "$out/sanitize.log" 2>&1
echo "== sanitizers: exit $?, $((SECONDS - t)) s"; tail -n 3 "$out/sanitize.log"
tar czf "$out/san.tgz" -C "$out" san 2>/dev/null && rm -rf "$out/san"
t=$SECONDS
OUT=/tmp/ab bash "$repo/bench/experiments/defines_ab.sh" > "$out/ab.txt" 2>&1
echo "== ab: $((SECONDS - t)) s"; tail -n 8 "$out/ab.txt"
rm -rf /tmp/ab/cache; tar czf "$out/ab.tgz" -C /tmp ab
rm -rf "$out/cache"
