#!/usr/bin/env bash
# Re-tune chosen suite layers with a wider search and compare, in one call, the megakernel with
# the shipped table and with the shipped table plus the new entries (run from any folder).
#   OUT=/tmp/rt LAYERS=yolov3.res1,densenet161.block4 TOP=24 bash bench/experiments/retune_layers.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/retune
layers=${LAYERS:?comma-separated layer names}
for layer in ${layers//,/ }; do
  t=$SECONDS
  megawino tune "$layer" --top "${TOP:-24}" --budget "${BUDGET:-240}" --out "$out/retuned.json" > "$out/tune-$layer.log" 2>&1
  echo "== tune $layer: exit $?, $((SECONDS - t)) s"; tail -n 3 "$out/tune-$layer.log"
done
python3 - "$repo/mapping/h100.json" "$out/retuned.json" "$out/merged.json" <<'PY'
import json, sys
shipped, retuned = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for key, entry in retuned["layers"].items():
    old = shipped["layers"].get(key, {})
    print(key, entry.get("name"), "retuned", round(entry["time_us"], 1), "shipped", round(old.get("time_us", float("nan")), 1))
    shipped["layers"][key] = entry
json.dump(shipped, open(sys.argv[3], "w"), indent=1)
PY
for round in 1 2; do
  python3 "$repo/bench/compare.py" --layers "$layers" --backends ours --out "$out/shipped-$round.json" > /dev/null 2>&1
  MEGAWINO_MAPPING="$out/merged.json" python3 "$repo/bench/compare.py" --layers "$layers" --backends ours --out "$out/merged-$round.json" > /dev/null 2>&1
done
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for p in sorted(out.glob("*-[12].json")):
    doc = json.loads(p.read_text())
    print(p.stem, {r["name"]: round(r["backends"]["megakernel"]["median_us"], 1) for r in doc["layers"]})
PY
