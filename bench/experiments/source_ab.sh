#!/usr/bin/env bash
# A/B of two versions of the CUDA sources on one installed megawino: compare.py (megakernel,
# non-fused and the GEMM stage) alternating the installed cuda/ files and those of $B_SOURCES (a
# folder of .cu/.cuh files that replace the installed ones for the b runs), twice each; the
# kernel cache keys on the sources' hash, so each version compiles once.  An older revision's
# sources, into an untracked folder of the checkout so that they travel to the GPU machine:
#   mkdir -p bench/experiments/b_cuda && git archive REV cuda | tar x --strip-components=1 -C bench/experiments/b_cuda
#   OUT=/tmp/ab B_SOURCES=$PWD/bench/experiments/b_cuda bash bench/experiments/source_ab.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/source-ab
installed=$(python3 -c "from megawino.core.resources import cuda_dir; print(cuda_dir())")
saved="$out/a-sources"
mkdir -p "$saved" && cp "$installed"/*.cu* "$saved"/
use() { cp "$1"/*.cu* "$installed"/; }
for i in 1 2; do
  use "$saved"; run_compare a$i "" --backends ours,nonfused,gemm
  use "$B_SOURCES"; run_compare b$i "" --backends ours,nonfused,gemm
done
use "$saved"
python3 - "$out" <<'PY'
import json, math, sys, pathlib
out = pathlib.Path(sys.argv[1])
rows = {p.stem: {r["name"]: r["backends"] for r in json.loads(p.read_text()).get("layers", [])}
        for p in sorted(out.glob("*.json"))}
def us(k, n, b): return (rows[k][n].get(b) or {}).get("median_us") or float("nan")
print(f"{'layer':22}" + "".join(f"{b[:9] + ' ' + k:>15}" for b in ("megakernel", "nonfused", "gemm_ours") for k in ("a", "b", "b/a")))
ratios = {b: [] for b in ("megakernel", "nonfused", "gemm_ours")}
for n in rows["a1"]:
    cells = []
    for b in ratios:
        a = (us("a1", n, b) + us("a2", n, b)) / 2
        bb = (us("b1", n, b) + us("b2", n, b)) / 2
        ratios[b].append(bb / a)
        cells += [f"{a:15.0f}", f"{bb:15.0f}", f"{bb / a:15.3f}"]
    print(f"{n:22}" + "".join(cells))
print("geomean time b / a:", {b: round(math.exp(sum(map(math.log, r)) / len(r)), 3) for b, r in ratios.items()})
PY
