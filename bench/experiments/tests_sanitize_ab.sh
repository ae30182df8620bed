#!/usr/bin/env bash
# One device call for a kernel change that is the new default: every GPU test and the sanitizers
# on the default build, then defines_ab.sh over $VARIANTS (the first the default, "" defines).
#   VARIANTS="new=;old=-DMW_X=0" AB_ARGS="--layers a,b" OUT=/tmp/o bash bench/experiments/tests_sanitize_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/tests-sanitize-ab
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
run_all_gpu_tests
run_sanitizers
run_defines_ab
rm -rf "$out/cache"
