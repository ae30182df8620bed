#!/usr/bin/env bash
# ncu's full set on one megakernel launch of each layer in $NCU_LAYERS (default
# densenet161.block4), with its SASS-level source page (warp stall samples per instruction) as
# CSV, gzipped, for reading off the device.
#   OUT=/tmp/ncu NCU_LAYERS="densenet161.block4" bash bench/experiments/ncu_source.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/ncu-source
for layer in ${NCU_LAYERS:-densenet161.block4}; do
  t=$SECONDS
  python3 "$repo/bench/experiments/megakernel_once.py" "$layer" --launches 2 > /dev/null 2>&1   # compile outside ncu
  ncu --set full --import-source no -k regex:mw_megakernel --launch-skip 3 -c 1 -f -o "$out/ncu-$layer" \
    python3 "$repo/bench/experiments/megakernel_once.py" "$layer" --launches 5 > "$out/ncu-$layer.log" 2>&1
  echo "== ncu $layer: exit $?, $((SECONDS - t)) s"
  ncu -i "$out/ncu-$layer.ncu-rep" --page details > "$out/ncu-$layer-details.txt" 2>&1
  ncu -i "$out/ncu-$layer.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$out/ncu-$layer-sass.csv.gz"
  grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per|Issued Warp|No Eligible|Hit Rate|SM Frequency" "$out/ncu-$layer-details.txt" | head -20
  rm -f "$out/ncu-$layer.ncu-rep"
done
