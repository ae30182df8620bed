"""The registered operator ``torch.ops.megawino.conv2d`` and the rule for what PyTorch runs.

``torch.compile``, ``torch.export`` and ``torch.jit.trace`` see a converted layer (and
:func:`megawino.torch.conv2d`) as this one operator: its fake implementation gives the output's
shape, dtype, device and strides without running anything, so the compiled graph holds the
operator (no graph break) and calls megawino's kernels at run time.  The CUDA stream, the weight
tokens and the per-layer choice are read inside the implementation, where the tensors are real.

Eager calls of a converted layer run the same implementation without the dispatcher, whose host
time (10-20 us a call) would cost more than a small layer's convolution at batch 1.

:func:`pytorch_reason` is the rule that keeps a converted model accepting every input the
unconverted one accepts: where megawino does not run (float16 / bfloat16 / float64 tensors,
``torch.autocast``, an empty batch, a tensor on a device the layer's backend does not run) the
layer runs ``nn.Conv2d``'s own forward, with one note per reason and process.
"""
from __future__ import annotations

import itertools
import warnings
import weakref
from typing import Optional

import torch

__all__ = ["conv2d_op", "traced_conv2d", "tracing", "pytorch_reason", "note_pytorch", "register_layer", "PYTORCH_REASONS",
           "output_shape"]

# What a converted layer runs instead of megawino, and why (its report's note for the layer).
PYTORCH_REASONS = {
    "pytorch-autocast": "nn.Conv2d's convolution under torch.autocast (megawino runs float32 only)",
    "pytorch-dtype": "nn.Conv2d's convolution in the input's dtype (megawino runs float32 only)",
    "pytorch-empty": "nn.Conv2d's convolution: the input has no elements",
    "pytorch-device": "nn.Conv2d's convolution: the layer's backend does not run tensors on this device",
}

_noted: set = set()


def pytorch_reason(input: torch.Tensor, weight: torch.Tensor, bias, backend: str) -> str | None:
    """The PYTORCH_REASONS key saying why this call of a converted layer runs PyTorch, or None
    where megawino runs it (autograd aside: :func:`megawino.torch.conv2d` falls back there)."""
    device = input.device.type
    if torch.is_autocast_enabled(device):
        return "pytorch-autocast"
    if input.dtype != torch.float32 or weight.dtype != torch.float32 or (
            bias is not None and bias.dtype != torch.float32):
        return "pytorch-dtype"
    # Traced, a batch size is not known: the operator's implementation checks it at run time.
    if not tracing(input) and 0 in input.shape:
        return "pytorch-empty"
    if (device == "cpu") != (backend == "cpu") or device not in ("cpu", "cuda"):
        return "pytorch-device"
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
    return (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or (isinstance(input, torch.Tensor) and type(input) not in (torch.Tensor, torch.nn.Parameter)))


# ---------------------------------------------------------------------------
# Converted layers by id: the operator's integer argument names the layer that called it
# ---------------------------------------------------------------------------

_LAYER_IDS = itertools.count(1)
_LAYERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # id -> MegawinoConv2d


def register_layer(module) -> int:
    """A new id for ``module`` (a converted layer), under which the operator finds it."""
    layer = next(_LAYER_IDS)
    _LAYERS[layer] = module
    return layer


def output_shape(input_shape, weight_shape, stride, padding) -> tuple:
    """F.conv2d's output shape (dilation 1) for a 4-D input."""
    n, _, h, w = input_shape
    k, _, r, s = weight_shape
    return (n, k, (h + 2 * padding[0] - r) // stride[0] + 1, (w + 2 * padding[1] - s) // stride[1] + 1)


def _channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _output_format(input: torch.Tensor, weight: torch.Tensor):
    # torch's rule: channels_last output when the input or the weight is channels_last.
    return torch.channels_last if _channels_last(input) or _channels_last(weight) else torch.contiguous_format


def _layout_tags():
    """Inductor must hand the operator its inputs in the strides it was traced with (the output's
    layout follows the input's)."""
    for name in ("needs_exact_strides", "needs_fixed_stride_order"):
        tag = getattr(torch.Tag, name, None)
        if tag is not None:
            return (tag,)
    return ()


def _custom_op(fn):
    try:
        return torch.library.custom_op("megawino::conv2d", mutates_args=(), tags=_layout_tags())(fn)
    except TypeError:       # a torch whose custom_op takes no tags (inductor keeps strides there)
        return torch.library.custom_op("megawino::conv2d", mutates_args=())(fn)


@_custom_op
def conv2d_op(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], stride: list[int],
              padding: list[int], layer: int, backend: str, algo: str, gemm_math: str) -> torch.Tensor:
    """megawino's convolution of a 4-D ``input`` (dilation 1, groups 1), bias added; ``layer``:
    the converted layer's id (0: none), whose per-layer choice and prepared weights it uses."""
    module = _LAYERS.get(layer) if layer else None
    # An id read back from a saved program may name another layer of this process: its own only
    # where every setting agrees.
    if module is not None and module.megawino_arguments() == (stride, padding, backend, algo, gemm_math) \
            and module.weight.shape == weight.shape:
        out = module.megawino_forward(input, weight, bias)
    else:
        from .functional import conv2d_with_algo
        out = conv2d_with_algo(input, weight, bias, tuple(stride), tuple(padding), backend=backend,
                               algo=algo, gemm_math=gemm_math)[0]
    # The fake implementation's strides, exactly (a size-1 dimension leaves PyTorch's own
    # convolution free to give other strides for the same layout).
    expected = torch.empty(out.shape, device="meta", memory_format=_output_format(input, weight)).stride()
    if out.stride() != expected:
        out = torch.empty_strided(out.shape, expected, dtype=out.dtype, device=out.device).copy_(out)
    return out


@conv2d_op.register_fake
def _conv2d_fake(input, weight, bias, stride, padding, layer, backend, algo, gemm_math):
    torch._check(input.dim() == 4 and weight.dim() == 4, lambda: "megawino::conv2d takes 4-D input and weight")
    return torch.empty(output_shape(input.shape, weight.shape, stride, padding), dtype=input.dtype,
                       device=input.device, memory_format=_output_format(input, weight))


def traced_conv2d(input, weight, bias, stride, padding, layer: int, backend: str, algo: str,
                  gemm_math: str) -> torch.Tensor:
    """The registered operator on a 4-D or 3-D (unbatched) input."""
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    out = torch.ops.megawino.conv2d(x, weight, bias, list(stride), list(padding), layer, backend, algo, gemm_math)
    return out.squeeze(0) if unbatched else out


def _setup_backward(ctx, inputs, output):
    input, weight, bias, stride, padding = inputs[:5]
    ctx.save_for_backward(input, weight)
    ctx.stride, ctx.padding, ctx.has_bias = list(stride), list(padding), bias is not None


def _backward(ctx, grad):
    # PyTorch's convolution gradients: megawino runs the forward only.
    input, weight = ctx.saved_tensors
    grad_input = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_input = torch.nn.grad.conv2d_input(input.shape, weight, grad, ctx.stride, ctx.padding)
    if ctx.needs_input_grad[1]:
        grad_weight = torch.nn.grad.conv2d_weight(input, weight.shape, grad, ctx.stride, ctx.padding)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        grad_bias = grad.sum((0, 2, 3))
    return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


conv2d_op.register_autograd(_backward, setup_context=_setup_backward)
