#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-deps --no-build-isolation . > /dev/null 2>&1
bash bench/experiments/final_tree.sh
