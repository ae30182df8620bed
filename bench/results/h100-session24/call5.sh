#!/usr/bin/env bash
set -u
repo=$PWD
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1
source bench/experiments/device_setup.sh /tmp/call5
t=$SECONDS
python3 -m pytest -q -m gpu -p no:cacheprovider $repo/tests/test_gemm_output.py $repo/tests/test_gpu_torch.py $repo/tests/test_gpu_torch_fast.py $repo/tests/test_gpu_pointwise.py > $out/gpu-tests.log 2>&1
echo "== GPU tests: exit $?, $((SECONDS - t)) s"; tail -n 3 $out/gpu-tests.log
t=$SECONDS
python3 "$repo/bench/models.py" --json "$out/h100-models.json" > "$out/models.log" 2>&1
echo "== models: exit $?, $((SECONDS - t)) s"
python3 - $out/h100-models.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(r["model"], r["batch"], r.get("error"), r.get("pytorch_fp32_ms"), r.get("pytorch_tf32_ms"), r.get("megawino_ms"), r.get("speedup_vs_fp32"), r.get("speedup_vs_tf32"))
PY
