#!/usr/bin/env bash
# Everything a GPU session checks, in one device call:
#   bash bench/run_gpu_checks.sh tests|direct|tune|compare|sweep|trace|sanitize ...
# Logs go to $OUT (or ./gpu-logs); each step's last lines are printed.  The tuners write their
# tables to $OUT/cache (MEGAWINO_CACHE_DIR), which the later steps read before the shipped ones.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-$PWD}"
out="${OUT:-gpu-logs}"
mkdir -p "$out"
export MEGAWINO_CACHE_DIR="${MEGAWINO_CACHE_DIR:-$out/cache}"
step() {   # step NAME COMMAND...: run, keep the log, print its tail
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$out/$name.log"
}
for what in "$@"; do
  case $what in
    tests)   step gpu-tests python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_gpu_direct.py tests/test_gpu_reliability.py ;;
    direct)  step direct-tune python3 -m megawino.tuning.direct --suite direct --batch 64 --budget "${DIRECT_BUDGET:-120}" ;;
    tune)    step tune python3 -m megawino tune suite --budget "${TUNE_BUDGET:-300}" ;;
    compare) step compare python3 bench/compare.py --out "$out/h100.json" ;;
    compare-direct) step compare-direct python3 bench/compare.py --suite direct --out "$out/h100-direct.json" ;;
    sweep)   step sweep python3 -m megawino sweep resnet50 --batch 64 --compare cudnn --json "$out/sweep-resnet50.json" ;;
    trace)   step trace python3 bench/experiments/trace_overhead.py --json "$out/trace-overhead.json" ;;
    sanitize) step sanitize bash bench/sanitize.sh ;;
    *) echo "unknown step $what"; exit 2 ;;
  esac
done
