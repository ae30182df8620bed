"""GEMM_OUTPUT task (group g, K block): the products of every transform position for the tiles of
g and the K block, transformed to y without an M buffer (cuda/gemm_output.cuh)."""
from __future__ import annotations

import numpy as np

from . import output_transform


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    k0, k1 = layout.gemm_k_range(index)
    k1 = min(k1, layout.spec.K)               # padding channels of U have no y
    t0, t1 = layout.group_tile_range(group)
    r0 = t0 - layout.ring_shift(group)        # rows of V
    # The GEMM task's reduction (stages/gemm.py), one position at a time.
    mm = np.matmul(buffers.V[:, r0:r0 + t1 - t0, :], buffers.U[:, :, k0:k1])
    output_transform.store_tiles(layout, buffers, t0, t1, k0, mm, tf)
