from fractions import Fraction

import numpy as np
import pytest

from megawino.core import winograd as wg


def _conv_1d_check(tf):
    """y = A^T [(G g) * (B^T d)] must equal correlation, exactly in rationals."""
    rng = np.random.default_rng(3)
    alpha = tf.alpha
    for _ in range(5):
        g = [Fraction(int(v)) for v in rng.integers(-9, 9, 3)]
        d = [Fraction(int(v)) for v in rng.integers(-9, 9, alpha)]
        gg = [sum(tf.G_exact[i][k] * g[k] for k in range(3)) for i in range(alpha)]
        dd = [sum(tf.BT_exact[i][k] * d[k] for k in range(alpha)) for i in range(alpha)]
        y = [sum(tf.AT_exact[o][i] * gg[i] * dd[i] for i in range(alpha)) for o in range(tf.m)]
        assert y == [sum(g[k] * d[o + k] for k in range(3)) for o in range(tf.m)]


@pytest.mark.parametrize("m,points", [(2, wg.POINTS_F2), (4, wg.POINTS_F4_CLASSIC),
                                      (4, wg.POINTS_F4_HALF)])
def test_exact_1d_correlation(m, points):
    _conv_1d_check(wg.transform(m, points))


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("padding", [0, 1, 2])
def test_stage_reference_matches_direct(m, padding):
    rng = np.random.default_rng(m + padding)
    x = rng.standard_normal((2, 5, 11, 9))
    w = rng.standard_normal((3, 5, 3, 3))
    ref = wg.direct_conv_nchw(x, w, 1, padding)
    y = wg.winograd_conv_nhwc(np.ascontiguousarray(x.transpose(0, 2, 3, 1)), w, padding, m,
                              dtype=np.float64)
    assert wg.rel_l2(y.transpose(0, 3, 1, 2), ref) < 1e-13


def test_direct_conv_strided_matches_loop():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 7, 6))
    w = rng.standard_normal((3, 2, 3, 2))
    y = wg.direct_conv_nchw(x, w, stride=2, padding=1)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    for k in range(3):
        for i in range(y.shape[2]):
            for j in range(y.shape[3]):
                patch = xp[0, :, 2 * i:2 * i + 3, 2 * j:2 * j + 2]
                assert np.isclose(y[0, k, i, j], np.sum(patch * w[k]))


def test_default_points_are_the_more_accurate():
    """The F(4x4) default is whichever point set measures the smaller float32 error."""
    results = wg.compare_point_sets(trials=2, shape=(1, 32, 32, 16, 16))
    best = min(results, key=lambda r: r[1])[0]
    assert wg.DEFAULT_POINTS[4] == best
    assert all(err < 1e-5 for _, err in results)


def test_bad_transform_arguments():
    with pytest.raises(ValueError):
        wg.transform(3)
    with pytest.raises(ValueError):
        wg.transform(4, (0, 1, 1, 2, -2))
