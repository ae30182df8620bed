"""megawino: Winograd F(4x4,3x3) convolution in one persistent CUDA megakernel.

Importing megawino never touches CUDA (nor needs CuPy); the GPU runtime loads on
first use of :func:`conv2d` / :func:`plan`, the CPU executor on first use of
:func:`conv2d_cpu`.
"""
from __future__ import annotations

from .core.spec import LayerSpec, parse_shape

__version__ = "0.1.0"     # the one place the version is written (pyproject.toml reads it)

# Lazy exports: name -> the module that defines it (imported on first access).
_LAZY = {"conv2d": "runtime", "plan": "runtime", "Plan": "runtime", "gpu_available": "runtime",
         "synchronize": "runtime", "clear_cache": "runtime", "conv2d_cpu": "cpu.executor"}

__all__ = ["LayerSpec", "parse_shape", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'megawino' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
