"""The registered operator ``torch.ops.megawino.conv2d``.

``torch.compile``, ``torch.export`` and ``torch.jit.trace`` see a converted layer (and
:func:`megawino.torch.conv2d`) as this one operator: its fake implementation gives the output's
shape, dtype, device and strides without running anything, so the compiled graph holds the
operator (no graph break) and calls megawino's kernels at run time.  The CUDA stream, the weight
tokens and the per-layer choice are read inside the implementation, where the tensors are real.

Eager calls of a converted layer run the same implementation without the dispatcher, whose host
time per call would cost more than a small layer's convolution at batch 1.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch

from .functional import conv2d_with_algo

__all__ = ["conv2d_op", "register_layer", "output_shape"]

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
