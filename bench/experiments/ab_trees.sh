#!/usr/bin/env bash
# A/B of two source trees on the GPU (docs/experiments.md 33-34): bench/experiments/ab_time.py from each tree in
# turn, ROUNDS times (old, new, old, new, ...), JSON lines to stdout; then
# `python3 bench/experiments/ab_time.py --summary FILE` compares.  The old tree needs bench/experiments/ab_time.py too.
#   bash bench/experiments/ab_trees.sh OLD_DIR NEW_DIR ROUNDS [ab_time.py options] > ab.jsonl
set -eu
old=$1; new=$2; rounds=$3; shift 3
for _ in $(seq "$rounds"); do
  for tag in old new; do
    dir=$([ "$tag" = old ] && echo "$old" || echo "$new")
    (cd "$dir" && PYTHONPATH="$dir" python3 bench/experiments/ab_time.py --tag "$tag" "$@")
  done
done
