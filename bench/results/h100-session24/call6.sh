#!/usr/bin/env bash
set -u
repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1
source bench/experiments/device_setup.sh /tmp/call6
t=$SECONDS
python3 "$repo/bench/models.py" --json "$out/h100-models.json" > "$out/models.log" 2>&1
echo "== models: exit $?, $((SECONDS - t)) s"
python3 - $out/h100-models.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    g = {k: round(r[k], 3) for k in ("pytorch_fp32_graph_ms", "pytorch_tf32_graph_ms", "megawino_graph_ms", "graph_speedup_vs_fp32", "graph_speedup_vs_tf32") if r.get(k)}
    print(r["model"], r["batch"], r.get("error"), round(r.get("speedup_vs_fp32") or 0, 3), round(r.get("speedup_vs_tf32") or 0, 3), g, r.get("graph_errors"), r.get("graph_bits_equal_eager"), r.get("rel_l2_graph"))
PY
