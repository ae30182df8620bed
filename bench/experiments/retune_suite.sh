#!/usr/bin/env bash
# Re-tune the whole suite's mapping table on the current kernels and compare, in one call, the
# megakernel with the shipped table and with the new one, alternating twice (run from any folder).
#   OUT=/tmp/rt BUDGET=360 TOP=8 bash bench/experiments/retune_suite.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/retune-suite
t=$SECONDS
python3 -m megawino tune suite --top "${TOP:-8}" --budget "${BUDGET:-360}" --out "$out/retuned.json" > "$out/tune.log" 2>&1
echo "== tune suite: exit $?, $((SECONDS - t)) s"; tail -n 4 "$out/tune.log"
for round in 1 2; do
  python3 "$repo/bench/compare.py" --backends ours --out "$out/shipped-$round.json" > /dev/null 2>&1
  MEGAWINO_MAPPING="$out/retuned.json" python3 "$repo/bench/compare.py" --backends ours --out "$out/retuned-$round.json" > /dev/null 2>&1
done
python3 - "$out" <<'PY'
import json, math, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {p.stem: {r["name"]: r["backends"]["megakernel"]["median_us"] for r in json.loads(p.read_text())["layers"]}
        for p in sorted(out.glob("*-[12].json"))}
ratios = []
print(f"{'layer':22}{'shipped us':>12}{'retuned us':>12}{'ratio':>8}")
for name in runs["shipped-1"]:
    a = (runs["shipped-1"][name] + runs["shipped-2"][name]) / 2
    b = (runs["retuned-1"][name] + runs["retuned-2"][name]) / 2
    ratios.append(a / b)
    print(f"{name:22}{a:12.1f}{b:12.1f}{a / b:8.3f}")
print("geomean shipped time / retuned time:", round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 4))
PY
