"""Direct convolution for every filter size up to 15x15 and any stride (the non-Winograd path).

Implicit GEMM: M = N*OH*OW output pixels, N = K output channels, reduction over
(c, r, s) (NCHW) or (r, s, c) (NHWC).  The kernel (``cuda/direct_conv.cuh``) gathers
the input through a per-layer table of offsets and tap bits, so padding, stride,
partial tiles and any C, K, H, W need no divisibility; filters are packed once per call into a
zero-padded ``[roundup(CRS, 16)][roundup(K, 128)]`` matrix so that filter loads
are aligned float4.

The package, by responsibility:

* :mod:`.config`: :class:`DirectConfig` (the tile parameters: block tile BM x BN x BK,
  register tile TM x TN, ``min_blocks`` of ``__launch_bounds__``), :class:`Hardware`,
  the parameter space (:func:`candidate_configs`) and the resource filter
  (:func:`resource_ok`: threads, registers, shared memory, no spills; registers from
  ptxas reports of every config in the space, compiled for sm_90, kept in
  ``mapping/direct_ptxas_sm90.json``);
* :mod:`.model`: a DeepCuts-style performance model (:func:`predict_us`): issue-bound
  FFMA efficiency of the register tile, global-load latency against the work per
  k-tile, shared-memory wavefronts, DRAM and L2 bytes given the tiling, and wave
  quantisation / SM imbalance;  :func:`rank` orders candidates by it;
  :func:`heuristic_config`: the tuned entry of ``mapping/direct_<gpu>.json`` when
  there is one, else the model's best (no tuning step needed);
* :mod:`.kernel`: :func:`conv2d_direct`: validation, compile (NVRTC via CuPy, cached
  per config and source hash) and launch; the gather table and filter packing;
* :mod:`.emulate`: :func:`emulate_direct`, a NumPy emulation of the kernel's index
  math, thread by thread (tests run it on CPU against the float64 reference);
* :mod:`.ptxas`: the ptxas reports and ``python -m megawino.direct --ptxas``, which
  rewrites the register table;
* the tuner, which measures the model's top configs on the GPU and writes the user's
  ``direct_<gpu>.json``, is :mod:`megawino.tuning.direct` (``python -m megawino.tuning.direct``).

Nothing here touches CUDA at import time.
"""
from __future__ import annotations

from . import config as _config, kernel as _kernel, model as _model, ptxas as _ptxas
from .config import (DEFAULT_CONFIG, GRID, H100, INT32_LIMIT, DirectConfig, Hardware, all_configs,
                     candidate_configs, estimate_registers, occupancy, resource_ok, structural_ok)
from .emulate import emulate_direct
from .kernel import (build_table, check_spec, compile_kernel, conv2d_direct, launch, outside_taps,
                     pack_weights, tap_bits)
from .model import (gpu_slug, heuristic_config, load_mapping, mapping_key, model_terms, predict_us,
                    rank)

__all__ = [
    "DirectConfig", "Hardware", "H100", "GRID", "DEFAULT_CONFIG",
    "structural_ok", "estimate_registers", "resource_ok", "occupancy", "candidate_configs",
    "predict_us", "rank", "heuristic_config", "load_mapping", "gpu_slug",
    "build_table", "check_spec", "tap_bits", "outside_taps", "pack_weights", "emulate_direct", "conv2d_direct", "compile_kernel",
    "INT32_LIMIT", "model_terms", "all_configs", "mapping_key", "launch",
]

# Also reachable as megawino.direct.<name>, the names tests, megawino.tuning.direct and bench use.
ptxas_report = _ptxas.ptxas_report
FLUSH_TERMS, FLUSH_MIN_CRS = _config.FLUSH_TERMS, _config.FLUSH_MIN_CRS
TAP_COL_BIT, TAP_SENTINEL, MAX_FILTER = _config.TAP_COL_BIT, _config.TAP_SENTINEL, _config.MAX_FILTER
PACK_ROWS, PACK_COLS = _config.PACK_ROWS, _config.PACK_COLS
flush_terms = _config.flush_terms
_ptxas_key = _config._ptxas_key
_load_mapping_cached = _model._load_mapping_cached
_device_table = _kernel._device_table
_current_gpu = _kernel._current_gpu


def __getattr__(name: str):
    # The ptxas table lives in mapping/direct_ptxas_sm90.json, read on first use.
    if name == "_PTXAS_SM90":
        return _config.ptxas_table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
