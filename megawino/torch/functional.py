"""``megawino.torch.conv2d``: torch.nn.functional.conv2d's signature on megawino.

CUDA float32 tensors run on the GPU runtime (:mod:`megawino.torch.gpu`: zero copy, on torch's
current stream, no host synchronisation); CPU tensors run megawino's CPU executor when
``backend="cpu"`` is asked for.  Every refusal is a ValueError naming the argument, raised
before anything compiles, allocates or launches.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..core.arguments import integer_argument, pair_argument
from ..gpu.nvrtc import DEFAULT_GEMM_MATH, check_gemm_math
from .gpu import MEGAWINO_ALGOS, is_channels_last, run_gpu, weight_token, weights_changed
from .routing import PYTORCH_REASONS, traced_conv2d, tracing

__all__ = ["conv2d", "conv2d_with_algo", "conv_arguments", "weight_token", "weights_changed",
           "BACKENDS", "ALGOS", "ALGO_DESCRIPTIONS"]

# "auto": CUDA tensors on the GPU runtime, CPU tensors refused; "gpu": CUDA tensors only;
# "cpu": CPU tensors through the CPU executor (slow: it runs the task list in Python, for tests).
BACKENDS = ("auto", "gpu", "cpu")
ALGOS = ("auto",) + MEGAWINO_ALGOS + ("pytorch",)
# What ran, for the algorithms that are not megawino's own GPU paths (shown by convert's report).
ALGO_DESCRIPTIONS = {
    "pytorch": "torch.nn.functional.conv2d in IEEE fp32 (measured faster here, or asked for)",
    "cpu-executor": "megawino's CPU executor (Winograd task list)",
    "pytorch-cpu": "torch.nn.functional.conv2d: the CPU executor runs 3x3 stride 1, equal padding only",
    "pytorch-autograd": "torch.nn.functional.conv2d: under autograd (training is out of scope)",
    **PYTORCH_REASONS,
}


class ConvArguments(NamedTuple):
    stride: int | tuple[int, int]       # an int where both dimensions agree (LayerSpec's form)
    padding: int | tuple[int, int]


def _integer(value):
    """A 0-d integer tensor as the int it holds (torch takes those); anything else as it is, for
    the rule of every entry point (megawino.core.arguments: Python and NumPy integers, not bools
    or floats) to judge."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype in _INTEGER_DTYPES:
        return int(value.item())
    return value


_INTEGER_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _pair_argument(value, name: str, minimum: int):
    """An int or an (h, w) pair of ints as LayerSpec takes it (equal members as one int)."""
    items = tuple(value) if isinstance(value, (tuple, list, torch.Size)) else (value,)
    if len(items) not in (1, 2):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    return pair_argument(name, tuple(_integer(v) for v in items), minimum)


def conv_arguments(kernel_size, stride=1, padding=0, dilation=1, groups=1) -> ConvArguments:
    """Validate F.conv2d's stride / padding / dilation / groups for a ``kernel_size`` (R, S)
    filter as megawino runs them: ValueError naming the argument, else (stride, padding), each an
    int or an (h, w) pair where the dimensions differ (the direct path runs those)."""
    r, s = (int(v) for v in kernel_size)
    if _pair_argument(dilation, "dilation", 1) != 1:
        raise ValueError(f"dilation={dilation!r}: megawino runs dilation 1 only")
    if integer_argument("groups", _integer(groups), 1) != 1:
        raise ValueError(f"groups={groups!r}: megawino runs groups=1 only (no grouped or depthwise convolution)")
    stride = _pair_argument(stride, "stride", 1)
    if isinstance(padding, str):
        if padding == "valid":
            return ConvArguments(stride, 0)
        if padding != "same":
            raise ValueError(f"padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")
        if stride != 1:
            raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
        if r % 2 == 0 or s % 2 == 0:
            raise ValueError(f"padding='same' with a {r}x{s} filter pads one side more than the other; "
                             f"megawino runs 'same' for odd filter sizes only")
        return ConvArguments(stride, pair_argument("padding", (r // 2, s // 2), 0))
    return ConvArguments(stride, _pair_argument(padding, "padding", 0))


def _check_tensors(input, weight, bias) -> None:
    named = [("input", input), ("weight", weight)] + ([("bias", bias)] if bias is not None else [])
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name} has dtype {t.dtype}: megawino runs float32 only")
        if t.device != input.device:
            raise ValueError(f"{name} is on {t.device} but input is on {input.device}")
    if input.dim() not in (3, 4):
        raise ValueError(f"input must be 4-D [N, C, H, W] (or 3-D unbatched), got shape {tuple(input.shape)}")
    if weight.dim() != 4:
        raise ValueError(f"weight must be 4-D [K, C, R, S], got shape {tuple(weight.shape)}")
    if input.shape[-3] != weight.shape[1]:
        raise ValueError(f"weight expects {weight.shape[1]} input channels, input has {input.shape[-3]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if device.type == "cuda" and backend != "cpu":
        return "gpu"
    if device.type == "cpu" and backend == "cpu":
        return "cpu"
    if device.type == "cpu":
        raise ValueError("input is a CPU tensor: megawino runs CUDA tensors; pass backend='cpu' for "
                         "megawino's CPU executor (slow: meant for tests)")
    raise ValueError(f"input is on {device}: backend={backend!r} runs "
                     f"{'CPU' if backend == 'cpu' else 'CUDA'} tensors")


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------

_autograd_warned = False


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           backend: str = "auto", algo: str = "auto", gemm_math: str = DEFAULT_GEMM_MATH):
    """torch.nn.functional.conv2d on megawino (float32, dilation 1, groups 1; ``stride`` and
    ``padding`` an int or a pair; ``padding`` may be ``"valid"`` or ``"same"`` (odd filters)).

    ``backend``: ``"auto"`` / ``"gpu"`` run CUDA tensors on the GPU, ``"cpu"`` runs CPU tensors
    on the CPU executor (3x3 stride 1; other shapes go to torch).  ``algo``: ``"auto"``
    measures megawino's paths and PyTorch's once per shape and GPU and runs the fastest;
    ``"megakernel"``, ``"nonfused"``, ``"direct"``, ``"pointwise"`` or ``"pytorch"`` force one.  Under autograd
    it runs torch.nn.functional.conv2d (one warning per process).  Traced (torch.compile,
    torch.export, torch.jit.trace) it is the registered operator ``torch.ops.megawino.conv2d``."""
    if tracing(input) and not (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (input, weight, bias))):
        _check_tensors(input, weight, bias)
        args = conv_arguments(weight.shape[2:], stride, padding, dilation, groups)
        _resolve_backend(backend, input.device)
        if algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
        check_gemm_math(gemm_math)
        return traced_conv2d(input, weight, bias, _pair(args.stride), _pair(args.padding), 0, backend, algo,
                             gemm_math)
    return conv2d_with_algo(input, weight, bias, stride, padding, dilation, groups,
                            backend=backend, algo=algo, gemm_math=gemm_math)[0]


def conv2d_with_algo(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
                     backend: str = "auto", algo: str = "auto", gemm_math: str = DEFAULT_GEMM_MATH):
    """:func:`conv2d` and the name of what ran (an ALGOS name, or an ALGO_DESCRIPTIONS key)."""
    global _autograd_warned
    _check_tensors(input, weight, bias)
    args = conv_arguments(weight.shape[2:], stride, padding, dilation, groups)
    device = _resolve_backend(backend, input.device)
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
    if device == "cpu" and algo not in ("auto", "pytorch"):
        raise ValueError(f"algo={algo!r} needs the GPU; backend='cpu' takes algo 'auto' or 'pytorch'")
    check_gemm_math(gemm_math)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (input, weight, bias)):
        if not _autograd_warned:
            _autograd_warned = True
            warnings.warn("megawino.torch runs inference only: under autograd it calls "
                          "torch.nn.functional.conv2d (run the model under torch.inference_mode() "
                          "or torch.no_grad() to use megawino)", stacklevel=3)
        return F.conv2d(input, weight, bias, args.stride, args.padding), "pytorch-autograd"
    if input.numel() == 0:
        # An empty batch: PyTorch's empty output (or its error, for shapes it refuses).
        return F.conv2d(input, weight, bias, args.stride, args.padding), "pytorch-empty"
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    # torch's rule: channels_last output when the input or the weight is channels_last.
    channels_last = is_channels_last(x) or is_channels_last(weight)
    run = _run_cpu if device == "cpu" else run_gpu
    out, ran = run(x, weight, args.stride, args.padding, channels_last, algo, gemm_math)
    if bias is not None:
        out.add_(bias.view(1, -1, 1, 1))
    return (out.squeeze(0) if unbatched else out), ran


def _pair(value) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (tuple, list)) else [int(value)] * 2


def _run_cpu(x, weight, stride, padding, channels_last: bool, algo: str, gemm_math: str):
    r, s = weight.shape[2:]
    if algo == "pytorch" or (r, s) != (3, 3) or stride != 1 or not isinstance(padding, int):
        return F.conv2d(x, weight, None, stride, padding), "pytorch" if algo == "pytorch" else "pytorch-cpu"
    from ..cpu.executor import conv2d_cpu
    w = weight.detach().contiguous().numpy()
    if channels_last:
        y = conv2d_cpu(x.detach().permute(0, 2, 3, 1).contiguous().numpy(), w, padding=padding,
                       layout="NHWC")
        return torch.from_numpy(y).permute(0, 3, 1, 2), "cpu-executor"
    return torch.from_numpy(conv2d_cpu(x.detach().contiguous().numpy(), w, padding=padding)), "cpu-executor"
