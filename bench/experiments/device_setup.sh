# Sourced by the device scripts of bench/experiments: sets $repo (this checkout) and $out ($OUT, else
# the folder given), points the kernel cache into $out and moves to /tmp, so that the installed
# megawino runs, not the checkout's (whose cuda/ folder would shadow CUDA's Python package).
#   source "$(dirname "$0")/device_setup.sh" /tmp/default-out
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$1}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MEGAWINO_CACHE_DIR="$out/cache"
cd /tmp

# The A/B scripts' two steps: test_gpu.py on the default build (an optional pytest -k expression),
# and one bench/compare.py run of a build:  run_compare NAME DEFINES [compare.py options].
run_gpu_tests() {
  local t=$SECONDS
  python3 -m pytest -q -m gpu -p no:cacheprovider ${1:+-k "$1"} "$repo/tests/test_gpu.py" > "$out/tests.log" 2>&1
  echo "== tests: exit $?, $((SECONDS - t)) s"; tail -n 8 "$out/tests.log"
}
run_compare() {
  local t=$SECONDS name=$1 defines=$2; shift 2
  MEGAWINO_CUDA_DEFINES="$defines" python3 "$repo/bench/compare.py" --out "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "== compare $name ($defines): exit $?, $((SECONDS - t)) s"
}
# Every GPU test of the checkout, then the sanitizers (their logs tarred): the whole-tree checks.
run_all_gpu_tests() {
  local t=$SECONDS
  python3 -m pytest -q -m gpu -p no:cacheprovider "$repo/tests" > "$out/gpu-tests.log" 2>&1
  echo "== GPU tests: exit $?, $((SECONDS - t)) s"; tail -n 3 "$out/gpu-tests.log"
}
run_sanitizers() {
  local t=$SECONDS
  OUT=$out/san bash "$repo/bench/sanitize.sh" > "$out/sanitize.log" 2>&1
  echo "== sanitizers: exit $?, $((SECONDS - t)) s"; tail -n 4 "$out/sanitize.log"
  tar czf "$out/san.tgz" -C "$out" san 2>/dev/null && rm -rf "$out/san"
}
# defines_ab.sh over $VARIANTS in /tmp/ab: its table's last lines printed, the folder tarred.
run_defines_ab() {
  local t=$SECONDS
  OUT=/tmp/ab bash "$repo/bench/experiments/defines_ab.sh" > "$out/ab.txt" 2>&1
  echo "== ab: $((SECONDS - t)) s"; tail -n 24 "$out/ab.txt"
  rm -rf /tmp/ab/cache; tar czf "$out/ab.tgz" -C /tmp ab
}
