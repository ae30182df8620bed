#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck over bench/sanitize_driver.py's cases (small
# odd layers, megakernel and nonfused, m = 2 and 4, both layouts and GEMM arithmetics), with the
# megakernel's watchdog widened through MEGAWINO_WATCHDOG_S (the driver's default: 600 s).
#
#   bash bench/sanitize.sh [TOOL ...]     # default: memcheck racecheck synccheck
#
# Run on a GPU machine from a directory where megawino is importable (installed, or this
# checkout).  Logs: $OUT/sanitize/<tool>.log if OUT is set, else bench/results/sanitize/.
# Prints one summary line per tool; exits 1 if any tool reports an error, a case fails or a run
# does not finish, 2 if compute-sanitizer is not found.  COMPUTE_SANITIZER=path picks the binary,
# PYTHON the interpreter.
set -u -o pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
logs="${OUT:-$here/results}/sanitize"
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"

sanitizer="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}"
if [ -z "$sanitizer" ]; then
  for candidate in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    [ -x "$candidate" ] && sanitizer="$candidate"
  done
fi
if [ -z "$sanitizer" ]; then
  echo "sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)" >&2
  exit 2
fi

tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck synccheck)
cases=$("$python" "$here/sanitize_driver.py" --list | wc -l)
echo "sanitize: $("$sanitizer" --version | tail -n 1), $cases cases, logs in $logs"
status=0
for tool in "${tools[@]}"; do
  log="$logs/$tool.log"
  t0=$SECONDS
  "$sanitizer" --tool "$tool" --print-limit 1000 "$python" "$here/sanitize_driver.py" > "$log" 2>&1
  rc=$?
  errors=$(sed -n 's/^========= ERROR SUMMARY: \([0-9][0-9]*\) error.*/\1/p' "$log" | tail -n 1)
  if [ -z "$errors" ] && [ "$tool" = racecheck ]; then
    # racecheck closes with its own summary line: "N hazards displayed (E errors, W warnings)".
    errors=$(sed -n 's/^========= RACECHECK SUMMARY: .*(\([0-9][0-9]*\) errors.*/\1/p' "$log" | tail -n 1)
  fi
  ok=$(grep -c '^driver: ok' "$log")
  extra=""
  if [ "$tool" = racecheck ]; then
    extra=$(sed -n 's/^========= RACECHECK SUMMARY: \(.*\)$/, \1/p' "$log" | tail -n 1)
  fi
  if [ -z "$errors" ]; then
    line="no ERROR SUMMARY: the run did not finish"
    status=1
  else
    line="$errors errors$extra"
    [ "$errors" -ne 0 ] && status=1
  fi
  [ "$ok" -ne "$cases" ] && status=1
  [ "$rc" -ne 0 ] && status=1
  printf 'sanitize: %-9s %s; %s/%s cases ok; exit %s; %s s (%s)\n' \
    "$tool" "$line" "$ok" "$cases" "$rc" "$((SECONDS - t0))" "$log"
done
exit $status
