#!/usr/bin/env bash
# GPU tests of the installed tree (test_gpu.py, test_gpu_reliability.py), then source_ab.sh against
# $B_SOURCES with the megakernel only ($AB_ROUNDS alternations, default 3); the A/B folder is tarred.
#   B_SOURCES=$PWD/bench/experiments/b_cuda bash bench/experiments/tests_then_ab.sh
set -u
cd "$(dirname "$0")/../.."
repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > $OUT/pip.log 2>&1 || { echo pip failed; tail $OUT/pip.log; exit 1; }
cd /tmp && t=$SECONDS
MEGAWINO_CACHE_DIR=/tmp/mwc python3 -m pytest -q -m gpu -p no:cacheprovider $repo/tests/test_gpu.py $repo/tests/test_gpu_reliability.py > $OUT/tests.log 2>&1
echo "== tests exit $? $((SECONDS-t)) s"; tail -n 3 $OUT/tests.log
cd $repo
AB_ARGS="--backends ours" AB_ROUNDS=${AB_ROUNDS:-3} OUT=$OUT/ab B_SOURCES=${B_SOURCES:-$repo/bench/experiments/b_cuda} bash bench/experiments/source_ab.sh 2>&1 | tail -25
cd $OUT && tar czf ab.tgz ab/*.json ab/*.log && rm -rf ab
