"""INPUT task (group g, index): V[:, its tiles of g, its channel chunk] (cuda/input_transform.cuh)."""
from __future__ import annotations

import numpy as np


def tile_coords(layout, t0: int, t1: int):
    """Tile ids -> (n, tile row, tile col) and a mask of real (non-padding) tiles."""
    tiles = np.arange(t0, t1)
    real = tiles < layout.tiles
    n, rest = np.divmod(np.minimum(tiles, layout.tiles - 1), layout.tiles_h * layout.tiles_w)
    th, tw = np.divmod(rest, layout.tiles_w)
    return n, th, tw, real


def run_task(layout, buffers, group: int, index: int, tf) -> None:
    spec, m, alpha = layout.spec, layout.params.m, layout.alpha
    (t0, t1), (c0, c1) = layout.input_slices(group, index)
    n, th, tw, real = tile_coords(layout, t0, t1)
    rows = th[:, None] * m - spec.padding + np.arange(alpha)[None, :]      # [t][alpha]
    cols = tw[:, None] * m - spec.padding + np.arange(alpha)[None, :]
    inside = ((rows >= 0) & (rows < spec.H))[:, :, None] & ((cols >= 0) & (cols < spec.W))[:, None, :]
    inside &= real[:, None, None]
    rc, cc = np.clip(rows, 0, spec.H - 1), np.clip(cols, 0, spec.W - 1)
    creal = min(c1, spec.C)
    d = np.zeros((t1 - t0, alpha, alpha, c1 - c0), dtype=np.float32)
    if creal > c0:
        nn, rr, ccc = n[:, None, None], rc[:, :, None], cc[:, None, :]
        if spec.layout == "NHWC":
            window = buffers.x[nn, rr, ccc, c0:creal]
        else:   # NCHW: the advanced indices around the slice put channels last
            window = buffers.x[nn, c0:creal, rr, ccc]
        d[..., :creal - c0] = np.where(inside[..., None], window, 0.0)
    BT = tf.BT.astype(np.float32)
    v = np.einsum("ia,tabc,jb->ijtc", BT, d, BT)
    r0 = t0 - layout.ring_shift(group)
    buffers.V[:, r0:r0 + t1 - t0, c0:c1] = v.reshape(layout.alpha2, t1 - t0, c1 - c0)
