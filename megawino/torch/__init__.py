"""megawino for PyTorch models (needs the ``torch`` extra: ``pip install megawino[torch]``).

* :func:`conv2d`: ``torch.nn.functional.conv2d``'s signature on megawino: CUDA float32
  tensors, zero copy, on torch's current stream; ``backend="cpu"`` runs CPU tensors on
  megawino's CPU executor.
* :func:`convert`: a model's ``nn.Conv2d`` layers that megawino can run become
  :class:`MegawinoConv2d` in place (same parameters and ``state_dict`` keys); the others stay.
* :func:`report`: per layer, what runs it and why (a rich table).

Inference only: under autograd the layers run ``torch.nn.functional.conv2d`` (one warning
per process).  ``torch.compile`` / ``torch.export`` / ``torch.jit.trace`` see each converted
layer as the registered operator ``torch.ops.megawino.conv2d`` (:mod:`.ops`).  Inputs megawino
does not run (float16 / bfloat16 / float64, ``torch.autocast``, an empty batch) run
``nn.Conv2d``'s own convolution, with one note (:mod:`.routing`).  ``import megawino`` does not import this module (nor torch).
"""
from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the machine
    # A missing third-party module (its name given), as Python's own import error says it.
    raise ModuleNotFoundError("megawino.torch needs PyTorch: pip install 'megawino[torch]'", name="torch") from err

from . import ops as _ops  # noqa: F401  (registers torch.ops.megawino.conv2d)
from .functional import ALGO_DESCRIPTIONS, ALGOS, BACKENDS, conv2d, weights_changed
from .modules import ConvertReport, LayerRow, MegawinoConv2d, convert, report, unsupported_reason

__all__ = ["conv2d", "convert", "report", "MegawinoConv2d", "ConvertReport", "LayerRow",
           "unsupported_reason", "weights_changed", "ALGOS", "BACKENDS", "ALGO_DESCRIPTIONS"]
