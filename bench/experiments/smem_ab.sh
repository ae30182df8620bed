#!/usr/bin/env bash
# A/B of the megakernel's shared-memory size on the narrow layers: the default build against
# $AB_DEFINES (e.g. -DMW_WGMMA_STAGES=2), compare.py alternating three times each.
#   OUT=/tmp/ab AB_DEFINES="-DMW_WGMMA_STAGES=2" LAYERS=yolov3.res1,vgg16.conv1_2 bash bench/experiments/smem_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/smem-ab
for i in 1 2 3; do
  run_compare a$i "" --backends ours,nonfused --layers "$LAYERS"
  run_compare b$i "$AB_DEFINES" --backends ours,nonfused --layers "$LAYERS"
done
python3 - "$out" <<'PY'
import json, sys, pathlib, statistics
out = pathlib.Path(sys.argv[1])
runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
rows = {k: {r["name"]: r for r in doc.get("layers", [])} for k, doc in runs.items()}
names = list(rows["a1"])
print(f"{'layer':22}{'mega a':>9}{'mega b':>9}{'b/a':>7}{'nf a':>9}{'nf b':>9}{'b/a':>7}")
for n in names:
    def med(prefix, key):
        vals = []
        for k in rows:
            if k.startswith(prefix):
                r = rows[k][n]
                vals.append(r["derived"]["ours_us"] if key == "ours" else r["backends"]["nonfused"]["median_us"])
        return statistics.median(vals)
    ma, mb, na, nb = med("a", "ours"), med("b", "ours"), med("a", "nf"), med("b", "nf")
    print(f"{n:22}{ma:9.0f}{mb:9.0f}{mb / ma:7.3f}{na:9.0f}{nb:9.0f}{nb / na:7.3f}")
PY
