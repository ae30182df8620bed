#!/usr/bin/env bash
# A/B of the megakernel's exit protocol on small layers: small_layer_probe.py (warm timelines and
# event times) and compare.py on the small suite layers, alternating the default build and
# $AB_DEFINES (default -DMW_EXIT_LEAN=0) twice; then the watchdog tests of the default build.
#   OUT=/tmp/exit-ab bash bench/experiments/exit_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/exit-ab
ab="${AB_DEFINES:--DMW_EXIT_LEAN=0}"
layers="densenet161.block4,densenet161.block3,resnet50.conv5_x,resnet50.conv4_x"
for i in 1 2; do
  for v in a b; do
    defines=""; [ "$v" = b ] && defines="$ab"
    t=$SECONDS
    MEGAWINO_CUDA_DEFINES="$defines" python3 "$repo/bench/experiments/small_layer_probe.py" \
      --json "$out/probe-$v$i.json" > "$out/probe-$v$i.log" 2>&1
    echo "== probe $v$i ($defines): exit $?, $((SECONDS - t)) s"; cat "$out/probe-$v$i.log"
    run_compare "$v$i" "$defines" --backends ours,nonfused --layers "$layers"
  done
done
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider -k "watchdog or soak or fired" "$repo/tests" > "$out/tests.log" 2>&1
echo "== watchdog tests: exit $?, $((SECONDS - t)) s"; tail -n 4 "$out/tests.log"
python3 - "$out" <<'PY'
import json, sys, pathlib, statistics
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("[ab][12].json"))}
rows = {k: {r["name"]: r for r in doc.get("layers", [])} for k, doc in runs.items()}
print(f"{'layer':22}{'mega a':>9}{'mega b':>9}{'b/a':>7}{'nf a':>9}{'nf b':>9}")
for n in rows.get("a1", {}):
    def med(prefix, key):
        vals = [rows[k][n]["derived"]["ours_us"] if key == "ours" else rows[k][n]["backends"]["nonfused"]["median_us"]
                for k in rows if k.startswith(prefix)]
        return statistics.median(vals)
    ma, mb, na, nb = med("a", "ours"), med("b", "ours"), med("a", "nf"), med("b", "nf")
    print(f"{n:22}{ma:9.1f}{mb:9.1f}{mb / ma:7.3f}{na:9.1f}{nb:9.1f}")
PY
