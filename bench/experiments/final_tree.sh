#!/usr/bin/env bash
# The landed tree, whole, on one GPU: every GPU test, the sanitizers, bench/compare.py on the suite
# (float64 references on all 18 layers) and bench/models.py; full logs under $OUT.
#   OUT=/tmp/final bash bench/experiments/final_tree.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/final-tree
export MEGAWINO_CACHE_DIR=/tmp/mwc
run_all_gpu_tests
run_sanitizers
t=$SECONDS
python3 "$repo/bench/compare.py" --out "$out/h100.json" --f64-layers 18 > "$out/compare.log" 2>&1
echo "== compare: exit $?, $((SECONDS - t)) s"; tail -n 30 "$out/compare.log"
t=$SECONDS
python3 "$repo/bench/models.py" --json "$out/h100-models.json" > "$out/models.log" 2>&1
echo "== models: exit $?, $((SECONDS - t)) s"; tail -n 14 "$out/models.log"
