"""Direct convolution for every filter size and stride (the non-Winograd path).

Implicit GEMM: M = N*OH*OW output pixels, N = K output channels, reduction over
(c, r, s) (NCHW) or (r, s, c) (NHWC).  The kernel (``cuda/direct_conv.cuh``) gathers
the input through a per-layer offset table, so padding, stride, partial tiles
and any C, K, H, W need no divisibility; filters are packed once per call into a
zero-padded ``[roundup(CRS, 16)][roundup(K, 128)]`` matrix so that filter loads
are aligned float4.

This module holds

* :class:`DirectConfig`: the tile parameters (block tile BM x BN x BK, register
  tile TM x TN, ``min_blocks`` of ``__launch_bounds__``), compile-time constants;
* the parameter space (:func:`candidate_configs`) and the resource filter
  (:func:`resource_ok`: threads, registers, shared memory, no spills; registers
  from ptxas reports of every config in the space, compiled for sm_90);
* a DeepCuts-style performance model (:func:`predict_us`): issue-bound FFMA
  efficiency of the register tile, global-load latency against the work per
  k-tile, shared-memory wavefronts, DRAM and L2 bytes given the tiling, and wave
  quantisation / SM imbalance;  :func:`rank` orders candidates by it;
* :func:`heuristic_config`: the tuned entry of ``mapping/direct_<gpu>.json``
  when there is one, else the model's best (no tuning step needed);
* :func:`conv2d_direct`: validation, compile (NVRTC via CuPy, cached per config
  and source hash) and launch;
* :func:`emulate_direct`: a NumPy emulation of the kernel's index math, thread
  by thread (tests run it on CPU against the float64 reference).

Nothing here touches CUDA at import time.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import re
import threading

import numpy as np

from .resources import cuda_dir, mapping_dir, source_hash
from .spec import LayerSpec

__all__ = [
    "DirectConfig", "Hardware", "H100", "GRID", "DEFAULT_CONFIG",
    "structural_ok", "estimate_registers", "resource_ok", "occupancy", "candidate_configs",
    "predict_us", "rank", "heuristic_config", "load_mapping", "gpu_slug",
    "build_table", "pack_weights", "emulate_direct", "conv2d_direct", "compile_kernel",
    "INT32_LIMIT", "model_terms", "all_configs", "mapping_key", "launch",
]

BIG = 1 << 28            # MW_DIRECT_BIG in direct_conv.cuh
INT32_LIMIT = 2**31 - 2**24   # element count limit of x and y (32-bit offsets in the kernel)
PACK_ROWS = 16           # CRS is padded to a multiple of this (every BK divides it)
PACK_COLS = 128          # K is padded to a multiple of this (every BN divides it)
FLUSH_TERMS = 256        # reduction terms per partial sum when flushing (MW_DIRECT_FLUSH_TERMS)
FLUSH_MIN_CRS = 1024     # flush only when C*R*S exceeds this


def flush_terms(spec: LayerSpec) -> int:
    """MW_DIRECT_FLUSH_TERMS for a layer.  One float32 FMA chain of n terms has a
    relative L2 error near 2^-24 * sqrt(n / 2) (about 6e-7 at n = 1024, 2e-6 at
    14700); above FLUSH_MIN_CRS the kernel sums chunks of FLUSH_TERMS and adds the
    chunk sums into y (about 3e-7 at any n)."""
    return FLUSH_TERMS if spec.C * spec.R * spec.S > FLUSH_MIN_CRS else 0


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, order=True)
class DirectConfig:
    """Tile parameters of one compiled direct kernel."""

    BM: int = 128         # output pixels per block
    BN: int = 128         # output channels per block
    BK: int = 8           # reduction slab per pipeline stage
    TM: int = 8           # pixels per thread (multiple of 4)
    TN: int = 8           # channels per thread (multiple of 4)
    min_blocks: int = 1   # __launch_bounds__ min blocks per SM (caps registers)

    @property
    def TX(self) -> int:
        return self.BM // self.TM

    @property
    def TY(self) -> int:
        return self.BN // self.TN

    @property
    def threads(self) -> int:
        return self.TX * self.TY

    @property
    def a_per(self) -> int:
        return -(-(self.BM * self.BK) // self.threads)

    @property
    def b_per(self) -> int:
        return -(-(self.BN * self.BK // 4) // self.threads)

    def smem_bytes(self, nhwc: bool = False) -> int:
        """Static shared memory, as in ``Tile::SMEM_BYTES``."""
        return 2 * self.BK * ((self.BM + 4) + (self.BN + 4)) * 4 + (self.BM * 16 if nhwc else 0)

    @property
    def key(self) -> str:
        return (f"bm{self.BM}bn{self.BN}bk{self.BK}tm{self.TM}tn{self.TN}"
                f"mb{self.min_blocks}")

    @classmethod
    def from_key(cls, key: str) -> "DirectConfig":
        m = re.fullmatch(r"bm(\d+)bn(\d+)bk(\d+)tm(\d+)tn(\d+)mb(\d+)", key)
        if not m:
            raise ValueError(f"not a direct config key: {key!r}")
        return cls(*map(int, m.groups()))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DirectConfig":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in fields})

    def defines(self, nhwc: bool, flush: int = 0) -> tuple[str, ...]:
        return (f"-DMW_DIRECT_FLUSH_TERMS={int(flush)}", f"-DMW_DIRECT_BM={self.BM}", f"-DMW_DIRECT_BN={self.BN}",
                f"-DMW_DIRECT_BK={self.BK}", f"-DMW_DIRECT_TM={self.TM}",
                f"-DMW_DIRECT_TN={self.TN}", f"-DMW_DIRECT_NHWC={int(bool(nhwc))}",
                f"-DMW_DIRECT_MINBLOCKS={self.min_blocks}")


GRID = {"BM": (32, 64, 128), "BN": (32, 64, 128), "BK": (8, 16), "TM": (4, 8), "TN": (4, 8),
        "min_blocks": (1, 2)}

DEFAULT_CONFIG = DirectConfig(128, 128, 8, 8, 8, 2)


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What the model and the resource filter know of the GPU."""

    name: str = "h100"
    sms: int = 132
    clock_hz: float = 1.755e9
    ffma_lanes: int = 128            # FP32 lanes per SM (4 schedulers x 32)
    issue_per_clk: int = 4           # warp instructions per clock per SM
    regs_per_sm: int = 65536
    regs_per_thread: int = 255
    smem_per_sm: int = 228 * 1024
    smem_static_per_block: int = 48 * 1024
    smem_reserved_per_block: int = 1024
    threads_per_sm: int = 2048
    threads_per_block: int = 1024
    blocks_per_sm: int = 32
    dram_bw: float = 2.97e12         # bytes/s, measured copy
    l2_bw: float = 5.5e12            # bytes/s, L2 -> SMs
    l2_bytes: int = 50 * 2**20
    smem_bytes_per_clk: int = 128    # per SM
    global_latency_clk: int = 900
    smem_latency_clk: int = 32
    launch_us: float = 3.0


H100 = Hardware()


def structural_ok(cfg: DirectConfig, nhwc: bool = False) -> bool:
    """The static_asserts of ``Tile`` in direct_conv.cuh."""
    BM, BN, BK, TM, TN = cfg.BM, cfg.BN, cfg.BK, cfg.TM, cfg.TN
    if min(BM, BN, BK, TM, TN) < 1 or cfg.min_blocks < 1:
        return False
    if BM % TM or BN % TN or TM % 4 or TN % 4 or BM % 4 or BN % 4:
        return False
    if BN > PACK_COLS or PACK_COLS % BN or BK > PACK_ROWS or PACK_ROWS % BK:
        return False
    t = cfg.threads
    if t % 32 or t > 1024:
        return False
    if nhwc:
        return t % BK == 0
    return t % BM == 0 and (BM * BK) % t == 0


# ptxas (nvcc 13.0, -arch=sm_90) on cuda/direct.cu for every structurally valid
# config of GRID, both layouts, with and without the flush ("f" suffix):
# key -> (registers, spill bytes (stack + stores + loads), static smem bytes).  Regenerate with ``python -m megawino.direct --ptxas``.
_PTXAS_SM90: dict[str, tuple[int, int, int]] = {
    "bm32bn32bk8tm4tn4mb1nchw": (89, 0, 4608),
    "bm32bn32bk8tm4tn4mb1nchwf": (91, 0, 4608),
    "bm32bn32bk8tm4tn4mb1nhwc": (104, 0, 5120),
    "bm32bn32bk8tm4tn4mb1nhwcf": (98, 0, 5120),
    "bm32bn32bk8tm4tn8mb1nchw": (127, 0, 4608),
    "bm32bn32bk8tm4tn8mb1nchwf": (127, 0, 4608),
    "bm32bn32bk8tm4tn8mb1nhwc": (156, 0, 5120),
    "bm32bn32bk8tm4tn8mb1nhwcf": (136, 0, 5120),
    "bm32bn32bk8tm8tn4mb1nchw": (129, 0, 4608),
    "bm32bn32bk8tm8tn4mb1nchwf": (127, 0, 4608),
    "bm32bn32bk8tm8tn4mb1nhwc": (156, 0, 5120),
    "bm32bn32bk8tm8tn4mb1nhwcf": (138, 0, 5120),
    "bm32bn32bk16tm4tn4mb1nchw": (119, 0, 9216),
    "bm32bn32bk16tm4tn4mb1nchwf": (108, 0, 9216),
    "bm32bn32bk16tm4tn4mb1nhwc": (143, 0, 9728),
    "bm32bn32bk16tm4tn4mb1nhwcf": (123, 0, 9728),
    "bm32bn32bk16tm4tn8mb1nchw": (205, 0, 9216),
    "bm32bn32bk16tm4tn8mb1nchwf": (181, 0, 9216),
    "bm32bn32bk16tm4tn8mb1nhwc": (222, 0, 9728),
    "bm32bn32bk16tm4tn8mb1nhwcf": (199, 0, 9728),
    "bm32bn32bk16tm8tn4mb1nchw": (211, 0, 9216),
    "bm32bn32bk16tm8tn4mb1nchwf": (183, 0, 9216),
    "bm32bn32bk16tm8tn4mb1nhwc": (224, 0, 9728),
    "bm32bn32bk16tm8tn4mb1nhwcf": (201, 0, 9728),
    "bm32bn64bk8tm4tn4mb1nchw": (79, 0, 6656),
    "bm32bn64bk8tm4tn4mb1nchwf": (91, 0, 6656),
    "bm32bn64bk8tm4tn4mb1nhwc": (80, 0, 7168),
    "bm32bn64bk8tm4tn4mb1nhwcf": (79, 0, 7168),
    "bm32bn64bk8tm4tn8mb1nchw": (113, 0, 6656),
    "bm32bn64bk8tm4tn8mb1nchwf": (117, 0, 6656),
    "bm32bn64bk8tm4tn8mb1nhwc": (115, 0, 7168),
    "bm32bn64bk8tm4tn8mb1nhwcf": (107, 0, 7168),
    "bm32bn64bk8tm8tn4mb1nchw": (117, 0, 6656),
    "bm32bn64bk8tm8tn4mb1nchwf": (121, 0, 6656),
    "bm32bn64bk8tm8tn4mb1nhwc": (119, 0, 7168),
    "bm32bn64bk8tm8tn4mb1nhwcf": (111, 0, 7168),
    "bm32bn64bk8tm8tn8mb1nchw": (185, 0, 6656),
    "bm32bn64bk8tm8tn8mb1nchwf": (205, 0, 6656),
    "bm32bn64bk8tm8tn8mb1nhwc": (217, 0, 7168),
    "bm32bn64bk8tm8tn8mb1nhwcf": (203, 0, 7168),
    "bm32bn64bk16tm4tn4mb1nchw": (95, 0, 13312),
    "bm32bn64bk16tm4tn4mb1nchwf": (96, 0, 13312),
    "bm32bn64bk16tm4tn4mb1nhwc": (93, 0, 13824),
    "bm32bn64bk16tm4tn4mb1nhwcf": (89, 0, 13824),
    "bm32bn64bk16tm4tn8mb1nchw": (149, 0, 13312),
    "bm32bn64bk16tm4tn8mb1nchwf": (147, 0, 13312),
    "bm32bn64bk16tm4tn8mb1nhwc": (153, 0, 13824),
    "bm32bn64bk16tm4tn8mb1nhwcf": (138, 0, 13824),
    "bm32bn64bk16tm8tn4mb1nchw": (153, 0, 13312),
    "bm32bn64bk16tm8tn4mb1nchwf": (149, 0, 13312),
    "bm32bn64bk16tm8tn4mb1nhwc": (151, 0, 13824),
    "bm32bn64bk16tm8tn4mb1nhwcf": (139, 0, 13824),
    "bm32bn64bk16tm8tn8mb1nchw": (255, 0, 13312),
    "bm32bn64bk16tm8tn8mb1nchwf": (255, 0, 13312),
    "bm32bn64bk16tm8tn8mb1nhwc": (254, 0, 13824),
    "bm32bn64bk16tm8tn8mb1nhwcf": (239, 0, 13824),
    "bm32bn128bk8tm4tn4mb1nchw": (72, 0, 10752),
    "bm32bn128bk8tm4tn4mb1nchwf": (77, 0, 10752),
    "bm32bn128bk8tm4tn4mb1nhwc": (71, 0, 11264),
    "bm32bn128bk8tm4tn4mb1nhwcf": (71, 0, 11264),
    "bm32bn128bk8tm4tn4mb2nchw": (72, 0, 10752),
    "bm32bn128bk8tm4tn4mb2nchwf": (77, 0, 10752),
    "bm32bn128bk8tm4tn4mb2nhwc": (71, 0, 11264),
    "bm32bn128bk8tm4tn4mb2nhwcf": (71, 0, 11264),
    "bm32bn128bk8tm4tn8mb1nchw": (95, 0, 10752),
    "bm32bn128bk8tm4tn8mb1nchwf": (105, 0, 10752),
    "bm32bn128bk8tm4tn8mb1nhwc": (96, 0, 11264),
    "bm32bn128bk8tm4tn8mb1nhwcf": (103, 0, 11264),
    "bm32bn128bk8tm8tn4mb1nchw": (96, 0, 10752),
    "bm32bn128bk8tm8tn4mb1nchwf": (109, 0, 10752),
    "bm32bn128bk8tm8tn4mb1nhwc": (107, 0, 11264),
    "bm32bn128bk8tm8tn4mb1nhwcf": (107, 0, 11264),
    "bm32bn128bk8tm8tn8mb1nchw": (157, 0, 10752),
    "bm32bn128bk8tm8tn8mb1nchwf": (161, 0, 10752),
    "bm32bn128bk8tm8tn8mb1nhwc": (183, 0, 11264),
    "bm32bn128bk8tm8tn8mb1nhwcf": (164, 0, 11264),
    "bm32bn128bk16tm4tn4mb1nchw": (87, 0, 21504),
    "bm32bn128bk16tm4tn4mb1nchwf": (87, 0, 21504),
    "bm32bn128bk16tm4tn4mb1nhwc": (89, 0, 22016),
    "bm32bn128bk16tm4tn4mb1nhwcf": (87, 0, 22016),
    "bm32bn128bk16tm4tn4mb2nchw": (87, 0, 21504),
    "bm32bn128bk16tm4tn4mb2nchwf": (87, 0, 21504),
    "bm32bn128bk16tm4tn4mb2nhwc": (89, 0, 22016),
    "bm32bn128bk16tm4tn4mb2nhwcf": (87, 0, 22016),
    "bm32bn128bk16tm4tn8mb1nchw": (121, 0, 21504),
    "bm32bn128bk16tm4tn8mb1nchwf": (125, 0, 21504),
    "bm32bn128bk16tm4tn8mb1nhwc": (127, 0, 22016),
    "bm32bn128bk16tm4tn8mb1nhwcf": (125, 0, 22016),
    "bm32bn128bk16tm8tn4mb1nchw": (125, 0, 21504),
    "bm32bn128bk16tm8tn4mb1nchwf": (127, 0, 21504),
    "bm32bn128bk16tm8tn4mb1nhwc": (127, 0, 22016),
    "bm32bn128bk16tm8tn4mb1nhwcf": (127, 0, 22016),
    "bm32bn128bk16tm8tn8mb1nchw": (209, 0, 21504),
    "bm32bn128bk16tm8tn8mb1nchwf": (215, 0, 21504),
    "bm32bn128bk16tm8tn8mb1nhwc": (251, 0, 22016),
    "bm32bn128bk16tm8tn8mb1nhwcf": (231, 0, 22016),
    "bm64bn32bk8tm4tn4mb1nchw": (102, 0, 6656),
    "bm64bn32bk8tm4tn4mb1nchwf": (96, 0, 6656),
    "bm64bn32bk8tm4tn4mb1nhwc": (110, 0, 7680),
    "bm64bn32bk8tm4tn4mb1nhwcf": (102, 0, 7680),
    "bm64bn32bk8tm4tn8mb1nchw": (127, 0, 6656),
    "bm64bn32bk8tm4tn8mb1nchwf": (125, 0, 6656),
    "bm64bn32bk8tm4tn8mb1nhwc": (154, 0, 7680),
    "bm64bn32bk8tm4tn8mb1nhwcf": (134, 0, 7680),
    "bm64bn32bk8tm8tn4mb1nchw": (127, 0, 6656),
    "bm64bn32bk8tm8tn4mb1nchwf": (123, 0, 6656),
    "bm64bn32bk8tm8tn4mb1nhwc": (152, 0, 7680),
    "bm64bn32bk8tm8tn4mb1nhwcf": (130, 0, 7680),
    "bm64bn32bk8tm8tn8mb1nhwc": (255, 0, 7680),
    "bm64bn32bk8tm8tn8mb1nhwcf": (214, 0, 7680),
    "bm64bn32bk16tm4tn4mb1nchw": (111, 0, 13312),
    "bm64bn32bk16tm4tn4mb1nchwf": (103, 0, 13312),
    "bm64bn32bk16tm4tn4mb1nhwc": (130, 0, 14336),
    "bm64bn32bk16tm4tn4mb1nhwcf": (119, 0, 14336),
    "bm64bn32bk16tm4tn8mb1nchw": (193, 0, 13312),
    "bm64bn32bk16tm4tn8mb1nchwf": (168, 0, 13312),
    "bm64bn32bk16tm4tn8mb1nhwc": (218, 0, 14336),
    "bm64bn32bk16tm4tn8mb1nhwcf": (187, 0, 14336),
    "bm64bn32bk16tm8tn4mb1nchw": (197, 0, 13312),
    "bm64bn32bk16tm8tn4mb1nchwf": (168, 0, 13312),
    "bm64bn32bk16tm8tn4mb1nhwc": (218, 0, 14336),
    "bm64bn32bk16tm8tn4mb1nhwcf": (187, 0, 14336),
    "bm64bn32bk16tm8tn8mb1nhwc": (254, 0, 14336),
    "bm64bn32bk16tm8tn8mb1nhwcf": (255, 360, 14336),
    "bm64bn64bk8tm4tn4mb1nchw": (80, 0, 8704),
    "bm64bn64bk8tm4tn4mb1nchwf": (84, 0, 8704),
    "bm64bn64bk8tm4tn4mb1nhwc": (86, 0, 9728),
    "bm64bn64bk8tm4tn4mb1nhwcf": (80, 0, 9728),
    "bm64bn64bk8tm4tn4mb2nchw": (80, 0, 8704),
    "bm64bn64bk8tm4tn4mb2nchwf": (84, 0, 8704),
    "bm64bn64bk8tm4tn4mb2nhwc": (86, 0, 9728),
    "bm64bn64bk8tm4tn4mb2nhwcf": (80, 0, 9728),
    "bm64bn64bk8tm4tn8mb1nchw": (103, 0, 8704),
    "bm64bn64bk8tm4tn8mb1nchwf": (107, 0, 8704),
    "bm64bn64bk8tm4tn8mb1nhwc": (105, 0, 9728),
    "bm64bn64bk8tm4tn8mb1nhwcf": (95, 0, 9728),
    "bm64bn64bk8tm8tn4mb1nchw": (109, 0, 8704),
    "bm64bn64bk8tm8tn4mb1nchwf": (111, 0, 8704),
    "bm64bn64bk8tm8tn4mb1nhwc": (109, 0, 9728),
    "bm64bn64bk8tm8tn4mb1nhwcf": (105, 0, 9728),
    "bm64bn64bk8tm8tn8mb1nchw": (167, 0, 8704),
    "bm64bn64bk8tm8tn8mb1nchwf": (158, 0, 8704),
    "bm64bn64bk8tm8tn8mb1nhwc": (197, 0, 9728),
    "bm64bn64bk8tm8tn8mb1nhwcf": (168, 0, 9728),
    "bm64bn64bk16tm4tn4mb1nchw": (89, 0, 17408),
    "bm64bn64bk16tm4tn4mb1nchwf": (91, 0, 17408),
    "bm64bn64bk16tm4tn4mb1nhwc": (89, 0, 18432),
    "bm64bn64bk16tm4tn4mb1nhwcf": (79, 0, 18432),
    "bm64bn64bk16tm4tn4mb2nchw": (89, 0, 17408),
    "bm64bn64bk16tm4tn4mb2nchwf": (91, 0, 17408),
    "bm64bn64bk16tm4tn4mb2nhwc": (89, 0, 18432),
    "bm64bn64bk16tm4tn4mb2nhwcf": (79, 0, 18432),
    "bm64bn64bk16tm4tn8mb1nchw": (127, 0, 17408),
    "bm64bn64bk16tm4tn8mb1nchwf": (127, 0, 17408),
    "bm64bn64bk16tm4tn8mb1nhwc": (145, 0, 18432),
    "bm64bn64bk16tm4tn8mb1nhwcf": (135, 0, 18432),
    "bm64bn64bk16tm8tn4mb1nchw": (129, 0, 17408),
    "bm64bn64bk16tm8tn4mb1nchwf": (127, 0, 17408),
    "bm64bn64bk16tm8tn4mb1nhwc": (149, 0, 18432),
    "bm64bn64bk16tm8tn4mb1nhwcf": (137, 0, 18432),
    "bm64bn64bk16tm8tn8mb1nchw": (243, 0, 17408),
    "bm64bn64bk16tm8tn8mb1nchwf": (221, 0, 17408),
    "bm64bn64bk16tm8tn8mb1nhwc": (254, 0, 18432),
    "bm64bn64bk16tm8tn8mb1nhwcf": (226, 0, 18432),
    "bm64bn128bk8tm4tn4mb1nchw": (79, 0, 12800),
    "bm64bn128bk8tm4tn4mb1nchwf": (80, 0, 12800),
    "bm64bn128bk8tm4tn4mb1nhwc": (75, 0, 13824),
    "bm64bn128bk8tm4tn4mb1nhwcf": (79, 0, 13824),
    "bm64bn128bk8tm4tn4mb2nchw": (63, 0, 12800),
    "bm64bn128bk8tm4tn4mb2nchwf": (64, 0, 12800),
    "bm64bn128bk8tm4tn4mb2nhwc": (64, 0, 13824),
    "bm64bn128bk8tm4tn4mb2nhwcf": (63, 0, 13824),
    "bm64bn128bk8tm4tn8mb1nchw": (95, 0, 12800),
    "bm64bn128bk8tm4tn8mb1nchwf": (97, 0, 12800),
    "bm64bn128bk8tm4tn8mb1nhwc": (95, 0, 13824),
    "bm64bn128bk8tm4tn8mb1nhwcf": (95, 0, 13824),
    "bm64bn128bk8tm4tn8mb2nchw": (95, 0, 12800),
    "bm64bn128bk8tm4tn8mb2nchwf": (97, 0, 12800),
    "bm64bn128bk8tm4tn8mb2nhwc": (95, 0, 13824),
    "bm64bn128bk8tm4tn8mb2nhwcf": (95, 0, 13824),
    "bm64bn128bk8tm8tn4mb1nchw": (95, 0, 12800),
    "bm64bn128bk8tm8tn4mb1nchwf": (96, 0, 12800),
    "bm64bn128bk8tm8tn4mb1nhwc": (95, 0, 13824),
    "bm64bn128bk8tm8tn4mb1nhwcf": (95, 0, 13824),
    "bm64bn128bk8tm8tn4mb2nchw": (95, 0, 12800),
    "bm64bn128bk8tm8tn4mb2nchwf": (96, 0, 12800),
    "bm64bn128bk8tm8tn4mb2nhwc": (95, 0, 13824),
    "bm64bn128bk8tm8tn4mb2nhwcf": (95, 0, 13824),
    "bm64bn128bk8tm8tn8mb1nchw": (149, 0, 12800),
    "bm64bn128bk8tm8tn8mb1nchwf": (167, 0, 12800),
    "bm64bn128bk8tm8tn8mb1nhwc": (167, 0, 13824),
    "bm64bn128bk8tm8tn8mb1nhwcf": (167, 0, 13824),
    "bm64bn128bk16tm4tn4mb1nchw": (79, 0, 25600),
    "bm64bn128bk16tm4tn4mb1nchwf": (89, 0, 25600),
    "bm64bn128bk16tm4tn4mb1nhwc": (77, 0, 26624),
    "bm64bn128bk16tm4tn4mb1nhwcf": (77, 0, 26624),
    "bm64bn128bk16tm4tn4mb2nchw": (64, 0, 25600),
    "bm64bn128bk16tm4tn4mb2nchwf": (64, 0, 25600),
    "bm64bn128bk16tm4tn4mb2nhwc": (64, 0, 26624),
    "bm64bn128bk16tm4tn4mb2nhwcf": (64, 0, 26624),
    "bm64bn128bk16tm4tn8mb1nchw": (113, 0, 25600),
    "bm64bn128bk16tm4tn8mb1nchwf": (119, 0, 25600),
    "bm64bn128bk16tm4tn8mb1nhwc": (113, 0, 26624),
    "bm64bn128bk16tm4tn8mb1nhwcf": (109, 0, 26624),
    "bm64bn128bk16tm4tn8mb2nchw": (113, 0, 25600),
    "bm64bn128bk16tm4tn8mb2nchwf": (119, 0, 25600),
    "bm64bn128bk16tm4tn8mb2nhwc": (113, 0, 26624),
    "bm64bn128bk16tm4tn8mb2nhwcf": (109, 0, 26624),
    "bm64bn128bk16tm8tn4mb1nchw": (117, 0, 25600),
    "bm64bn128bk16tm8tn4mb1nchwf": (119, 0, 25600),
    "bm64bn128bk16tm8tn4mb1nhwc": (117, 0, 26624),
    "bm64bn128bk16tm8tn4mb1nhwcf": (113, 0, 26624),
    "bm64bn128bk16tm8tn4mb2nchw": (117, 0, 25600),
    "bm64bn128bk16tm8tn4mb2nchwf": (119, 0, 25600),
    "bm64bn128bk16tm8tn4mb2nhwc": (117, 0, 26624),
    "bm64bn128bk16tm8tn4mb2nhwcf": (113, 0, 26624),
    "bm64bn128bk16tm8tn8mb1nchw": (189, 0, 25600),
    "bm64bn128bk16tm8tn8mb1nchwf": (199, 0, 25600),
    "bm64bn128bk16tm8tn8mb1nhwc": (209, 0, 26624),
    "bm64bn128bk16tm8tn8mb1nhwcf": (195, 0, 26624),
    "bm128bn32bk8tm4tn4mb1nchw": (102, 0, 10752),
    "bm128bn32bk8tm4tn4mb1nchwf": (96, 0, 10752),
    "bm128bn32bk8tm4tn4mb1nhwc": (110, 0, 12800),
    "bm128bn32bk8tm4tn4mb1nhwcf": (102, 0, 12800),
    "bm128bn32bk8tm4tn4mb2nchw": (102, 0, 10752),
    "bm128bn32bk8tm4tn4mb2nchwf": (96, 0, 10752),
    "bm128bn32bk8tm4tn4mb2nhwc": (110, 0, 12800),
    "bm128bn32bk8tm4tn4mb2nhwcf": (102, 0, 12800),
    "bm128bn32bk8tm4tn8mb1nchw": (128, 0, 10752),
    "bm128bn32bk8tm4tn8mb1nchwf": (121, 0, 10752),
    "bm128bn32bk8tm4tn8mb1nhwc": (158, 0, 12800),
    "bm128bn32bk8tm4tn8mb1nhwcf": (140, 0, 12800),
    "bm128bn32bk8tm8tn4mb1nchw": (124, 0, 10752),
    "bm128bn32bk8tm8tn4mb1nchwf": (123, 0, 10752),
    "bm128bn32bk8tm8tn4mb1nhwc": (158, 0, 12800),
    "bm128bn32bk8tm8tn4mb1nhwcf": (140, 0, 12800),
    "bm128bn32bk8tm8tn8mb1nhwc": (254, 0, 12800),
    "bm128bn32bk8tm8tn8mb1nhwcf": (210, 0, 12800),
    "bm128bn32bk16tm4tn4mb1nchw": (111, 0, 21504),
    "bm128bn32bk16tm4tn4mb1nchwf": (103, 0, 21504),
    "bm128bn32bk16tm4tn4mb1nhwc": (137, 0, 23552),
    "bm128bn32bk16tm4tn4mb1nhwcf": (123, 0, 23552),
    "bm128bn32bk16tm4tn4mb2nchw": (111, 0, 21504),
    "bm128bn32bk16tm4tn4mb2nchwf": (103, 0, 21504),
    "bm128bn32bk16tm4tn4mb2nhwc": (128, 0, 23552),
    "bm128bn32bk16tm4tn4mb2nhwcf": (123, 0, 23552),
    "bm128bn32bk16tm4tn8mb1nchw": (195, 0, 21504),
    "bm128bn32bk16tm4tn8mb1nchwf": (167, 0, 21504),
    "bm128bn32bk16tm4tn8mb1nhwc": (208, 0, 23552),
    "bm128bn32bk16tm4tn8mb1nhwcf": (179, 0, 23552),
    "bm128bn32bk16tm8tn4mb1nchw": (195, 0, 21504),
    "bm128bn32bk16tm8tn4mb1nchwf": (167, 0, 21504),
    "bm128bn32bk16tm8tn4mb1nhwc": (206, 0, 23552),
    "bm128bn32bk16tm8tn4mb1nhwcf": (177, 0, 23552),
    "bm128bn32bk16tm8tn8mb1nhwc": (254, 0, 23552),
    "bm128bn32bk16tm8tn8mb1nhwcf": (255, 148, 23552),
    "bm128bn64bk8tm4tn4mb1nchw": (85, 0, 12800),
    "bm128bn64bk8tm4tn4mb1nchwf": (87, 0, 12800),
    "bm128bn64bk8tm4tn4mb1nhwc": (86, 0, 14848),
    "bm128bn64bk8tm4tn4mb1nhwcf": (84, 0, 14848),
    "bm128bn64bk8tm4tn4mb2nchw": (63, 0, 12800),
    "bm128bn64bk8tm4tn4mb2nchwf": (64, 0, 12800),
    "bm128bn64bk8tm4tn4mb2nhwc": (64, 0, 14848),
    "bm128bn64bk8tm4tn4mb2nhwcf": (64, 0, 14848),
    "bm128bn64bk8tm4tn8mb1nchw": (103, 0, 12800),
    "bm128bn64bk8tm4tn8mb1nchwf": (103, 0, 12800),
    "bm128bn64bk8tm4tn8mb1nhwc": (107, 0, 14848),
    "bm128bn64bk8tm4tn8mb1nhwcf": (101, 0, 14848),
    "bm128bn64bk8tm4tn8mb2nchw": (103, 0, 12800),
    "bm128bn64bk8tm4tn8mb2nchwf": (103, 0, 12800),
    "bm128bn64bk8tm4tn8mb2nhwc": (107, 0, 14848),
    "bm128bn64bk8tm4tn8mb2nhwcf": (101, 0, 14848),
    "bm128bn64bk8tm8tn4mb1nchw": (105, 0, 12800),
    "bm128bn64bk8tm8tn4mb1nchwf": (96, 0, 12800),
    "bm128bn64bk8tm8tn4mb1nhwc": (107, 0, 14848),
    "bm128bn64bk8tm8tn4mb1nhwcf": (96, 0, 14848),
    "bm128bn64bk8tm8tn4mb2nchw": (105, 0, 12800),
    "bm128bn64bk8tm8tn4mb2nchwf": (96, 0, 12800),
    "bm128bn64bk8tm8tn4mb2nhwc": (107, 0, 14848),
    "bm128bn64bk8tm8tn4mb2nhwcf": (96, 0, 14848),
    "bm128bn64bk8tm8tn8mb1nchw": (167, 0, 12800),
    "bm128bn64bk8tm8tn8mb1nchwf": (146, 0, 12800),
    "bm128bn64bk8tm8tn8mb1nhwc": (189, 0, 14848),
    "bm128bn64bk8tm8tn8mb1nhwcf": (168, 0, 14848),
    "bm128bn64bk16tm4tn4mb1nchw": (89, 0, 25600),
    "bm128bn64bk16tm4tn4mb1nchwf": (89, 0, 25600),
    "bm128bn64bk16tm4tn4mb1nhwc": (89, 0, 27648),
    "bm128bn64bk16tm4tn4mb1nhwcf": (80, 0, 27648),
    "bm128bn64bk16tm4tn4mb2nchw": (64, 0, 25600),
    "bm128bn64bk16tm4tn4mb2nchwf": (64, 0, 25600),
    "bm128bn64bk16tm4tn4mb2nhwc": (64, 20, 27648),
    "bm128bn64bk16tm4tn4mb2nhwcf": (64, 92, 27648),
    "bm128bn64bk16tm4tn8mb1nchw": (127, 0, 25600),
    "bm128bn64bk16tm4tn8mb1nchwf": (127, 0, 25600),
    "bm128bn64bk16tm4tn8mb1nhwc": (145, 0, 27648),
    "bm128bn64bk16tm4tn8mb1nhwcf": (133, 0, 27648),
    "bm128bn64bk16tm4tn8mb2nchw": (127, 0, 25600),
    "bm128bn64bk16tm4tn8mb2nchwf": (127, 0, 25600),
    "bm128bn64bk16tm4tn8mb2nhwc": (128, 0, 27648),
    "bm128bn64bk16tm4tn8mb2nhwcf": (128, 20, 27648),
    "bm128bn64bk16tm8tn4mb1nchw": (127, 0, 25600),
    "bm128bn64bk16tm8tn4mb1nchwf": (123, 0, 25600),
    "bm128bn64bk16tm8tn4mb1nhwc": (149, 0, 27648),
    "bm128bn64bk16tm8tn4mb1nhwcf": (130, 0, 27648),
    "bm128bn64bk16tm8tn4mb2nchw": (127, 0, 25600),
    "bm128bn64bk16tm8tn4mb2nchwf": (123, 0, 25600),
    "bm128bn64bk16tm8tn4mb2nhwc": (128, 0, 27648),
    "bm128bn64bk16tm8tn4mb2nhwcf": (128, 0, 27648),
    "bm128bn64bk16tm8tn8mb1nchw": (227, 0, 25600),
    "bm128bn64bk16tm8tn8mb1nchwf": (209, 0, 25600),
    "bm128bn64bk16tm8tn8mb1nhwc": (245, 0, 27648),
    "bm128bn64bk16tm8tn8mb1nhwcf": (213, 0, 27648),
    "bm128bn128bk8tm4tn4mb1nchw": (63, 0, 16896),
    "bm128bn128bk8tm4tn4mb1nchwf": (63, 0, 16896),
    "bm128bn128bk8tm4tn4mb1nhwc": (64, 0, 18944),
    "bm128bn128bk8tm4tn4mb1nhwcf": (64, 0, 18944),
    "bm128bn128bk8tm4tn4mb2nchw": (32, 352, 16896),
    "bm128bn128bk8tm4tn4mb2nchwf": (32, 296, 16896),
    "bm128bn128bk8tm4tn4mb2nhwc": (32, 240, 18944),
    "bm128bn128bk8tm4tn4mb2nhwcf": (32, 348, 18944),
    "bm128bn128bk8tm4tn8mb1nchw": (93, 0, 16896),
    "bm128bn128bk8tm4tn8mb1nchwf": (96, 0, 16896),
    "bm128bn128bk8tm4tn8mb1nhwc": (93, 0, 18944),
    "bm128bn128bk8tm4tn8mb1nhwcf": (91, 0, 18944),
    "bm128bn128bk8tm4tn8mb2nchw": (64, 204, 16896),
    "bm128bn128bk8tm4tn8mb2nchwf": (64, 0, 16896),
    "bm128bn128bk8tm4tn8mb2nhwc": (64, 268, 18944),
    "bm128bn128bk8tm4tn8mb2nhwcf": (64, 256, 18944),
    "bm128bn128bk8tm8tn4mb1nchw": (95, 0, 16896),
    "bm128bn128bk8tm8tn4mb1nchwf": (95, 0, 16896),
    "bm128bn128bk8tm8tn4mb1nhwc": (95, 0, 18944),
    "bm128bn128bk8tm8tn4mb1nhwcf": (95, 0, 18944),
    "bm128bn128bk8tm8tn4mb2nchw": (64, 180, 16896),
    "bm128bn128bk8tm8tn4mb2nchwf": (64, 188, 16896),
    "bm128bn128bk8tm8tn4mb2nhwc": (64, 296, 18944),
    "bm128bn128bk8tm8tn4mb2nhwcf": (64, 16, 18944),
    "bm128bn128bk8tm8tn8mb1nchw": (141, 0, 16896),
    "bm128bn128bk8tm8tn8mb1nchwf": (167, 0, 16896),
    "bm128bn128bk8tm8tn8mb1nhwc": (167, 0, 18944),
    "bm128bn128bk8tm8tn8mb1nhwcf": (165, 0, 18944),
    "bm128bn128bk8tm8tn8mb2nchw": (128, 0, 16896),
    "bm128bn128bk8tm8tn8mb2nchwf": (128, 160, 16896),
    "bm128bn128bk8tm8tn8mb2nhwc": (128, 0, 18944),
    "bm128bn128bk8tm8tn8mb2nhwcf": (127, 0, 18944),
    "bm128bn128bk16tm4tn4mb1nchw": (63, 0, 33792),
    "bm128bn128bk16tm4tn4mb1nchwf": (64, 0, 33792),
    "bm128bn128bk16tm4tn4mb1nhwc": (64, 0, 35840),
    "bm128bn128bk16tm4tn4mb1nhwcf": (64, 0, 35840),
    "bm128bn128bk16tm4tn4mb2nchw": (32, 440, 33792),
    "bm128bn128bk16tm4tn4mb2nchwf": (32, 308, 33792),
    "bm128bn128bk16tm4tn4mb2nhwc": (32, 340, 35840),
    "bm128bn128bk16tm4tn4mb2nhwcf": (32, 368, 35840),
    "bm128bn128bk16tm4tn8mb1nchw": (103, 0, 33792),
    "bm128bn128bk16tm4tn8mb1nchwf": (107, 0, 33792),
    "bm128bn128bk16tm4tn8mb1nhwc": (105, 0, 35840),
    "bm128bn128bk16tm4tn8mb1nhwcf": (95, 0, 35840),
    "bm128bn128bk16tm4tn8mb2nchw": (64, 328, 33792),
    "bm128bn128bk16tm4tn8mb2nchwf": (64, 312, 33792),
    "bm128bn128bk16tm4tn8mb2nhwc": (64, 340, 35840),
    "bm128bn128bk16tm4tn8mb2nhwcf": (64, 344, 35840),
    "bm128bn128bk16tm8tn4mb1nchw": (109, 0, 33792),
    "bm128bn128bk16tm8tn4mb1nchwf": (113, 0, 33792),
    "bm128bn128bk16tm8tn4mb1nhwc": (109, 0, 35840),
    "bm128bn128bk16tm8tn4mb1nhwcf": (105, 0, 35840),
    "bm128bn128bk16tm8tn4mb2nchw": (64, 376, 33792),
    "bm128bn128bk16tm8tn4mb2nchwf": (64, 300, 33792),
    "bm128bn128bk16tm8tn4mb2nhwc": (64, 336, 35840),
    "bm128bn128bk16tm8tn4mb2nhwcf": (64, 336, 35840),
    "bm128bn128bk16tm8tn8mb1nchw": (167, 0, 33792),
    "bm128bn128bk16tm8tn8mb1nchwf": (167, 0, 33792),
    "bm128bn128bk16tm8tn8mb1nhwc": (185, 0, 35840),
    "bm128bn128bk16tm8tn8mb1nhwcf": (175, 0, 35840),
    "bm128bn128bk16tm8tn8mb2nchw": (128, 260, 33792),
    "bm128bn128bk16tm8tn8mb2nchwf": (128, 376, 33792),
    "bm128bn128bk16tm8tn8mb2nhwc": (128, 320, 35840),
    "bm128bn128bk16tm8tn8mb2nhwcf": (128, 376, 35840),
}


def _ptxas_key(cfg: DirectConfig, nhwc: bool, flush: int = 0) -> str:
    return cfg.key + ("nhwc" if nhwc else "nchw") + ("f" if flush else "")


def estimate_registers(cfg: DirectConfig, nhwc: bool = False, flush: int = 0) -> int:
    """Registers per thread: the ptxas report when the config was compiled here,
    else an estimate (accumulators + fragments + prefetch + addressing)."""
    hit = _PTXAS_SM90.get(_ptxas_key(cfg, nhwc, flush))
    if hit is not None:
        return hit[0]
    est = cfg.TM * cfg.TN + cfg.TM + cfg.TN + cfg.a_per * (2 if nhwc else 1) + 4 * cfg.b_per + 36
    cap = min(255, (65536 // (cfg.threads * cfg.min_blocks)) // 8 * 8)
    return min(est, cap) if est <= 255 else est


def _spills(cfg: DirectConfig, nhwc: bool, flush: int = 0) -> int:
    hit = _PTXAS_SM90.get(_ptxas_key(cfg, nhwc, flush))
    if hit is not None:
        return hit[1]
    est = cfg.TM * cfg.TN + cfg.TM + cfg.TN + cfg.a_per * (2 if nhwc else 1) + 4 * cfg.b_per + 36
    cap = min(255, (65536 // (cfg.threads * cfg.min_blocks)) // 8 * 8)
    return 0 if est <= cap else 4 * (est - cap)


def resource_ok(cfg: DirectConfig, nhwc: bool = False, hw: Hardware = H100,
                regs: int | None = None, flush: int = 0) -> bool:
    """Threads, registers, shared memory within the limits; no register spills
    (ptxas report of this config, layout and flush variant)."""
    if not structural_ok(cfg, nhwc):
        return False
    t = cfg.threads
    if t > hw.threads_per_block or t * cfg.min_blocks > hw.threads_per_sm:
        return False
    if cfg.smem_bytes(nhwc) > hw.smem_static_per_block:
        return False
    if cfg.min_blocks * (cfg.smem_bytes(nhwc) + hw.smem_reserved_per_block) > hw.smem_per_sm:
        return False
    r = estimate_registers(cfg, nhwc, flush) if regs is None else regs
    if r > hw.regs_per_thread or _alloc_regs(r) * t > hw.regs_per_sm:
        return False
    if regs is None and _spills(cfg, nhwc, flush) > 0:
        return False
    if _alloc_regs(r) * t * cfg.min_blocks > hw.regs_per_sm:
        return False
    return True


def _alloc_regs(regs: int) -> int:
    return -(-regs // 8) * 8


def occupancy(cfg: DirectConfig, nhwc: bool = False, hw: Hardware = H100, flush: int = 0) -> int:
    """Resident blocks per SM (registers, shared memory, threads, block limit)."""
    t = cfg.threads
    r = _alloc_regs(estimate_registers(cfg, nhwc, flush))
    by_regs = hw.regs_per_sm // (r * t)
    by_smem = hw.smem_per_sm // (cfg.smem_bytes(nhwc) + hw.smem_reserved_per_block)
    by_threads = hw.threads_per_sm // t
    return max(0, min(by_regs, by_smem, by_threads, hw.blocks_per_sm))


def all_configs() -> list[DirectConfig]:
    """Every point of GRID; ``min_blocks=2`` only where it changes the register cap
    (256 threads or more: below that, 65536 / (2 * threads) >= 255 anyway)."""
    keys = list(GRID)
    out = []
    for values in itertools.product(*GRID.values()):
        cfg = DirectConfig(**dict(zip(keys, values)))
        if cfg.min_blocks > 1 and 65536 // (cfg.min_blocks * cfg.threads) >= 255:
            continue
        out.append(cfg)
    return out


def candidate_configs(spec: LayerSpec, hw: Hardware = H100) -> list[DirectConfig]:
    """Configs of the space that pass the resource filter for this layer's layout,
    minus those whose block tile is grossly larger than the problem (a BN of 128
    for K = 3, say: dominated by a smaller tile with the same work)."""
    nhwc = spec.layout == "NHWC"
    flush = flush_terms(spec)
    M = spec.N * spec.out_h * spec.out_w
    out = []
    for cfg in all_configs():
        if not resource_ok(cfg, nhwc, hw, flush=flush):
            continue
        if cfg.BN > 32 and cfg.BN >= 2 * _round_up(spec.K, 32):
            continue
        if cfg.BM > 32 and cfg.BM >= 2 * _round_up(M, 32):
            continue
        out.append(cfg)
    return out


def _round_up(a: int, b: int) -> int:
    return -(-a // b) * b


# ---------------------------------------------------------------------------
# Performance model (upper-bound style, after DeepCuts)
# ---------------------------------------------------------------------------

def _instr_per_ktile(cfg: DirectConfig, nhwc: bool) -> tuple[float, float]:
    """(FFMA, all warp instructions) one thread issues per k-tile."""
    ffma = cfg.TM * cfg.TN * cfg.BK
    lds = (cfg.TM // 4 + cfg.TN // 4) * cfg.BK
    gather = cfg.a_per * (9 + (2 if nhwc else 0))   # table LDG, adds, compares, LDG, STS
    bload = cfg.b_per * 4                            # address, LDG.128, STS.128
    loop = 8                                         # barrier, loop, buffer swap
    return ffma, ffma + lds + gather + bload + loop


def _a_footprint_bytes(spec: LayerSpec, BM: int) -> float:
    """Bytes of input a block of BM consecutive pixels touches (in 32-byte sectors)."""
    OH, OW, P = spec.out_h, spec.out_w, spec.out_h * spec.out_w
    u = spec.stride
    if BM >= P:
        images = min(spec.N, -(-BM // P) + 1)
        return images * spec.C * spec.H * spec.W * 4.0
    rows_out = min(OH, -(-BM // OW) + (1 if BM % OW else 0)) if BM >= OW else (2 if OW % BM else 1)
    cols_out = OW if BM >= OW else BM
    rows_in = min(spec.H, (rows_out - 1) * u + spec.R)
    cols_in = min(spec.W, (cols_out - 1) * u + spec.S)
    if spec.layout == "NCHW":
        row_bytes = (-(-cols_in * 4 // 32) + 1) * 32
        return float(spec.C * rows_in * row_bytes)
    return float(rows_in * cols_in * _round_up(spec.C * 4, 32))


def model_terms(spec: LayerSpec, cfg: DirectConfig, hw: Hardware = H100) -> dict:
    """The model's terms (microseconds, and the ratios) for one layer and config."""
    nhwc = spec.layout == "NHWC"
    flush = flush_terms(spec)
    M = spec.N * spec.out_h * spec.out_w
    crs = spec.C * spec.R * spec.S
    mt, nt = -(-M // cfg.BM), -(-spec.K // cfg.BN)
    ktiles = -(-crs // cfg.BK)
    chunks = -(-ktiles // (flush // cfg.BK)) if flush else 1
    blocks = mt * nt
    occ = max(1, occupancy(cfg, nhwc, hw, flush))
    warps = cfg.threads // 32
    ffma, instr = _instr_per_ktile(cfg, nhwc)
    issue_eff = ffma / instr

    # Issue-bound time of one k-tile for the blocks resident on one SM, and the
    # global-load latency it must cover (the next tile's loads are in flight).
    def wave_cycles(resident: int) -> float:
        per_ktile = max(instr * warps * resident / hw.issue_per_clk, hw.global_latency_clk)
        epilogue = cfg.TM * cfg.TN * 2.0 * warps * resident / hw.issue_per_clk
        return ktiles * per_ktile + chunks * (hw.global_latency_clk + epilogue)

    # DeepCuts' SMRatio: the FFMAs between two shared-memory loads, times the warps a
    # scheduler can switch between, must cover the shared-memory latency.
    def sm_ratio(resident: int) -> float:
        ffma_per_lds = cfg.TM * cfg.TN / (cfg.TM // 4 + cfg.TN // 4)
        warps_per_sched = max(1.0, warps * resident / 4)
        return min(1.0, ffma_per_lds * warps_per_sched / hw.smem_latency_clk)

    per_wave = hw.sms * occ
    full_waves, rest = divmod(blocks, per_wave)
    cycles = full_waves * wave_cycles(occ) / sm_ratio(occ)
    if rest:
        resident = -(-rest // hw.sms)
        cycles += wave_cycles(resident) / sm_ratio(resident)
    t_compute = cycles / hw.clock_hz * 1e6

    # Shared memory: wavefronts of the float4 fragment reads (32 lanes per warp).
    tx_lanes = min(cfg.TX, 32)
    a_wf = max(1.0, 16 * tx_lanes / 128)
    b_wf = max(1.0, 16 * max(1, 32 // cfg.TX) / 128)
    wf_per_kk = (cfg.TM // 4) * a_wf + (cfg.TN // 4) * b_wf
    smem_wf = blocks * warps * ktiles * cfg.BK * wf_per_kk
    t_smem = smem_wf * 128 / (hw.smem_bytes_per_clk * hw.sms * hw.clock_hz) * 1e6

    # Global memory: every block reads its input footprint and its filter slab from L2;
    # DRAM sees the input again per channel tile only when it does not fit in L2.
    in_bytes = 4.0 * spec.N * spec.C * spec.H * spec.W
    out_bytes = 4.0 * M * spec.K
    w_bytes = 4.0 * _round_up(crs, cfg.BK) * nt * cfg.BN
    a_block = min(_a_footprint_bytes(spec, cfg.BM), 4.0 * cfg.BM * crs)
    l2_bytes = blocks * (a_block + 4.0 * _round_up(crs, cfg.BK) * cfg.BN) + out_bytes * (2 * chunks - 1)
    rereads = 1 if in_bytes < 0.6 * hw.l2_bytes else nt
    dram_bytes = in_bytes * rereads + w_bytes + out_bytes
    t_dram = dram_bytes / hw.dram_bw * 1e6
    t_l2 = l2_bytes / hw.l2_bw * 1e6

    total = max(t_compute, t_smem, t_dram, t_l2) + hw.launch_us
    useful = spec.direct_flops
    return {
        "us": total, "compute_us": t_compute, "smem_us": t_smem, "dram_us": t_dram, "l2_us": t_l2,
        "blocks": blocks, "occupancy": occ, "waves": blocks / per_wave, "issue_eff": issue_eff,
        "tile_eff": useful / (2.0 * mt * cfg.BM * nt * cfg.BN * crs),
        "tflops": useful / total / 1e6,
    }


def predict_us(spec: LayerSpec, cfg: DirectConfig, hw: Hardware = H100) -> float:
    """Predicted kernel time (microseconds); ``inf`` when the config cannot run."""
    if not resource_ok(cfg, spec.layout == "NHWC", hw, flush=flush_terms(spec)):
        return math.inf
    return model_terms(spec, cfg, hw)["us"]


def rank(spec: LayerSpec, top: int = 5, hw: Hardware = H100) -> list[tuple[DirectConfig, float]]:
    """The ``top`` candidates by predicted time, fastest first (ties: bigger tiles, then key)."""
    scored = [(predict_us(spec, cfg, hw), cfg) for cfg in candidate_configs(spec, hw)]
    scored.sort(key=lambda item: (round(item[0], 6), -item[1].BM * item[1].BN, item[1].key))
    return [(cfg, us) for us, cfg in scored[:top]]


# ---------------------------------------------------------------------------
# Tuned table and heuristic choice
# ---------------------------------------------------------------------------

def gpu_slug(device_name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``."""
    name = device_name.lower()
    m = re.search(r"\b([a-z]{1,2}\d{2,4}[a-z]?)\b", name.replace("nvidia", ""))
    if m:
        return m.group(1)
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_") or "gpu"


def mapping_key(spec: LayerSpec) -> str:
    return spec.shape_string + ("" if spec.layout == "NCHW" else "_nhwc")


@functools.lru_cache(maxsize=8)
def _load_mapping_cached(path: str, mtime: float) -> dict:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    entries = data.get("entries", data) if isinstance(data, dict) else {}
    out = {}
    for key, value in entries.items():
        try:
            cfg_data = value["config"] if isinstance(value, dict) and "config" in value else value
            cfg = DirectConfig.from_key(cfg_data) if isinstance(cfg_data, str) \
                else DirectConfig.from_dict(cfg_data)
        except (TypeError, ValueError, KeyError):
            continue
        out[key] = cfg
    return out


def load_mapping(gpu: str = "h100") -> dict[str, DirectConfig]:
    """Tuned choices from ``mapping/direct_<gpu>.json`` (empty when absent)."""
    path = mapping_dir() / f"direct_{gpu}.json"
    if not path.is_file():
        return {}
    try:
        return dict(_load_mapping_cached(str(path), path.stat().st_mtime))
    except (OSError, ValueError):
        return {}


def heuristic_config(spec: LayerSpec, gpu: str = "h100", hw: Hardware = H100) -> DirectConfig:
    """A config for any layer without a tuning step: the tuned table's entry when
    there is one (and it passes the filter), else the model's best candidate."""
    nhwc = spec.layout == "NHWC"
    tuned = load_mapping(gpu).get(mapping_key(spec))
    if tuned is not None and resource_ok(tuned, nhwc, hw, flush=flush_terms(spec)):
        return tuned
    best = rank(spec, top=1, hw=hw)
    if best:
        return best[0][0]
    return DEFAULT_CONFIG   # unreachable for the shipped space; resource_ok-checked in tests


# ---------------------------------------------------------------------------
# Host-side data: gather table and packed filters (shared by GPU path and emulation)
# ---------------------------------------------------------------------------

def build_table(spec: LayerSpec) -> np.ndarray:
    """int32 [roundup(CRS, 16)][4]: {offset, r, s, 0} of each reduction index kk;
    rows past CRS have r = s = BIG (always out of bounds, so they read zero)."""
    C, R, S, H, W = spec.C, spec.R, spec.S, spec.H, spec.W
    crs = C * R * S
    rows = _round_up(crs, PACK_ROWS)
    table = np.zeros((rows, 4), dtype=np.int32)
    if spec.layout == "NCHW":          # kk = (c * R + r) * S + s
        c, r, s = np.meshgrid(np.arange(C), np.arange(R), np.arange(S), indexing="ij")
        off = c * (H * W) + r * W + s
    else:                              # kk = (r * S + s) * C + c
        r, s, c = np.meshgrid(np.arange(R), np.arange(S), np.arange(C), indexing="ij")
        off = (r * W + s) * C + c
    table[:crs, 0] = off.reshape(-1)
    table[:crs, 1] = r.reshape(-1)
    table[:crs, 2] = s.reshape(-1)
    table[crs:, 1] = BIG
    table[crs:, 2] = BIG
    return table


def pack_weights(w, layout: str = "NCHW", xp=np):
    """[K][C][R][S] -> zero-padded [roundup(CRS, 16)][roundup(K, 128)] in the
    kernel's reduction order ((c, r, s) for NCHW, (r, s, c) for NHWC)."""
    K, C, R, S = w.shape
    crs = C * R * S
    if layout == "NCHW":
        mat = w.reshape(K, crs)
    else:
        mat = w.transpose(0, 2, 3, 1).reshape(K, crs)
    out = xp.zeros((_round_up(crs, PACK_ROWS), _round_up(K, PACK_COLS)), dtype=w.dtype)
    out[:crs, :K] = mat.T
    return out


# ---------------------------------------------------------------------------
# NumPy emulation of the kernel, thread by thread (index math, predicates, tiles)
# ---------------------------------------------------------------------------

def emulate_direct(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0,
                   layout: str = "NCHW", config: DirectConfig | None = None,
                   check_writes: bool = True, flush: int | None = None) -> np.ndarray:
    """Run the kernel's exact tile loop on the CPU in float64: the same table, the
    same packed filters, the same per-thread load/store indices, smem layout
    (with poisoned padding), register tile and epilogue (vector and scalar
    stores, the chunked flush).  Output unwritten elements are NaN; ``check_writes``
    asserts every output element is written exactly once per reduction chunk.
    ``flush`` overrides :func:`flush_terms` (0: one chain)."""
    spec = _spec_from(x.shape, w.shape, stride, padding, layout)
    cfg = config or heuristic_config(spec)
    nhwc = layout == "NHWC"
    flush = flush_terms(spec) if flush is None else flush
    if not structural_ok(cfg, nhwc):
        raise ValueError(f"config {cfg.key} is not valid for {layout}")
    xf = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    wt = pack_weights(np.asarray(w, dtype=np.float64), layout)
    ldw = wt.shape[1]
    wtf = wt.reshape(-1)
    table = build_table(spec)
    C, H, W, K = spec.C, spec.H, spec.W, spec.K
    OH, OW = spec.out_h, spec.out_w
    P = OH * OW
    M = spec.N * P
    crs = C * spec.R * spec.S
    ktiles = -(-crs // cfg.BK)
    BM, BN, BK, TM, TN = cfg.BM, cfg.BN, cfg.BK, cfg.TM, cfg.TN
    T, TX, TY = cfg.threads, cfg.TX, cfg.TY
    A_ELEMS, A_PER = BM * BK, cfg.a_per
    B_VECS, B_PER = BN * BK // 4, cfg.b_per
    LDA, LDB = BM + 4, BN + 4
    y = np.full(M * K, np.nan)
    writes = np.zeros(M * K, dtype=np.int64)
    tid = np.arange(T)
    tx, ty = tid % TX, tid // TX

    def pixel_info(m):
        m = np.asarray(m)
        n = m // P
        pix = m - n * P
        oy, ox = pix // OW, pix % OW
        iy0 = oy * stride - padding
        ix0 = ox * stride - padding
        base = ((n * H + iy0) * W + ix0) * C if nhwc else (n * C * H + iy0) * W + ix0
        valid = m < M
        return (np.where(valid, base, 0), np.where(valid, iy0, BIG), np.where(valid, ix0, BIG))

    for bx in range(-(-M // BM)):
        m0 = bx * BM
        if nhwc:
            minfo = pixel_info(m0 + np.arange(BM))
        else:
            mine = pixel_info(m0 + tid % BM)
        for by in range(-(-K // BN)):
            k0n = by * BN
            As = np.full((2, BK, LDA), np.nan)
            Bs = np.full((2, BK, LDB), np.nan)
            acc = np.zeros((T, TM, TN))

            def load_global(kt):
                kbase = kt * BK
                a_reg = np.zeros((T, A_PER))
                a_ok = np.zeros((T, A_PER), dtype=bool)
                for i in range(A_PER):
                    e = tid + i * T
                    ok = e < A_ELEMS
                    if nhwc:
                        krow = e % BK
                        mloc = np.minimum(e // BK, BM - 1)
                        base, iy0, ix0 = (arr[mloc] for arr in minfo)
                    else:
                        krow = e // BM
                        base, iy0, ix0 = mine
                    krow = np.where(ok, krow, 0)
                    t = table[kbase + krow]            # IndexError = out-of-bounds table read
                    iy = iy0 + t[:, 1]
                    ix = ix0 + t[:, 2]
                    inb = ok & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
                    addr = base + t[:, 0]
                    if np.any(inb):
                        a = addr[inb]
                        assert a.min() >= 0 and a.max() < xf.size, "input read out of bounds"
                    vals = np.zeros(T)
                    vals[inb] = xf[addr[inb]]
                    a_reg[:, i] = vals
                    a_ok[:, i] = ok
                b_reg = np.zeros((T, B_PER, 4))
                b_ok = np.zeros((T, B_PER), dtype=bool)
                for j in range(B_PER):
                    e = tid + j * T
                    ok = e < B_VECS
                    row = e // (BN // 4)
                    col = (e % (BN // 4)) * 4
                    for q in range(4):
                        addr = (kbase + row[ok]) * ldw + k0n + col[ok] + q
                        assert addr.size == 0 or addr.max() < wtf.size, "filter read out of bounds"
                        assert np.all((k0n + col[ok]) % 4 == 0)
                        b_reg[ok, j, q] = wtf[addr]
                    b_ok[:, j] = ok
                return a_reg, a_ok, b_reg, b_ok

            def store_shared(buf, regs):
                a_reg, a_ok, b_reg, b_ok = regs
                for i in range(A_PER):
                    e = (tid + i * T)[a_ok[:, i]]
                    if nhwc:
                        As[buf, e % BK, e // BK] = a_reg[a_ok[:, i], i]
                    else:
                        As[buf, e // BM, e % BM] = a_reg[a_ok[:, i], i]
                for j in range(B_PER):
                    e = (tid + j * T)[b_ok[:, j]]
                    row = e // (BN // 4)
                    col = (e % (BN // 4)) * 4
                    for q in range(4):
                        Bs[buf, row, col + q] = b_reg[b_ok[:, j], j, q]

            a_cols = np.concatenate([j * TX * 4 + tx[:, None] * 4 + np.arange(4)[None, :]
                                     for j in range(TM // 4)], axis=1)      # (T, TM)
            b_cols = np.concatenate([j * TY * 4 + ty[:, None] * 4 + np.arange(4)[None, :]
                                     for j in range(TN // 4)], axis=1)      # (T, TN)
            assert a_cols.max() < BM and b_cols.max() < BN

            def run_chunk(c0, c1):
                store_shared(0, load_global(c0))
                for kt in range(c0, c1):
                    buf = (kt - c0) & 1
                    more = kt + 1 < c1
                    regs = load_global(kt + 1) if more else None
                    for kk in range(BK):
                        a = As[buf, kk][a_cols]
                        b = Bs[buf, kk][b_cols]
                        acc[...] += a[:, :, None] * b[:, None, :]
                    if more:
                        store_shared(buf ^ 1, regs)

            def put(addr, values, add):
                if add:
                    y[addr] += values
                else:
                    y[addr] = values
                np.add.at(writes, addr, 1)

            def write_out(add):
                if not nhwc:
                    vec = P % 4 == 0
                    for jm in range(TM // 4):
                        mb = m0 + jm * TX * 4 + tx * 4
                        for jn in range(TN // 4):
                            for q in range(4):
                                k = k0n + jn * TY * 4 + ty * 4 + q
                                for r4 in range(4):
                                    m = mb + r4
                                    if vec:
                                        ok = (mb < M) & (k < K)
                                        n = mb // P
                                        pix = mb - n * P + r4
                                        assert np.all(((n * K + k) * P + (pix - r4))[ok] % 4 == 0)
                                    else:
                                        ok = (m < M) & (k < K)
                                        n = m // P
                                        pix = m - n * P
                                    put(((n * K + k) * P + pix)[ok], acc[ok, 4 * jm + r4, 4 * jn + q], add)
                else:
                    vec = K % 4 == 0
                    for jm in range(TM // 4):
                        for r4 in range(4):
                            m = m0 + jm * TX * 4 + tx * 4 + r4
                            for jn in range(TN // 4):
                                kb = k0n + jn * TY * 4 + ty * 4
                                for q in range(4):
                                    ok = (m < M) & ((kb < K) if vec else (kb + q < K))
                                    put((m * K + kb + q)[ok], acc[ok, 4 * jm + r4, 4 * jn + q], add)

            if flush:
                for c0 in range(0, ktiles, flush // BK):
                    run_chunk(c0, min(ktiles, c0 + flush // BK))
                    write_out(c0 > 0)
                    acc[...] = 0.0
            else:
                run_chunk(0, ktiles)
                write_out(False)
    if check_writes:
        chunks = -(-ktiles // (flush // BK)) if flush else 1
        assert writes.min() == chunks and writes.max() == chunks, \
            "output not written exactly once per chunk"
    if nhwc:
        return y.reshape(spec.N, OH, OW, K)
    return y.reshape(spec.N, K, OH, OW)


def _spec_from(x_shape, w_shape, stride, padding, layout) -> LayerSpec:
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if len(x_shape) != 4:
        raise ValueError(f"input must be 4-D ({layout}), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"filter must be 4-D (K, C, R, S), got shape {tuple(w_shape)}")
    if layout == "NCHW":
        N, C, H, W = x_shape
    else:
        N, H, W, C = x_shape
    K, C2, R, S = w_shape
    if C != C2:
        raise ValueError(f"input has C={C} channels but the filter expects C={C2}")
    for name, value in (("stride", stride), ("padding", padding)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    return LayerSpec(N=int(N), C=int(C), K=int(K), H=int(H), W=int(W), R=int(R), S=int(S),
                     stride=int(stride), padding=int(padding), layout=layout)


# ---------------------------------------------------------------------------
# GPU: compile and launch
# ---------------------------------------------------------------------------

_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _source_hash_cached() -> str:
    """source_hash() once per process (the sources do not change under a running program)."""
    return source_hash()
_kernels: dict = {}
_tables: dict = {}


def compile_kernel(cfg: DirectConfig, nhwc: bool, flush: int = 0):
    """The compiled ``mw_direct_conv`` for a config (cached per config, layout,
    flush, source hash and device)."""
    import cupy

    digest = _source_hash_cached()
    dev = cupy.cuda.Device().id
    key = (cfg, bool(nhwc), int(flush), digest, dev)
    with _lock:
        kern = _kernels.get(key)
    if kern is not None:
        return kern
    src = (cuda_dir() / "direct.cu").read_text()
    options = ("-I" + str(cuda_dir()), "--std=c++17", f"-DMW_SOURCE_HASH={digest[:16]}",
               *cfg.defines(nhwc, flush))
    module = cupy.RawModule(code=src, options=options)
    kern = module.get_function("mw_direct_conv")
    with _lock:
        _kernels[key] = kern
    return kern


def _device_table(spec: LayerSpec):
    import cupy

    key = (spec.layout, spec.C, spec.R, spec.S, spec.H, spec.W, cupy.cuda.Device().id)
    with _lock:
        tab = _tables.get(key)
    if tab is None:
        tab = cupy.asarray(build_table(spec))
        with _lock:
            if len(_tables) > 256:
                _tables.clear()
            _tables[key] = tab
    return tab


def _as_cupy(a, what: str):
    import cupy

    if isinstance(a, cupy.ndarray):
        return a
    if hasattr(a, "__dlpack__") and not isinstance(a, np.ndarray):
        return cupy.from_dlpack(a)
    raise ValueError(f"{what} must be a CuPy array (or a DLPack GPU tensor), got {type(a).__name__}")


def _validate(x, w, stride, padding, layout) -> LayerSpec:
    if str(getattr(x, "dtype", None)) != "float32" or str(getattr(w, "dtype", None)) != "float32":
        raise ValueError(f"direct convolution is float32 only, got input {getattr(x, 'dtype', None)} "
                         f"and filter {getattr(w, 'dtype', None)}")
    spec = _spec_from(tuple(x.shape), tuple(w.shape), stride, padding, layout)
    M = spec.N * spec.out_h * spec.out_w
    if x.size >= INT32_LIMIT or M * spec.K >= INT32_LIMIT:
        raise ValueError(f"tensors over {INT32_LIMIT} elements are not supported by the direct "
                         "kernel's 32-bit offsets; split the batch")
    if -(-spec.K // 32) > 65535:
        raise ValueError(f"K={spec.K} is too large for the direct kernel's grid")
    return spec


def conv2d_direct(x, w, stride: int = 1, padding: int = 0, layout: str = "NCHW",
                  config: DirectConfig | None = None, out=None):
    """Direct convolution (cross-correlation) of CuPy float32 arrays.

    ``x`` is NCHW or NHWC (``layout``), ``w`` is K x C x R x S; returns a new CuPy
    array (or fills ``out``) in the input's layout.  Raises ValueError before any
    launch on bad shapes, dtypes, strides, paddings or configs.
    """
    spec = _validate(x, w, stride, padding, layout)
    import cupy

    x = _as_cupy(x, "input")
    w = _as_cupy(w, "filter")
    nhwc = layout == "NHWC"
    if config is None:
        config = heuristic_config(spec, gpu=_current_gpu())
    elif not isinstance(config, DirectConfig):
        raise ValueError(f"config must be a DirectConfig, got {type(config).__name__}")
    flush = flush_terms(spec)
    if not resource_ok(config, nhwc, flush=flush):
        raise ValueError(f"config {config.key} does not pass the resource filter for {layout}"
                         f"{' with flush' if flush else ''}")
    if out is not None:
        out = _as_cupy(out, "out")
        if tuple(out.shape) != spec.output_shape or str(out.dtype) != "float32" \
                or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {spec.output_shape}")
    x = cupy.ascontiguousarray(x)
    wt = pack_weights(cupy.ascontiguousarray(w), layout, xp=cupy)
    table = _device_table(spec)
    y = out if out is not None else cupy.empty(spec.output_shape, dtype=cupy.float32)
    kern = compile_kernel(config, nhwc, flush)
    launch(kern, config, spec, x, wt, table, y)
    return y


def launch(kern, cfg: DirectConfig, spec: LayerSpec, x, wt, table, y) -> None:
    M = spec.N * spec.out_h * spec.out_w
    crs = spec.C * spec.R * spec.S
    i32 = np.int32
    grid = (-(-M // cfg.BM), -(-spec.K // cfg.BN), 1)
    args = (x, wt, table, y, i32(spec.C), i32(spec.H), i32(spec.W), i32(spec.K),
            i32(spec.out_h), i32(spec.out_w), i32(M), i32(spec.stride), i32(spec.padding),
            i32(-(-crs // cfg.BK)), i32(wt.shape[1]))
    kern(grid, (cfg.threads, 1, 1), args)


@functools.lru_cache(maxsize=None)
def _gpu_name(dev: int) -> str:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(dev)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _current_gpu() -> str:
    try:
        import cupy

        return gpu_slug(_gpu_name(cupy.cuda.Device().id))
    except Exception:   # no device: the H100 table
        return "h100"


# ---------------------------------------------------------------------------
# ptxas report over the space (run where nvcc is: python -m megawino.direct --ptxas)
# ---------------------------------------------------------------------------

def ptxas_report(cfg: DirectConfig, nhwc: bool, flush: int = 0,
                 nvcc: str = "nvcc") -> tuple[int, int, int]:
    """(registers, spill bytes, static smem bytes) from ``nvcc -arch=sm_90 -cubin -Xptxas -v``."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-I", str(cuda_dir()),
               *cfg.defines(nhwc, flush), str(cuda_dir() / "direct.cu"), "-o", os.path.join(tmp, "k.cubin")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc failed for {cfg.key}: {text[-2000:]}")
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    stack = re.search(r"(\d+) bytes stack frame", text)
    spills += int(stack.group(1)) if stack else 0
    smem = re.search(r"(\d+) bytes smem", text)
    return regs, spills, int(smem.group(1)) if smem else 0


def _main(argv=None) -> int:
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    parser = argparse.ArgumentParser(description="megawino direct-convolution helpers")
    parser.add_argument("--ptxas", action="store_true", help="compile every config, print the table")
    args = parser.parse_args(argv)
    if args.ptxas:
        jobs = [(cfg, nhwc, flush) for cfg in all_configs() for nhwc in (False, True)
                for flush in (0, FLUSH_TERMS)
                if structural_ok(cfg, nhwc) and cfg.smem_bytes(nhwc) <= 48 * 1024
                and cfg.threads * cfg.min_blocks <= 2048]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
            results = list(pool.map(lambda job: ptxas_report(*job), jobs))
        for (cfg, nhwc, flush), res in zip(jobs, results):
            print(f'    "{_ptxas_key(cfg, nhwc, flush)}": {res},')
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
