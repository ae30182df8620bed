"""GEMM task (group g, j = position * k_blocks + K block): M[p][tiles of g][K block] (cuda/gemm.cuh)."""
from __future__ import annotations

import numpy as np


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    p, k_block = layout.gemm_position_kblock(index)
    k0, k1 = layout.gemm_k_range(k_block)
    t0, t1 = layout.group_tile_range(group)
    t0, t1 = t0 - layout.ring_shift(group), t1 - layout.ring_shift(group)   # rows of V and M
    # One fixed reduction over all of C per output element: no split-K, so the
    # result cannot depend on the mapping.
    np.matmul(buffers.V[p, t0:t1, :], buffers.U[p, :, k0:k1], out=buffers.M[p, t0:t1, k0:k1])
