"""INPUT task (group g, index): V[:, its tiles of g, its channel chunk] (cuda/input_transform.cuh)."""
from __future__ import annotations

import numpy as np

from ..tasks import TILE_BAND_ROWS


def tile_coords(layout, t0: int, t1: int):
    """Tile ids -> (n, tile row, tile col) and a mask of real (non-padding) tiles.  An image's
    tiles run in bands of TILE_BAND_ROWS tile rows (the last band may have fewer); a band by
    pairs of tile columns (the last column alone when tiles_w is odd), a pair row by row, left
    tile first: ids 0..7 of a 4-row band are (0, 0), (0, 1), (1, 0), (1, 1), ..., (3, 1).
    Mirrors tile_coord in cuda/input_transform.cuh."""
    tiles = np.arange(t0, t1)
    real = tiles < layout.tiles
    tiles_h, tiles_w = layout.tiles_h, layout.tiles_w
    n, rest = np.divmod(np.minimum(tiles, layout.tiles - 1), tiles_h * tiles_w)
    full_bands = tiles_h // TILE_BAND_ROWS
    band_tiles = TILE_BAND_ROWS * tiles_w
    in_full = rest < full_bands * band_tiles
    band = np.where(in_full, rest // band_tiles, full_bands)
    rest = rest - band * band_tiles
    rows = np.where(in_full, TILE_BAND_ROWS, tiles_h - full_bands * TILE_BAND_ROWS)   # of this band
    pairs = tiles_w // 2
    in_pairs = rest < pairs * 2 * rows
    safe_rows = np.maximum(rows, 1)
    pair, in_pair = np.divmod(rest, 2 * safe_rows)
    th = band * TILE_BAND_ROWS + np.where(in_pairs, in_pair // 2, rest - pairs * 2 * rows)
    tw = np.where(in_pairs, 2 * pair + in_pair % 2, tiles_w - 1)
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
