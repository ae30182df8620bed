set -u
repo=$(pwd)
python3 -m pip install -q --no-deps --no-build-isolation . > $OUT/install.log 2>&1 || { echo install failed; tail $OUT/install.log; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader
for v in "" "-DMW_INPUT_BAND_ROWS=0"; do
  (cd /tmp && MEGAWINO_CACHE_DIR=/tmp/mwc MEGAWINO_CUDA_DEFINES="$v" ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum -k regex:"mw_input_kernel" -c 1 python3 $repo/bench/experiments/profile_stages.py ncu --layers vgg16.conv1_2 --batch 64 --variants "" > $OUT/ncu-input${v:+-bands0}.txt 2>&1)
  echo "== ncu input ($v)"; grep -E "dram__|gpu__time|l1tex|lts__" $OUT/ncu-input${v:+-bands0}.txt
done
OUT=$OUT AB_DEFINES="-DMW_INPUT_BAND_ROWS=0" bash bench/experiments/tile_ab.sh
