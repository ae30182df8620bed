"""The one rule for the arguments every entry point takes (``megawino.conv2d``,
``megawino.conv2d_cpu``, plans, ``megawino.torch``): integers are exact, arrays are float32.

Integers: Python ints and NumPy integer scalars are the same number; a bool is not an integer
(``True`` as a padding is a bug, not a 1), nor is a float (``1.0``).
Arrays: float32 only; float64, integer, bool and complex arrays are refused, never cast, so a
result is always computed from exactly the values the caller passed.
"""
from __future__ import annotations

import numpy as np


def integer_argument(name: str, value, minimum: int) -> int:
    """``value`` as a Python int >= ``minimum``; ValueError naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_float32(name: str, arr) -> None:
    """ValueError unless ``arr`` (any array with a ``dtype``) holds float32."""
    dtype = getattr(arr, "dtype", None)
    if dtype is None or np.dtype(dtype) != np.float32:
        raise ValueError(f"{name} has dtype {dtype}, only float32 is supported (no silent cast: "
                         f"convert it with .astype(numpy.float32) where that is what you mean)")
