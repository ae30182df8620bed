"""FILTER task: a range of (c, k) pairs of U[alpha^2][c_stride][k_stride] (cuda/filter_transform.cuh)."""
from __future__ import annotations

import numpy as np


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    q0, q1 = layout.filter_pair_range(index)
    q = np.arange(q0, q1)
    c, k = np.divmod(q, layout.k_stride)
    real = (c < layout.spec.C) & (k < layout.spec.K)
    G = tf.G.astype(np.float32)
    w = buffers.w[k[real], c[real]].astype(np.float32)           # [pairs][3][3]
    u = np.einsum("ir,qrs,js->ijq", G, w, G, optimize=True).reshape(layout.alpha2, -1)
    flat = buffers.U.reshape(layout.alpha2, -1)
    flat[:, q0:q1] = 0.0                                          # padding pairs hold zeros
    flat[:, q[real]] = u
