"""The checks of every launch route (megawino.conv2d, a plan's call, megawino.torch's first call
of a layer) before anything launches, and the settings they read, in one place: the GPU is
there, the arrays are the layer's (shape, dtype, device), the output aliases no input, and inputs
the kernels cannot read as they are (strided or misaligned) are copied."""
from __future__ import annotations

import math
import os

import numpy as np

from ..core.arguments import check_float32
from . import workspace
from .nvrtc import cupy_module

ENV_WATCHDOG = "MEGAWINO_WATCHDOG_S"
DEFAULT_WATCHDOG_S = 2.0


# The watchdog's limit in seconds: the kernel counts it in int64 nanoseconds, and a limit under a
# millisecond would fire on a healthy launch (1e-300 s is 0 ns), one over a million seconds is
# no watchdog (1e10 s overflows the nanoseconds).
WATCHDOG_RANGE_S = (1e-3, 1e6)


def _range_words(number_type, minimum, maximum) -> str:
    number, fmt = ("a whole number", "d") if number_type is int else ("a number", "g")
    if maximum is None:
        return f"{number} >= {minimum:{fmt}}"
    return f"{number} from {minimum:{fmt}} to {maximum:{fmt}}"


def env_number(name: str, default, number_type=int, minimum=0, maximum=None):
    """``$name`` as a ``number_type`` number within [``minimum``, ``maximum``] (``default`` when unset);
    a one-line ValueError naming the variable and the accepted range otherwise."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    accepted = _range_words(number_type, minimum, maximum)
    try:
        value = number_type(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be {accepted}, got {raw!r}") from None
    if (number_type is float and not math.isfinite(value)) or value < minimum \
            or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {accepted}, got {raw!r}")
    return value


def check_timeout_s(value, name: str = "timeout_s") -> float:
    """A watchdog limit in seconds within WATCHDOG_RANGE_S, as a float; ValueError otherwise."""
    low, high = WATCHDOG_RANGE_S
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{name} must be {_range_words(float, low, high)} seconds, got {value!r}")
    return float(value)


def default_timeout_s() -> float:
    """The watchdog limit of one wait: ``$MEGAWINO_WATCHDOG_S`` (widen it under
    compute-sanitizer, a debugger or time-slicing), else 2 s."""
    return env_number(ENV_WATCHDOG, DEFAULT_WATCHDOG_S, float, *WATCHDOG_RANGE_S)


def require_gpu():
    """CuPy with a usable device, or one line saying what is missing."""
    cupy = cupy_module()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:
        raise RuntimeError(f"megawino's GPU runtime found no usable CUDA device ({err}); "
                           "megawino.conv2d_cpu runs the reference path on the CPU") from None
    if count < 1:
        raise RuntimeError("megawino's GPU runtime found no CUDA device; "
                           "megawino.conv2d_cpu runs the reference path on the CPU")
    return cupy


def check_array(cupy, name: str, arr, shape, device: int) -> None:
    """ValueError unless ``arr`` is a float32 CuPy array of ``shape`` on ``device``."""
    if not isinstance(arr, cupy.ndarray):
        raise ValueError(f"{name} must be a CuPy array, got {type(arr).__name__}")
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, the layer's is {tuple(shape)}")
    check_float32(name, arr)
    if arr.device.id != device:
        raise ValueError(f"{name} is on device {arr.device.id}, the call runs on device {device}")


def kernel_ready(cupy, arr):
    """``arr`` as the kernels read it: C-contiguous and 16-byte aligned (copied when not)."""
    if arr.flags.c_contiguous and arr.data.ptr % 16 == 0:
        return arr
    out = workspace.alloc(arr.shape, arr.dtype)
    out[...] = arr
    return out


def check_out(cupy, out, shape, device: int, inputs) -> None:
    check_array(cupy, "out", out, shape, device)
    if not out.flags.c_contiguous or out.data.ptr % 16:
        raise ValueError("out must be C-contiguous and 16-byte aligned (the kernels write 16-byte vectors)")
    lo, hi = out.data.ptr, out.data.ptr + out.nbytes
    for name, arr in inputs:
        if arr.data.ptr < hi and lo < arr.data.ptr + arr.nbytes:
            raise ValueError(f"out overlaps {name}: the output must not alias an input")


def check_call(cupy, spec, device: int, x, w, out) -> None:
    """The one set of array checks of every launch route (megawino.gpu.route): ``x``, ``w`` and
    ``out`` (when given) are float32 CuPy arrays of ``spec``'s shapes on ``device``, and ``out``
    is C-contiguous, 16-byte aligned and aliases neither input."""
    check_array(cupy, "x", x, spec.input_shape, device)
    check_array(cupy, "w", w, spec.weight_shape, device)
    if out is not None:
        check_out(cupy, out, spec.output_shape, device, (("x", x), ("w", w)))


def check_options(check, weight_token) -> None:
    """The call options every launch route takes: ``check`` a bool, ``weight_token`` hashable."""
    if not isinstance(check, bool):
        raise ValueError(f"check must be True or False, got {check!r}")
    if weight_token is not None:
        try:
            hash(weight_token)
        except TypeError:
            raise ValueError(f"weight_token must be hashable, got {type(weight_token).__name__}") from None


def prepare_call(spec, device: int, x, w, out, check: bool = True, weight_token=None):
    """(x, w, out) ready for a plan's launch: the options pass :func:`check_options`, the plan's
    device is the current one, the arrays pass :func:`check_call`, the output is allocated when
    None, inputs are copied where the kernels cannot read them as they are."""
    check_options(check, weight_token)
    cupy = cupy_module()
    current = cupy.cuda.runtime.getDevice()
    if current != device:
        raise ValueError(f"this plan was made on device {device}, the current device is {current}")
    check_call(cupy, spec, device, x, w, out)
    return ready_arrays(spec, x, w, out)


def ready_arrays(spec, x, w, out):
    """Checked (x, w, out) as the kernels take them: inputs copied where they cannot be read as
    they are, the output allocated when None."""
    cupy = cupy_module()
    if out is None:
        out = workspace.alloc(spec.output_shape, np.float32)
    return kernel_ready(cupy, x), kernel_ready(cupy, w), out
