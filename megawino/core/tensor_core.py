"""Operand formats of the tensor-core GEMM (cuda/gemm.cuh), for the layouts and the CPU
executor that mirror them."""
from __future__ import annotations

import numpy as np

U_SPLIT_BLOCK = 16       # channels of one k tile of the wgmma GEMM (the split U's channel blocks)


def u_channel_order(stored):
    """The channel held at stored position ``stored`` of a split U row: within each block of
    16, position 4 j + i holds channel 4 i + j (its own inverse).  The wgmma GEMM's k step
    pairs A columns with channels 4 t + 2 q + h (cuda/gemm.cuh), so one core-matrix row is
    channels j, j + 4, j + 8, j + 12 with j = 2 q + h: four stored neighbours."""
    stored = np.asarray(stored)
    block, rest = np.divmod(stored, U_SPLIT_BLOCK)
    return block * U_SPLIT_BLOCK + (rest % 4) * 4 + rest // 4


def split_tf32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 x -> (big, small) as float32 TF32 values, as cuda/gemm.cuh's split_tf32: big
    rounds to nearest (ties away), small = x - big truncated; big + small is exact in float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    big = ((x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    small = ((x - big).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return big, small
