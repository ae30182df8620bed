#!/usr/bin/env bash
set -u
repo=$PWD
source bench/experiments/device_setup.sh /tmp/call2
python3 -m pip install -q --no-deps --no-build-isolation "$repo" > /dev/null 2>&1
for lay in NHWC NCHW NHWC; do
  t=$SECONDS
  python3 $repo/bench/compare.py --layout $lay --backends ours,prepared,cudnn_tf32 --out $out/$lay.$SECONDS.json > $out/$lay.$SECONDS.log 2>&1
  echo "== $lay rc $? $((SECONDS-t)) s"
done
python3 - $out <<'PY'
import json, sys, pathlib, math
out = pathlib.Path(sys.argv[1])
runs = {}
for p in sorted(out.glob("*.json")):
    runs.setdefault(p.name.split(".")[0], []).append(json.loads(p.read_text()))
def t(r, b): return r["backends"][b]["median_us"]
names = [r["name"] for r in runs["NCHW"][0]["layers"]]
g = {k: [] for k in ("nchw", "nhwc", "best")}
for i, n in enumerate(names):
    nc = t(runs["NCHW"][0]["layers"][i], "megakernel")
    nh = min(t(R["layers"][i], "megakernel") for R in runs["NHWC"])
    tf = min(min(t(R["layers"][i], b) for b in ("cudnn_tf32_nchw", "cudnn_tf32_nhwc")) for R in runs["NHWC"] + runs["NCHW"])
    ok = all(R["layers"][i]["backends"]["megakernel"].get("correct") for R in runs["NHWC"])
    err = max(R["layers"][i]["backends"]["megakernel"].get("rel_err_vs_f64") or 0 for R in runs["NHWC"])
    g["nchw"].append(tf / nc); g["nhwc"].append(tf / nh); g["best"].append(tf / min(nc, nh))
    print(f"{n:22} NCHW {nc:8.1f} NHWC {nh:8.1f} nhwc/nchw {nh/nc:6.3f} TF32 {tf:8.1f} ratio nchw {tf/nc:.3f} nhwc {tf/nh:.3f} ok {ok} err {err:.2e}")
print({k: round(math.exp(sum(map(math.log, v)) / len(v)), 4) for k, v in g.items()})
PY
