#!/usr/bin/env bash
# A/B/C... of builds of one installed tree: compare.py's megakernel column for each build in
# $VARIANTS ("name=-DX=1 -DY=2;name2=..."; the first is the reference, "" its defines for the
# default build), $AB_ROUNDS alternations (3), then each variant's time over the first's, per layer.
#   OUT=/tmp/ab VARIANTS="new=;old=-DMW_X=0" AB_ARGS="--layers a,b" bash bench/experiments/defines_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/defines-ab
IFS=';' read -ra variants <<< "$VARIANTS"
for i in $(seq "${AB_ROUNDS:-3}"); do
  for v in "${variants[@]}"; do run_compare "${v%%=*}.$i" "${v#*=}" --backends ours ${AB_ARGS:-}; done
done
python3 - "$out" "${variants[@]%%=*}" <<'PY'
import json, math, statistics, sys, pathlib
out, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
times = {}
for p in sorted(out.glob("*.json")):
    name = p.stem.rsplit(".", 1)[0]
    for r in json.loads(p.read_text()).get("layers", []):
        times.setdefault(name, {}).setdefault(r["name"], []).append(r["backends"]["megakernel"]["median_us"])
ref = names[0]
print(f"{'layer':22}" + "".join(f"{n[:10]:>11}" for n in names) + "".join(f"{n[:9] + '/' + ref[:4]:>15}" for n in names[1:]))
ratios = {n: [] for n in names[1:]}
for layer, ref_times in times[ref].items():
    med = {n: statistics.median(times[n][layer]) for n in names}
    for n in ratios: ratios[n].append(med[n] / med[ref])
    print(f"{layer:22}" + "".join(f"{med[n]:11.1f}" for n in names) + "".join(f"{med[n] / med[ref]:15.3f}" for n in ratios))
print("geomean time / " + ref + ":", {n: round(math.exp(sum(map(math.log, r)) / len(r)), 4) for n, r in ratios.items()})
PY
