"""FILTER task: a range of (c, k) pairs of U (Layout.u_shape; cuda/filter_transform.cuh)."""
from __future__ import annotations

import numpy as np

from ..tensor_core import split_tf32


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    q0, q1 = layout.filter_pair_range(index)
    q = np.arange(q0, q1)
    c, k = layout.filter_pair_channels(q)
    real = (c < layout.spec.C) & (k < layout.spec.K)
    G = tf.G.astype(np.float32)
    w = buffers.w[k[real], c[real]].astype(np.float32)           # [pairs][3][3]
    u = np.einsum("ir,qrs,js->ijq", G, w, G, optimize=True).reshape(layout.alpha2, -1)
    parts = (split_tf32(u) if layout.u_split else (u,))
    flat = buffers.U.reshape(layout.alpha2, len(parts), -1)
    for part, values in enumerate(parts):
        flat[:, part, q0:q1] = 0.0                                # padding pairs hold zeros
        flat[:, part, q[real]] = values
