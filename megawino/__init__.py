"""megawino: Winograd F(4x4,3x3) convolution in one persistent CUDA megakernel.

Importing megawino never touches CUDA; the GPU runtime loads on first use.
"""
from __future__ import annotations

from .spec import LayerSpec, parse_shape

__version__ = "0.1.0"
__all__ = ["LayerSpec", "parse_shape", "conv2d", "plan", "gpu_available", "synchronize", "clear_cache", "__version__"]

_RUNTIME_NAMES = {"conv2d", "plan", "Plan", "gpu_available", "synchronize", "clear_cache"}


def __getattr__(name):
    if name in _RUNTIME_NAMES:
        from . import runtime
        return getattr(runtime, name)
    raise AttributeError(f"module 'megawino' has no attribute {name!r}")
