"""Which way a call of a converted layer or of :func:`megawino.torch.conv2d` goes.

* Traced (:func:`tracing`: torch.compile, torch.export, torch.jit.trace, fake tensors) it is the
  registered operator ``torch.ops.megawino.conv2d`` (:mod:`megawino.torch.ops`).
* :func:`pytorch_reason` keeps a converted model accepting every input the unconverted one
  accepts: where megawino does not run (float16 / bfloat16 / float64 tensors, ``torch.autocast``,
  an empty batch, a tensor on a device the layer's backend does not run) the layer runs
  ``nn.Conv2d``'s own forward, with one note per reason and process (:func:`note_pytorch`).
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["PYTORCH_REASONS", "pytorch_reason", "note_pytorch", "tracing", "traced_conv2d"]

# What a converted layer runs instead of megawino, and why (its report's note for the layer).
PYTORCH_REASONS = {
    "pytorch-autocast": "nn.Conv2d's convolution under torch.autocast (megawino runs float32 only)",
    "pytorch-dtype": "nn.Conv2d's convolution in the input's dtype (megawino runs float32 only)",
    "pytorch-empty": "nn.Conv2d's convolution: the input has no elements",
    "pytorch-device": "nn.Conv2d's convolution: the layer's backend does not run tensors on this device",
}

_noted: set = set()


def pytorch_reason(input: torch.Tensor, weight: torch.Tensor, bias, backend: str,
                   traced: bool = False) -> str | None:
    """The PYTORCH_REASONS key saying why this call of a converted layer runs PyTorch, or None
    where megawino runs it (autograd aside: :func:`megawino.torch.conv2d` falls back there).
    ``traced``: a batch size is not known yet (the operator's implementation checks it)."""
    device = input.device.type
    if torch.is_autocast_enabled(device):
        return "pytorch-autocast"
    f32 = torch.float32
    if input.dtype is not f32 or weight.dtype is not f32 or (bias is not None and bias.dtype is not f32):
        return "pytorch-dtype"
    if (device == "cpu") != (backend == "cpu") or (device != "cpu" and device != "cuda"):
        return "pytorch-device"
    if not traced and 0 in input.shape:
        return "pytorch-empty"
    return None


def note_pytorch(reason: str, input: torch.Tensor) -> None:
    """One warning per reason and process that a converted layer runs PyTorch's convolution."""
    if reason in _noted or reason == "pytorch-empty" or torch.compiler.is_compiling():
        return
    _noted.add(reason)
    detail = {"pytorch-autocast": f"runs under torch.autocast({input.device.type!r}) (megawino runs float32 only)",
              "pytorch-dtype": f"got {input.dtype} tensors (megawino runs float32 only)",
              "pytorch-device": f"got a tensor on {input.device}, which its backend does not run"}[reason]
    warnings.warn(f"megawino.torch: a converted layer {detail}: it runs nn.Conv2d's own convolution "
                  f"there, as the unconverted model does", stacklevel=4)


def tracing(input: torch.Tensor) -> bool:
    """Whether this call is being traced (torch.compile, torch.export, torch.jit.trace, or any
    fake or functional tensor), where the layer must be the registered operator."""
    cls = type(input)
    if cls is not torch.Tensor and cls is not torch.nn.Parameter and isinstance(input, torch.Tensor):
        return True
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


def traced_conv2d(input, weight, bias, stride, padding, layer: int, backend: str, algo: str,
                  gemm_math: str) -> torch.Tensor:
    """The registered operator on a 4-D or 3-D (unbatched) input (megawino.torch's __init__
    imports megawino.torch.ops, which registers it)."""
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    out = torch.ops.megawino.conv2d(x, weight, bias, list(stride), list(padding), layer, backend, algo, gemm_math)
    return out.squeeze(0) if unbatched else out
