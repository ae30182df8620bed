# ncu of the non-fused BF16x3 GEMM kernel on vgg16.conv4_2 (details + SASS stall / sector table):
#   bash bench/experiments/ncu_gemm_bf16x3.sh   (from the checkout root, on the GPU machine)
repo=$PWD; cd /tmp; export MEGAWINO_CACHE_DIR=/tmp/mwc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation $repo >/dev/null 2>&1
ncu --set full --import-source yes -k regex:mw_gemm_kernel -c 1 -o $OUT/gemm python3 $repo/bench/run_layer.py vgg16.conv4_2 --algo nonfused --runs 1 --gemm-math bf16x3 > $OUT/ncu.log 2>&1; echo "ncu rc=$?"
ncu -i $OUT/gemm.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i $OUT/gemm.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>&1
grep -E "Duration|Throughput|Issue Slots|Eligible|Active Warps|No Eligible|Registers|Stall|L2 Hit|Bank" $OUT/details.txt | head -40
python3 - "$OUT/sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
rows = rows[next(i for i, r in enumerate(rows) if "Source" in r):]   # after ncu's "Kernel Name" line
col = {name: i for i, name in enumerate(rows[0])}
def value(r, name):
    try:
        return float(r[col[name]])
    except (ValueError, IndexError):
        return 0.0
data = rows[1:]
total = sum(value(r, "Warp Stall Sampling (All Samples)") for r in data) or 1.0
print("top stall sites (share of warp samples):")
for r in sorted(data, key=lambda r: -value(r, "Warp Stall Sampling (All Samples)"))[:15]:
    print(f"{100 * value(r, 'Warp Stall Sampling (All Samples)') / total:5.1f}% {r[col['Source']].strip()[:80]}")
print("global sectors per instruction (actual / ideal):")
for r in sorted(data, key=lambda r: -value(r, "L2 Theoretical Sectors Global"))[:8]:
    n = value(r, "Instructions Executed") or 1.0
    print(f"{value(r, 'L2 Theoretical Sectors Global') / n:5.1f} / {value(r, 'L2 Theoretical Sectors Global Ideal') / n:5.1f} "
          f"{r[col['Source']].strip()[:80]}")
PY
