#!/usr/bin/env bash
# small_layer_probe.py on the default build and on each build of $VARIANTS (';'-separated -D
# option sets), one after another; each probe's table is printed.
#   OUT=/tmp/pv VARIANTS="-DMW_WGMMA_STAGES=2;-DMW_GEMM_SMEM_BY_K_TILES=0" bash bench/experiments/probe_variants.sh
set -u
source "$(dirname "$0")/device_setup.sh" /tmp/probe-variants
IFS=';' read -ra sets <<< "$VARIANTS"
i=0
for defines in "" "${sets[@]}"; do
  t=$SECONDS
  MEGAWINO_CUDA_DEFINES="$defines" python3 "$repo/bench/experiments/small_layer_probe.py" \
    --json "$out/probe-$i.json" > "$out/probe-$i.log" 2>&1
  echo "== probe $i ($defines): exit $?, $((SECONDS - t)) s"; tail -n 5 "$out/probe-$i.log"
  i=$((i + 1))
done
