"""The numbers docs/numerics.md states, on the CPU executor: how far one NaN or Inf input pixel
spreads, and where finite inputs overflow the Winograd input transform."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from megawino.core.winograd import transform
from megawino.cpu.executor import conv2d_cpu
from megawino.sweep.cpu import direct_conv_float32

H = 12          # 3 tiles of 4 (6 of 2): inside pixels, edges and corners
C, K = 3, 2


def _spread(run, value, i, j, seed=0):
    """Non-finite outputs per output channel (NaN count, Inf count) from one ``value`` pixel."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, C, H, H), dtype=np.float32)
    w = rng.standard_normal((K, C, 3, 3), dtype=np.float32)
    x[0, 1, i, j] = value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # NumPy's "invalid value" in the GEMM
        y = run(x, w)
    return [(int(np.isnan(y[0, k]).sum()), int(np.isinf(y[0, k]).sum())) for k in range(K)]


def _counts(run, value):
    found = set()
    for i in range(H):
        for j in range(H):
            per_channel = _spread(run, value, i, j, seed=i * H + j)
            assert len(set(per_channel)) == 1          # every output channel alike
            found.add(per_channel[0])
    return found


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_one_non_finite_pixel_spreads_to_whole_tiles_as_nan(value):
    f4 = _counts(lambda x, w: conv2d_cpu(x, w, padding=1, m=4), value)
    f2 = _counts(lambda x, w: conv2d_cpu(x, w, padding=1, m=2), value)
    assert f4 == {(16, 0), (32, 0), (64, 0)}
    assert f2 == {(4, 0), (8, 0), (16, 0)}


def test_direct_convolution_keeps_a_pixel_to_its_window():
    direct = lambda x, w: direct_conv_float32(x, w, 1, 1)      # noqa: E731
    assert _counts(direct, np.nan) == {(4, 0), (6, 0), (9, 0)}
    assert _counts(direct, np.inf) == {(0, 4), (0, 6), (0, 9)}          # Inf stays Inf


@pytest.mark.parametrize("m, factor, bound", [(4, 49.0, 6.9e36), (2, 4.0, 8.5e37)])
def test_input_transform_amplification(m, factor, bound):
    bt = np.asarray(transform(m).BT, dtype=np.float64)
    assert np.abs(bt).sum(axis=1).max() ** 2 == factor
    assert np.finfo(np.float32).max / factor == pytest.approx(bound, rel=0.01)


@pytest.mark.parametrize("m, bound", [(4, 6.9e36), (2, 8.5e37)])
def test_large_finite_inputs_overflow_where_direct_does_not(m, bound):
    """Tiny weights keep the true output small: below the bound Winograd is finite, at a few
    times the bound it is not, while the direct convolution stays finite."""
    rng = np.random.default_rng(2)
    base = rng.uniform(0.5, 1, (1, 1, 16, 16)) * rng.choice([-1, 1], (1, 1, 16, 16))
    w = (rng.standard_normal((1, 1, 3, 3)) * 1e-30).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        below = conv2d_cpu((base * bound * 0.99).astype(np.float32), w, padding=1, m=m)
        above_x = (base * bound * 4).astype(np.float32)
        above = conv2d_cpu(above_x, w, padding=1, m=m)
        direct = direct_conv_float32(above_x, w, 1, 1)
    assert np.all(np.isfinite(below))
    assert not np.all(np.isfinite(above)) and np.all(np.isfinite(direct))
