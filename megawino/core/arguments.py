"""The one rule for the arguments every entry point takes (``megawino.conv2d``,
``megawino.conv2d_cpu``, plans, ``megawino.torch``): integers are exact, arrays are float32.

Integers: Python ints and NumPy integer scalars are the same number; a bool is not an integer
(``True`` as a padding is a bug, not a 1), nor is a float (``1.0``).
Arrays: float32 only; float64, integer, bool and complex arrays are refused, never cast, so a
result is always computed from exactly the values the caller passed.
"""
from __future__ import annotations

import argparse
import math

import numpy as np


def integer_argument(name: str, value, minimum: int) -> int:
    """``value`` as a Python int >= ``minimum``; ValueError naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def pair_argument(name: str, value, minimum: int):
    """``value`` (an integer, or an (h, w) pair of integers, each >= ``minimum``) as a Python int,
    or as a tuple where the two differ: one form per layer, so a pair of equal values is the int
    an existing caller passes.  ValueError naming ``name`` otherwise."""
    if not isinstance(value, (tuple, list)):
        return integer_argument(name, value, minimum)
    if len(value) not in (1, 2):
        raise ValueError(f"{name} must be an integer or an (h, w) pair of integers, got {value!r}")
    items = [integer_argument(name, v, minimum) for v in value]
    return items[0] if len(set(items)) == 1 else tuple(items)


def check_float32(name: str, arr) -> None:
    """ValueError unless ``arr`` (any array with a ``dtype``) holds float32."""
    dtype = getattr(arr, "dtype", None)
    if dtype is None or np.dtype(dtype) != np.float32:
        raise ValueError(f"{name} has dtype {dtype}, only float32 is supported (no silent cast: "
                         f"convert it with .astype(numpy.float32) where that is what you mean)")


# Command-line types (argparse): the same numbers, refused with argparse's one-line error.

def _integer(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _integer(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _integer(text, 0, "a non-negative integer")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value
