"""One input rule for every entry point (megawino.core.arguments): integers exact (NumPy integer
scalars are integers, bools and floats are not), arrays float32 (never cast)."""
from __future__ import annotations

import numpy as np
import pytest

import megawino
from megawino.core.arguments import check_float32, integer_argument

X = np.random.default_rng(3).standard_normal((1, 2, 6, 7), dtype=np.float32)
W = np.random.default_rng(4).standard_normal((3, 2, 3, 3), dtype=np.float32)
ENTRY_POINTS = {"conv2d": megawino.conv2d, "conv2d_cpu": megawino.conv2d_cpu}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.int64, np.bool_, np.complex64])
@pytest.mark.parametrize("which", ["x", "w"])
def test_other_dtypes_refused_not_cast(entry, dtype, which):
    x = X.astype(dtype) if which == "x" else X
    w = W.astype(dtype) if which == "w" else W
    with pytest.raises(ValueError, match=f"{which} has dtype .*only float32"):
        ENTRY_POINTS[entry](x, w, padding=1)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("kind", [int, np.int64, np.int32, np.uint8])
def test_numpy_integer_scalars_are_integers(entry, kind):
    expected = megawino.conv2d_cpu(X, W, padding=1, stride=1)
    got = ENTRY_POINTS[entry](X, W, padding=kind(1), stride=kind(1))
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("name", ["padding", "stride"])
@pytest.mark.parametrize("value", [True, np.bool_(True), 1.0, np.float32(1), "1", None])
def test_bools_floats_and_strings_are_not_integers(entry, name, value):
    with pytest.raises(ValueError, match=f"{name} must be an integer"):
        ENTRY_POINTS[entry](X, W, **{name: value})


def test_the_rule_itself():
    assert integer_argument("n", np.int64(3), 1) == 3 and type(integer_argument("n", np.int64(3), 1)) is int
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        integer_argument("n", np.int8(0), 1)
    check_float32("x", X)
    with pytest.raises(ValueError, match="x has dtype None"):
        check_float32("x", [1.0])
