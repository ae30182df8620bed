repo=$PWD; cd /tmp; export MEGAWINO_CACHE_DIR=/tmp/mwc PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation $repo >/dev/null 2>&1
ncu --set full --import-source yes -k regex:mw_gemm_kernel -c 1 -o $OUT/gemm python3 $repo/bench/run_layer.py vgg16.conv4_2 --algo nonfused --runs 1 --gemm-math bf16x3 > $OUT/ncu.log 2>&1; echo "ncu rc=$?"
ncu -i $OUT/gemm.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i $OUT/gemm.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv 2>&1
grep -E "Duration|Throughput|Issue Slots|Eligible|Active Warps|No Eligible|Registers|Stall|L2 Hit|Bank" $OUT/details.txt | head -40
python3 - $OUT/sass.csv <<'PY'
import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[0]; print(hdr[:12])
# find sampling column
idx=[i for i,h in enumerate(hdr) if 'Warp Stall Sampling (All' in h]
src=[i for i,h in enumerate(hdr) if h=='Source']
if idx and src:
    i=idx[0]; s=src[0]
    data=[(float(r[i] or 0), r[s]) for r in rows[1:] if len(r)>i]
    tot=sum(d[0] for d in data)
    for v,t in sorted(data,reverse=True)[:25]: print(f"{100*v/tot:5.1f}% {t}")
PY
