#!/usr/bin/env bash
# A/B of two versions of the CUDA sources on one installed megawino: compare.py (megakernel,
# non-fused and the GEMM stage) alternating the installed cuda/ files and those of $B_SOURCES (a
# folder of .cu/.cuh files that replace the installed ones for the b runs), twice each; the
# kernel cache keys on the sources' hash, so each version compiles once.  An older revision's
# sources, into an untracked folder of the checkout so that they travel to the GPU machine:
#   mkdir -p bench/experiments/b_cuda && git archive REV cuda | tar x --strip-components=1 -C bench/experiments/b_cuda
#   OUT=/tmp/ab B_SOURCES=$PWD/bench/experiments/b_cuda bash bench/experiments/source_ab.sh
# AB_ARGS replaces the compare.py options (default: --backends ours,nonfused,gemm), e.g.
#   AB_ARGS="--backends ours --layers yolov3.res1,yolov3.res2"; AB_ROUNDS the alternations (2).
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/source-ab
installed=$(python3 -c "from megawino.core.resources import cuda_dir; print(cuda_dir())")
saved="$out/a-sources"
mkdir -p "$saved" && cp "$installed"/*.cu* "$saved"/
use() { cp "$1"/*.cu* "$installed"/; }
rounds=${AB_ROUNDS:-2}
for i in $(seq "$rounds"); do
  use "$saved"; run_compare a$i "" ${AB_ARGS:---backends ours,nonfused,gemm}
  use "$B_SOURCES"; run_compare b$i "" ${AB_ARGS:---backends ours,nonfused,gemm}
done
use "$saved"
python3 - "$out" "$rounds" <<'PY'
import json, math, sys, pathlib
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
rows = {p.stem: {r["name"]: r["backends"] for r in json.loads(p.read_text()).get("layers", [])}
        for p in sorted(out.glob("*.json"))}
def us(k, n, b): return (rows[k][n].get(b) or {}).get("median_us") or float("nan")
backends = [b for b in ("megakernel", "nonfused", "gemm_ours") if any(b in r for r in rows["a1"].values())]
print(f"{'layer':22}" + "".join(f"{b[:9] + ' ' + k:>15}" for b in backends for k in ("a", "b", "b/a")))
ratios = {b: [] for b in backends}
for n in rows["a1"]:
    cells = []
    for b in ratios:
        a = sum(us(f"a{i}", n, b) for i in range(1, rounds + 1)) / rounds
        bb = sum(us(f"b{i}", n, b) for i in range(1, rounds + 1)) / rounds
        ratios[b].append(bb / a)
        cells += [f"{a:15.0f}", f"{bb:15.0f}", f"{bb / a:15.3f}"]
    print(f"{n:22}" + "".join(cells))
print("geomean time b / a:", {b: round(math.exp(sum(map(math.log, r)) / len(r)), 3) for b, r in ratios.items()})
PY
