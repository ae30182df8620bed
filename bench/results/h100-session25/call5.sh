#!/usr/bin/env bash
set -u
cd "$(dirname "$0")/.." && repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1 || echo "install failed"
source bench/experiments/device_setup.sh /tmp/s25e
export MEGAWINO_CACHE_DIR=/tmp/mwc
for v in "landed:" "transforms_free:-DMW_TRANSFORMS_FREE" "gemm_free_2:-DMW_GEMM_FREE=2" "all_free:-DMW_GEMM_FREE=1 -DMW_TRANSFORMS_FREE"; do
  name=${v%%:*} defines=${v#*:} t=$SECONDS
  MEGAWINO_CUDA_DEFINES="$defines" python3 "$repo/bench/experiments/grid_probe.py" --json "$out/grid-$name.json" > "$out/grid-$name.log" 2>&1
  echo "== $name: exit $?, $((SECONDS - t)) s"
done
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
d = {n: {r["layer"]: r for r in json.loads((out / f"grid-{n}.json").read_text())} for n in ("landed", "transforms_free", "gemm_free_2", "all_free")}
print("| layer | landed 2 | landed 1 | GEMM-only 2 | GEMM-only 1 | transforms-only 2 | transforms-only 1 | common 2 | common 1 |")
for layer in d["landed"]:
    print(f"| {layer} | " + " | ".join(f"{d[n][layer]['us_2']:.1f} | {d[n][layer]['us_1']:.1f}" for n in d) + " |")
PY
rm -rf "$out/cache"
