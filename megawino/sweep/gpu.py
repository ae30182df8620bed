"""The GPU side of :mod:`megawino.sweep`: whether there is a usable GPU (and why
not), what GPU it is, and running, timing and checking one layer on it.

CuPy and the runtime are imported inside the functions: importing this module
never touches CUDA.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from ..core.spec import LayerSpec


def _cupy_problem() -> str:
    """Why CuPy does not import ("" when it does, or when it is simply not installed)."""
    try:
        import cupy  # noqa: F401
        return ""
    except Exception as exc:
        if isinstance(exc, ImportError) and getattr(exc, "name", None) == "cupy":
            return ""
        text = str(exc)
        if "Original error:" in text:      # CuPy wraps the real error in a banner
            text = text.split("Original error:", 1)[1].split("=====", 1)[0]
        text = " ".join(text.split()) or type(exc).__name__
        reason = f"CuPy does not import ({text})"
        shadow = sys.modules.get("cuda")
        where = getattr(shadow, "__file__", None)
        if where and os.path.basename(where) == "__init__.py" and \
                not os.path.isdir(os.path.join(os.path.dirname(where), "pathfinder")):
            reason += f"; {where} shadows NVIDIA's 'cuda' namespace package"
        return reason


def gpu_status():
    """(runtime module or None, why not): the runtime when it imports and sees a GPU.

    Anything going wrong on the way (no runtime module yet, CuPy missing or
    broken, no driver, no device) means "no GPU": the CPU path takes over.
    """
    try:
        from .. import runtime
    except Exception as exc:   # ImportError, or a broken CuPy install raising anything
        return None, f"the GPU runtime does not import ({type(exc).__name__}: {exc})"
    try:
        if runtime.gpu_available():
            return runtime, ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    problem = _cupy_problem()
    if problem:
        return None, problem
    try:
        import cupy  # noqa: F401
    except ImportError:
        return None, "CuPy is not installed"
    return None, "CuPy finds no CUDA device"


def gpu_runtime():
    """The ``megawino.runtime`` module when it imports and sees a GPU, else None."""
    return gpu_status()[0]


def gpu_info() -> dict:
    """CuPy version, GPU name and SM count, CUDA runtime and driver versions (the
    GPU part of :func:`megawino.sweep.machine_info`)."""
    info: dict = {}
    try:
        import cupy
        info["cupy"] = cupy.__version__
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props.get("name", b"")
        info["gpu"] = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        info["gpu_sms"] = int(props.get("multiProcessorCount", 0)) or None
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
        info["cuda_driver"] = cupy.cuda.runtime.driverGetVersion()
    except Exception as err:   # the sweep ran; don't lose its results over metadata
        info["gpu_error"] = f"{type(err).__name__}: {err}"
    return info


def _rotation(cupy, first, spec: LayerSpec, rng: np.random.Generator) -> list:
    """``first`` plus enough fresh random inputs that the L2 cannot serve repeats."""
    from .cpu import _to_layout, random_inputs
    from ..gpu.timing import device_rotation_sets
    sets = device_rotation_sets(first.nbytes)
    return [first] + [cupy.asarray(_to_layout(random_inputs(spec, rng)[0], spec.layout, np))
                      for _ in range(sets - 1)]


def _run_gpu(runtime, spec: LayerSpec, x: np.ndarray, w: np.ndarray, rng: np.random.Generator,
             compare: str | None = None):
    """(backend, time_ms, y as a CuPy NCHW array, cuDNN ms or None, where the plan's parameters
    came from or None).  Timing: ``megawino.gpu.timing`` (rotated inputs, median of CUDA events)."""
    import cupy
    from .cpu import _from_layout, _to_layout
    from ..gpu.timing import time_cuda_stats
    xd = cupy.asarray(_to_layout(x, spec.layout, np))
    wd = cupy.asarray(w)
    y = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)    # poisoned
    backend, algo = ("megakernel", "megakernel") if spec.winograd_eligible else ("gpu-direct", "direct")
    plan = runtime.plan(spec, algo=algo)
    fn, check = (lambda xs: plan(xs, wd, out=y, check=False)), plan.check  # noqa: E731
    out = fn(xd)              # warm-up (compiles), and the output that is checked
    check()
    out = cupy.array(out, copy=True)
    xs = _rotation(cupy, xd, spec, rng)
    ms = time_cuda_stats(fn, xs, check=check)["median_us"] / 1e3
    cudnn_ms = None
    if compare == "cudnn":
        from ..gpu.cudnn import cudnn_fp32_us
        xs_nchw = [_from_layout(x_, spec.layout, cupy) for x_ in xs]
        cudnn_ms = cudnn_fp32_us(spec, xs_nchw, wd)["best_us"] / 1e3
    source = getattr(plan, "choice", None)     # a Winograd plan's ParamsSource
    return backend, ms, _from_layout(out, spec.layout, cupy), cudnn_ms, source and source.as_dict()


def gpu_rel_error(y, x: np.ndarray, w: np.ndarray, spec: LayerSpec) -> float:
    """Relative L2 error of ``y`` (CuPy, NCHW) against the float64 direct convolution
    of the same inputs, computed on the GPU (same loop as ``direct_conv_nchw``)."""
    import cupy
    from ..gpu.timing import gpu_rel_l2
    from ..core.winograd import direct_conv_nchw
    ref = direct_conv_nchw(cupy.asarray(x), cupy.asarray(w), spec.stride, spec.padding,
                           cupy.float64, xp=cupy)
    err = gpu_rel_l2(y, ref)
    del ref
    return err


def run_layer_gpu(runtime, spec: LayerSpec, x: np.ndarray, w: np.ndarray,
                  rng: np.random.Generator, compare: str | None = None):
    """The GPU part of :func:`megawino.sweep.run_layer`: (backend, time_ms, rel. error
    vs float64, cuDNN ms or None, the plan's parameters' source as a dict or None), or (skip
    message, None, None, None, None)."""
    used, ms, y, cudnn_ms, source = _run_gpu(runtime, spec, x, w, rng, compare)
    if ms is None:
        return used, None, None, None, None
    return used, ms, gpu_rel_error(y, x, w, spec), cudnn_ms, source
