"""Winograd F(m x m, 3 x 3) transform matrices and NumPy references of every stage.

The matrices are built from interpolation points with exact rational arithmetic
(Toom-Cook with the point at infinity), never pasted: ``B^T`` is the transposed
Lagrange interpolation, ``G`` evaluates the filter polynomial at the points
(scaled by the Lagrange denominators) and ``A^T`` evaluates the output polynomial.
Correlation ``y = A^T [(G g) * (B^T d)]`` follows by the transposition principle.

Buffer layouts (shared with the CPU executor and the CUDA kernels, see
:class:`megawino.core.tasks.Layout`): U[alpha^2][C][K], V[alpha^2][T][C], M[alpha^2][T][K].
"""
from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction

import numpy as np

from .spec import pair_of

R = 3  # Winograd here is always for 3x3 filters

# Point sets for F(4x4,3x3).  Which one is the default is decided by measured
# float32 error (``compare_point_sets``; numbers in README.md, "Winograd points") and
# checked by tests/core/test_winograd.py::test_default_points_are_the_more_accurate.
POINTS_F4_CLASSIC = (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-2))
POINTS_F4_HALF = (Fraction(0), Fraction(1), Fraction(-1), Fraction(1, 2), Fraction(-2))
POINTS_F2 = (Fraction(0), Fraction(1), Fraction(-1))
DEFAULT_POINTS = {2: POINTS_F2, 4: POINTS_F4_HALF}


def _poly_from_roots(roots):
    """Coefficients (ascending powers) of prod (x - root)."""
    coeffs = [Fraction(1)]
    for root in roots:
        shifted = [Fraction(0)] + coeffs            # x * p(x)
        scaled = [-root * c for c in coeffs] + [Fraction(0)]
        coeffs = [a + b for a, b in zip(shifted, scaled)]
    return coeffs


@dataclasses.dataclass(frozen=True)
class WinogradTransform:
    """F(m x m, r x r) matrices, exact (``*_exact``) and as float64 arrays."""

    m: int
    points: tuple
    AT_exact: tuple   # m x alpha
    G_exact: tuple    # alpha x r
    BT_exact: tuple   # alpha x alpha

    @property
    def alpha(self) -> int:
        return self.m + R - 1

    @property
    def AT(self) -> np.ndarray:
        return np.array(self.AT_exact, dtype=np.float64)

    @property
    def G(self) -> np.ndarray:
        return np.array(self.G_exact, dtype=np.float64)

    @property
    def BT(self) -> np.ndarray:
        return np.array(self.BT_exact, dtype=np.float64)


@functools.lru_cache(maxsize=None)
def transform(m: int = 4, points: tuple | None = None) -> WinogradTransform:
    """Build F(m, 3) from ``alpha - 1`` finite points plus the point at infinity."""
    if m not in (2, 4, 6):
        raise ValueError(f"Winograd output tile m must be 2 or 4 (6 experimental), got {m}")
    pts = tuple(Fraction(p) for p in (points if points is not None else DEFAULT_POINTS.get(m)))
    alpha = m + R - 1
    if len(pts) != alpha - 1 or len(set(pts)) != len(pts):
        raise ValueError(f"F({m},{R}) needs {alpha - 1} distinct finite points, got {points}")
    denominators = [math.prod((pj - pl for pl in pts if pl != pj), start=Fraction(1)) for pj in pts]
    # A^T: evaluate the m-coefficient output polynomial at each point; infinity -> leading coeff.
    AT = [[pj ** i for pj in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    # G: evaluate the filter polynomial, divided by the Lagrange denominator.
    G = [[pj ** k / nj for k in range(R)] for pj, nj in zip(pts, denominators)]
    G.append([Fraction(int(k == R - 1)) for k in range(R)])
    # B^T: Lagrange numerators prod_{l != j}(x - p_l), and M(x) for infinity.
    BT = [_poly_from_roots([pl for pl in pts if pl != pj]) + [Fraction(0)] for pj in pts]
    BT.append(_poly_from_roots(pts))
    return WinogradTransform(m, pts, tuple(map(tuple, AT)), tuple(map(tuple, G)),
                             tuple(map(tuple, BT)))


def tiles_for(out_size: int, m: int) -> int:
    return -(-out_size // m)


# ---------------------------------------------------------------------------
# NumPy references of the four stages (whole tensors, no task split)
# ---------------------------------------------------------------------------

def filter_transform(w: np.ndarray, tf: WinogradTransform, dtype=np.float32) -> np.ndarray:
    """w[K][C][3][3] -> U[alpha^2][C][K]."""
    G = tf.G.astype(dtype)
    u = np.einsum("ir,kcrs,js->ijck", G, w.astype(dtype), G)
    return np.ascontiguousarray(u.reshape(tf.alpha ** 2, w.shape[1], w.shape[0]))


def input_tiles(x_nhwc: np.ndarray, padding: int, m: int, alpha: int,
                out_h: int, out_w: int) -> np.ndarray:
    """Overlapping alpha x alpha windows, zero outside the image: [N][th][tw][alpha][alpha][C]."""
    n, h, w, c = x_nhwc.shape
    th, tw = tiles_for(out_h, m), tiles_for(out_w, m)
    padded = np.zeros((n, th * m + 2, tw * m + 2, c), dtype=x_nhwc.dtype)
    hh = min(h, th * m + 2 - padding)
    ww = min(w, tw * m + 2 - padding)
    padded[:, padding:padding + hh, padding:padding + ww] = x_nhwc[:, :hh, :ww]
    rows = (np.arange(th) * m)[:, None] + np.arange(alpha)[None, :]
    cols = (np.arange(tw) * m)[:, None] + np.arange(alpha)[None, :]
    return padded[:, rows[:, None, :, None], cols[None, :, None, :]]


def input_transform(x_nhwc: np.ndarray, padding: int, tf: WinogradTransform,
                    out_h: int, out_w: int, dtype=np.float32) -> np.ndarray:
    """x[N][H][W][C] -> V[alpha^2][T][C] with T = N * tiles_h * tiles_w."""
    d = input_tiles(x_nhwc.astype(dtype), padding, tf.m, tf.alpha, out_h, out_w)
    BT = tf.BT.astype(dtype)
    v = np.einsum("ia,nxyabc,jb->ijnxyc", BT, d, BT)
    return np.ascontiguousarray(v.reshape(tf.alpha ** 2, -1, x_nhwc.shape[3]))


def batched_gemm(V: np.ndarray, U: np.ndarray) -> np.ndarray:
    """M[p] = V[p] @ U[p] for every transform position p."""
    return np.matmul(V, U)


def output_transform(M: np.ndarray, tf: WinogradTransform, n: int, out_h: int, out_w: int,
                     dtype=np.float32) -> np.ndarray:
    """M[alpha^2][T][K] -> y[N][out_h][out_w][K] (partial edge tiles cropped)."""
    th, tw = tiles_for(out_h, tf.m), tiles_for(out_w, tf.m)
    k = M.shape[2]
    AT = tf.AT.astype(dtype)
    mm = M.astype(dtype).reshape(tf.alpha, tf.alpha, n, th, tw, k)
    y = np.einsum("ia,abnxyk,jb->nxiyjk", AT, mm, AT)
    y = y.reshape(n, th * tf.m, tw * tf.m, k)
    return np.ascontiguousarray(y[:, :out_h, :out_w, :])


def winograd_conv_nhwc(x_nhwc: np.ndarray, w: np.ndarray, padding: int, m: int = 4,
                       points=None, dtype=np.float32) -> np.ndarray:
    """The four stages chained (the stage-level reference; no task split)."""
    tf = transform(m, points)
    n, h, wdt, _ = x_nhwc.shape
    out_h, out_w = h + 2 * padding - 2, wdt + 2 * padding - 2
    U = filter_transform(w, tf, dtype)
    V = input_transform(x_nhwc, padding, tf, out_h, out_w, dtype)
    return output_transform(batched_gemm(V, U), tf, n, out_h, out_w, dtype)


# ---------------------------------------------------------------------------
# Direct convolution reference (any R, S, stride, padding)
# ---------------------------------------------------------------------------

def direct_conv_nchw(x, w, stride=1, padding=0, dtype=np.float64, xp=np):
    """Cross-correlation, x[N][C][H][W], w[K][C][R][S] -> y[N][K][Ho][Wo], accumulated
    in ``dtype``; ``stride`` and ``padding`` an int or an (h, w) pair.  ``xp`` is NumPy, or
    CuPy for the same loop on the GPU."""
    n, c, h, wd = x.shape
    k, c2, r, s = w.shape
    if c != c2:
        raise ValueError(f"input has C={c} channels but the filter expects C={c2}")
    (sh, sw), (ph, pw) = (pair_of(v) for v in (stride, padding))
    ho = (h + 2 * ph - r) // sh + 1
    wo = (wd + 2 * pw - s) // sw + 1
    xpad = xp.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=dtype)
    xpad[:, :, ph:ph + h, pw:pw + wd] = x
    wt = w.astype(dtype)
    y = xp.zeros((k, n, ho, wo), dtype=dtype)
    for i in range(r):
        for j in range(s):
            window = xpad[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]
            y += xp.tensordot(wt[:, :, i, j], window, axes=([1], [1]))    # [k][n][ho][wo]
    return xp.ascontiguousarray(y.transpose(1, 0, 2, 3))


def rel_l2(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN if out holds any NaN)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    denom = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (denom if denom > 0 else 1.0))


def compare_point_sets(m: int = 4, candidates=(POINTS_F4_CLASSIC, POINTS_F4_HALF), trials: int = 4,
                       shape=(2, 64, 64, 20, 20), seed: int = 0) -> list[tuple[tuple, float]]:
    """Measured float32 rel. L2 error of each point set against the float64 direct conv.

    Returns ``[(points, mean error), ...]`` in the order given.
    """
    rng = np.random.default_rng(seed)
    n, c, k, h, wd = shape
    errors = {pts: [] for pts in candidates}
    for _ in range(trials):
        x = rng.standard_normal((n, c, h, wd))
        w = rng.standard_normal((k, c, 3, 3))
        ref = direct_conv_nchw(x, w, 1, 1)
        x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).astype(np.float32)
        for pts in candidates:
            y = winograd_conv_nhwc(x_nhwc, w.astype(np.float32), 1, m, pts)
            errors[pts].append(rel_l2(y.transpose(0, 3, 1, 2), ref))
    return [(pts, float(np.mean(errs))) for pts, errs in errors.items()]
