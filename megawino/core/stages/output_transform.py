"""OUTPUT task (group g, index): y for the real tiles of its slice of g and its K chunk
(cuda/output_transform.cuh)."""
from __future__ import annotations

import numpy as np

from .input_transform import tile_coords


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    (t0, t1), (k0, k1) = layout.output_slices(group, index)
    r0 = t0 - layout.ring_shift(group)
    store_tiles(layout, buffers, t0, t1, k0, buffers.M[:, r0:r0 + t1 - t0, k0:k1], tf)


def store_tiles(layout, buffers, t0: int, t1: int, k0: int, mm, tf) -> None:
    """y = A^T m A of tiles t0 .. t1 - 1 and the output channels k0 .. k0 + mm.shape[2] - 1 from
    their products ``mm`` [alpha^2][t1 - t0][channels], written to the real tiles' pixels (also
    the GEMM_OUTPUT task's last step)."""
    spec, m, alpha = layout.spec, layout.params.m, layout.alpha
    k1 = k0 + mm.shape[2]
    n, th, tw, real = tile_coords(layout, t0, t1)
    AT = tf.AT.astype(np.float32)
    mm = mm.reshape(alpha, alpha, t1 - t0, k1 - k0)
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
