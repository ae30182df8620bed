# Sourced by the device scripts of bench/experiments: sets $repo (this checkout) and $out ($OUT, else
# the folder given), points the kernel cache into $out and moves to /tmp, so that the installed
# megawino runs, not the checkout's (whose cuda/ folder would shadow CUDA's Python package).
#   source "$(dirname "$0")/device_setup.sh" /tmp/default-out
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${OUT:-$1}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MEGAWINO_CACHE_DIR="$out/cache"
cd /tmp
