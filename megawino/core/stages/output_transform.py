"""OUTPUT task (group g, index): y for the real tiles of its slice of g and its K chunk
(cuda/output_transform.cuh)."""
from __future__ import annotations

import numpy as np

from .input_transform import tile_coords


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    spec, m, alpha = layout.spec, layout.params.m, layout.alpha
    (t0, t1), (k0, k1) = layout.output_slices(group, index)
    n, th, tw, real = tile_coords(layout, t0, t1)
    AT = tf.AT.astype(np.float32)
    r0 = t0 - layout.ring_shift(group)
    mm = buffers.M[:, r0:r0 + t1 - t0, k0:k1].reshape(alpha, alpha, t1 - t0, k1 - k0)
    y = np.einsum("ia,abtk,jb->tijk", AT, mm, AT)                         # [t][m][m][k]
    oy = th[:, None] * m + np.arange(m)[None, :]
    ox = tw[:, None] * m + np.arange(m)[None, :]
    ok = (oy < spec.out_h)[:, :, None] & (ox < spec.out_w)[:, None, :] & real[:, None, None]
    t_idx, i_idx, j_idx = np.nonzero(ok)
    yy, xx, nn = oy[t_idx, i_idx], ox[t_idx, j_idx], n[t_idx]
    values = y[t_idx, i_idx, j_idx]                                       # [points][k]
    if spec.layout == "NHWC":
        buffers.y[nn, yy, xx, k0:k1] = values
    else:   # advanced indices around the slice index as [points][k] here too
        buffers.y[nn, k0:k1, yy, xx] = values
