#!/usr/bin/env bash
set -u
repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1
source bench/experiments/device_setup.sh /tmp/call7
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider $repo/tests/test_gpu_torch.py $repo/tests/test_gpu_torch_fast.py > $out/gpu-tests.log 2>&1
echo "== torch GPU tests: exit $?, $((SECONDS - t)) s"; tail -n 2 $out/gpu-tests.log
for mode in gpu burst; do
  t=$SECONDS
  MEGAWINO_CHOICE_TIMING=$mode python3 "$repo/bench/models.py" --models resnet50,vgg16,yolov3 --batches 1,8 --json "$out/models-$mode.json" > "$out/models-$mode.log" 2>&1
  echo "== models $mode: exit $?, $((SECONDS - t)) s"
done
python3 - $out <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
for mode in ("gpu", "burst"):
    d = json.loads((out / f"models-{mode}.json").read_text())
    for r in d["rows"]:
        on = sum(v for k, v in r.get("algos", {}).items() if k not in ("pytorch", "left alone"))
        print(mode, r["model"], r["batch"], r.get("error"), "on", on, "of", sum(r.get("algos", {}).values()),
              "eager", round(r.get("speedup_vs_fp32") or 0, 3), round(r.get("speedup_vs_tf32") or 0, 3),
              "graph", round(r.get("graph_speedup_vs_fp32") or 0, 3), round(r.get("graph_speedup_vs_tf32") or 0, 3),
              "ms", r.get("megawino_graph_ms") and round(r["megawino_graph_ms"], 3), r.get("pytorch_fp32_graph_ms") and round(r["pytorch_fp32_graph_ms"], 3),
              r.get("graph_bits_equal_eager", {}).get("megawino"), r.get("rel_l2_graph", {}).get("megawino"))
PY
