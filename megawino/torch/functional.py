"""``megawino.torch.conv2d``: torch.nn.functional.conv2d's signature on megawino.

CUDA float32 tensors run on the GPU runtime (zero copy through DLPack, on torch's current
stream, no host synchronisation); CPU tensors run megawino's CPU executor when
``backend="cpu"`` is asked for.  Every refusal is a ValueError naming the argument, raised
before anything compiles, allocates or launches.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..nvrtc import DEFAULT_GEMM_MATH, check_gemm_math
from ..resources import source_hash
from ..spec import LayerSpec

__all__ = ["conv2d", "conv2d_with_algo", "conv_arguments", "weight_token", "weights_changed",
           "BACKENDS", "ALGOS", "ALGO_NOTES"]

# "auto": CUDA tensors on the GPU runtime, CPU tensors refused; "gpu": CUDA tensors only;
# "cpu": CPU tensors through the CPU executor (slow: it runs the task list in Python, for tests).
BACKENDS = ("auto", "gpu", "cpu")
MEGAWINO_ALGOS = ("megakernel", "nonfused", "direct")
ALGOS = ("auto",) + MEGAWINO_ALGOS + ("pytorch",)
# What ran, for the algorithms that are not megawino's own GPU paths (shown by convert's report).
ALGO_NOTES = {
    "pytorch": "torch.nn.functional.conv2d in IEEE fp32 (measured faster here, or asked for)",
    "cpu-executor": "megawino's CPU executor (Winograd task list)",
    "pytorch-cpu": "torch.nn.functional.conv2d: the CPU executor runs 3x3 stride 1 only",
    "pytorch-autograd": "torch.nn.functional.conv2d: under autograd (training is out of scope)",
}


class ConvArguments(NamedTuple):
    stride: int
    padding: int


def _single(value, name: str) -> int:
    """An int, or a 1- or 2-sequence of equal ints, as one int; ValueError naming ``name``."""
    if isinstance(value, (tuple, list, torch.Size)):
        items = [_integer(v, name) for v in value]
        if len(items) not in (1, 2) or len(set(items)) != 1:
            raise ValueError(f"{name}={tuple(items)!r}: megawino runs the same {name} in both "
                             f"spatial dimensions only")
        return items[0]
    return _integer(value, name)


def _integer(value, name: str) -> int:
    """``value`` as an int (Python, NumPy or 0-d tensor integers; not bools)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}") from None


def conv_arguments(kernel_size, stride=1, padding=0, dilation=1, groups=1) -> ConvArguments:
    """Validate F.conv2d's stride / padding / dilation / groups for a ``kernel_size`` (R, S)
    filter as megawino runs them: ValueError naming the argument, else (stride, padding) ints."""
    r, s = (int(v) for v in kernel_size)
    if _single(dilation, "dilation") != 1:
        raise ValueError(f"dilation={dilation!r}: megawino runs dilation 1 only")
    if _integer(groups, "groups") != 1:
        raise ValueError(f"groups={groups!r}: megawino runs groups=1 only (no grouped or depthwise convolution)")
    stride = _single(stride, "stride")
    if stride < 1:
        raise ValueError(f"stride must be positive, got {stride}")
    if isinstance(padding, str):
        if padding == "valid":
            return ConvArguments(stride, 0)
        if padding != "same":
            raise ValueError(f"padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")
        if stride != 1:
            raise ValueError(f"padding='same' needs stride 1, got stride={stride}")
        if r != s or r % 2 == 0:
            raise ValueError(f"padding='same' with a {r}x{s} filter pads unequally; megawino runs "
                             f"'same' for odd square filters only")
        return ConvArguments(stride, r // 2)
    padding = _single(padding, "padding")
    if padding < 0:
        raise ValueError(f"padding must be non-negative, got {padding}")
    return ConvArguments(stride, padding)


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


def _channels_last(t: torch.Tensor) -> bool:
    """True when ``t`` is laid out channels_last and not also plainly contiguous (torch's rule)."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


# ---------------------------------------------------------------------------
# Weight tokens: the runtime reuses a transformed filter while its token is unchanged
# ---------------------------------------------------------------------------

_SERIALS = itertools.count()
_generation = 0


def weights_changed() -> None:
    """Invalidate every cached transformed filter: call this after changing weights in a way
    PyTorch's version counter does not see (writes through ``tensor.data``)."""
    global _generation
    _generation += 1


def weight_token(weight: torch.Tensor):
    """Hashable identity of ``weight``'s current contents, or None where it cannot be known.

    A per-object serial (a new tensor at a reused address gets a new token), the address,
    PyTorch's version counter (bumped by every in-place write, load_state_dict included),
    shape, device and the :func:`weights_changed` generation.  The runtime keys prepared
    weights by token, path and layout, so one token serves every algorithm."""
    serial = getattr(weight, "_megawino_serial", None)
    if serial is None:
        serial = next(_SERIALS)
        weight._megawino_serial = serial
    try:
        version = weight._version
    except RuntimeError:          # inference tensors carry no version counter: never cache
        return None
    return (serial, weight.data_ptr(), version, tuple(weight.shape), weight.device.index, _generation)


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------

_autograd_warned = False


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
           backend: str = "auto", algo: str = "auto", gemm_math: str = DEFAULT_GEMM_MATH):
    """torch.nn.functional.conv2d on megawino (float32, dilation 1, groups 1, equal stride and
    padding in both dimensions; ``padding`` may be ``"valid"`` or ``"same"``).

    ``backend``: ``"auto"`` / ``"gpu"`` run CUDA tensors on the GPU, ``"cpu"`` runs CPU tensors
    on the CPU executor (3x3 stride 1; other shapes go to torch).  ``algo``: ``"auto"``
    measures megawino's paths and PyTorch's once per shape and GPU and runs the fastest;
    ``"megakernel"``, ``"nonfused"``, ``"direct"`` or ``"pytorch"`` force one.  Under autograd
    it runs torch.nn.functional.conv2d (one warning per process)."""
    return conv2d_with_algo(input, weight, bias, stride, padding, dilation, groups,
                            backend=backend, algo=algo, gemm_math=gemm_math)[0]


def conv2d_with_algo(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
                     backend: str = "auto", algo: str = "auto", gemm_math: str = DEFAULT_GEMM_MATH):
    """:func:`conv2d` and the name of what ran (an ALGOS name, or an ALGO_NOTES key)."""
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
    unbatched = input.dim() == 3
    x = input.unsqueeze(0) if unbatched else input
    run = _run_cpu if device == "cpu" else _run_gpu
    out, ran = run(x, weight, bias, args, algo, gemm_math)
    return (out.squeeze(0) if unbatched else out), ran


def _add_bias(out: torch.Tensor, bias) -> torch.Tensor:
    return out if bias is None else out.add_(bias.view(1, -1, 1, 1))


def _run_cpu(x, weight, bias, args: ConvArguments, algo: str, gemm_math: str):
    r, s = weight.shape[2:]
    if algo == "pytorch" or (r, s) != (3, 3) or args.stride != 1:
        return F.conv2d(x, weight, bias, args.stride, args.padding), (
            "pytorch" if algo == "pytorch" else "pytorch-cpu")
    from ..executor import conv2d_cpu
    w = weight.detach().contiguous().numpy()
    if _channels_last(x) or _channels_last(weight):
        y = conv2d_cpu(x.detach().permute(0, 2, 3, 1).contiguous().numpy(), w, padding=args.padding,
                       layout="NHWC")
        out = torch.from_numpy(y).permute(0, 3, 1, 2)
    else:
        out = torch.from_numpy(conv2d_cpu(x.detach().contiguous().numpy(), w, padding=args.padding))
    return _add_bias(out, bias), "cpu-executor"


# ---------------------------------------------------------------------------
# GPU backend
# ---------------------------------------------------------------------------

def _torch_workspace(nbytes: int):
    """The runtime's workspace allocator: bytes from torch's caching allocator (so workspaces
    made while a CUDA graph is captured come from the graph's pool)."""
    import cupy
    device = torch.device("cuda", cupy.cuda.Device().id)
    return cupy.from_dlpack(torch.empty(int(nbytes), dtype=torch.uint8, device=device))


@functools.cache
def _gpu():
    """(cupy, megawino.runtime), with the runtime's workspaces on torch's allocator."""
    from .. import runtime
    from ..nvrtc import cupy_module
    cupy = cupy_module()
    runtime.set_allocator(_torch_workspace)
    return cupy, runtime


@contextlib.contextmanager
def _ieee_fp32_convolutions():
    """cuDNN convolutions in IEEE fp32 (no TF32) inside, the user's setting restored after;
    through the per-operator flag where torch has it (mixing it with the legacy one is an error)."""
    conv_flags = getattr(torch.backends.cudnn, "conv", None)
    if conv_flags is not None and hasattr(conv_flags, "fp32_precision"):
        saved = conv_flags.fp32_precision
        conv_flags.fp32_precision = "ieee"
        try:
            yield
        finally:
            conv_flags.fp32_precision = saved
    else:
        saved = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32 = saved


class _Layer(NamedTuple):
    spec: LayerSpec
    candidates: tuple[str, ...]     # the algorithms that can run it, megawino's paths first
    choice_key: str                 # the key of runtime.choose_fastest's cache


def candidate_algos(spec: LayerSpec) -> tuple[str, ...]:
    """The algorithms algo="auto" chooses from for ``spec``: the Winograd paths for 3x3
    stride 1, the direct path where it takes the shape, and PyTorch."""
    from ..direct import check_spec
    names = list(MEGAWINO_ALGOS[:2]) if spec.winograd_eligible else []
    try:
        check_spec(spec)
        names.append("direct")
    except ValueError:
        pass
    return tuple(names) + ("pytorch",)


_LAYERS: dict = {}     # (shape, stride, padding, layout, gemm_math) -> _Layer
_CHOICES: dict = {}    # same key + device -> the algorithm algo="auto" runs
_STREAMS: dict = {}    # (torch stream handle, device) -> cupy.cuda.ExternalStream


def _layer(key) -> _Layer:
    layer = _LAYERS.get(key)
    if layer is None:
        n, c, k, h, w, r, s, stride, padding, layout, gemm_math = key
        spec = LayerSpec(n, c, k, h, w, r, s, stride, padding, layout)
        choice_key = (f"torch{torch.__version__}-cudnn{torch.backends.cudnn.version()}-"
                      f"megawino{source_hash()[:12]}/"
                      f"{spec.shape_string}/{layout}/{gemm_math}")
        layer = _LAYERS[key] = _Layer(spec, candidate_algos(spec), choice_key)
    return layer


def exported_views(x, weight, out, channels_last: bool):
    """The tensors the runtime gets through DLPack: detached (DLPack refuses tensors that
    require grad), the weight [K][C][R][S] contiguous, and for channels_last the NHWC views
    (contiguous in memory) of input and output."""
    weight = weight.detach().contiguous()
    if channels_last:
        return x.detach().permute(0, 2, 3, 1), weight, out.permute(0, 2, 3, 1)
    return x.detach(), weight, out


def _run_gpu(x, weight, bias, args: ConvArguments, algo: str, gemm_math: str):
    channels_last = _channels_last(x) or _channels_last(weight)
    layout = "NHWC" if channels_last else "NCHW"
    n, c, h, w = x.shape
    k, _, r, s = weight.shape
    key = (n, c, k, h, w, r, s, args.stride, args.padding, layout, gemm_math)
    layer = _layer(key)
    if algo not in ("auto", "pytorch") and algo not in layer.candidates:
        raise ValueError(f"algo={algo!r} cannot run {layer.spec.describe()} "
                         f"(this shape runs {', '.join(layer.candidates)})")
    cupy, runtime = _gpu()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=memory_format)
    dev = x.device.index
    torch_stream = torch.cuda.current_stream(x.device)
    stream = _STREAMS.get((torch_stream.cuda_stream, dev))
    if stream is None:
        stream = _STREAMS[(torch_stream.cuda_stream, dev)] = cupy.cuda.ExternalStream(
            torch_stream.cuda_stream, dev)

    def run(name: str) -> torch.Tensor:
        if name == "pytorch":
            with _ieee_fp32_convolutions():
                return F.conv2d(x, weight, None, args.stride, args.padding)
        # Allocated by torch (its caching allocator, the graph's pool under capture).
        out = torch.empty((n, k, layer.spec.out_h, layer.spec.out_w), dtype=torch.float32,
                          device=x.device, memory_format=memory_format)
        x_view, w_view, out_view = exported_views(x, weight, out, channels_last)
        runtime.conv2d(cupy.from_dlpack(x_view), cupy.from_dlpack(w_view), stride=args.stride,
                       padding=args.padding, algo=name, layout=layout, gemm_math=gemm_math,
                       out=cupy.from_dlpack(out_view), weight_token=weight_token(weight))
        return out

    with cupy.cuda.Device(dev), stream:
        if algo == "auto":
            algo = _CHOICES.get((key, dev))
            if algo is None:
                algo = _choose(runtime, layer, gemm_math, run)
                # Under capture nothing is measured: choose again at the next eager call.
                if not torch.cuda.is_current_stream_capturing():
                    _CHOICES[(key, dev)] = algo
        return _add_bias(run(algo), bias), algo


def _choose(runtime, layer: _Layer, gemm_math: str, run) -> str:
    """The runtime's fastest megawino path for the shape (its own measurement and cache), then
    the faster of that and PyTorch, timed on these tensors (cached per GPU by the runtime)."""
    if torch.cuda.is_current_stream_capturing():
        return layer.candidates[0]         # nothing can be timed (or allocated by CuPy) now
    ours = [name for name in layer.candidates if name != "pytorch"]
    if not ours:
        return "pytorch"
    best = runtime.choose_algo(layer.spec, gemm_math) if layer.spec.winograd_eligible else ours[0]
    return runtime.choose_fastest(layer.choice_key, {best: functools.partial(run, best),
                                                     "pytorch": functools.partial(run, "pytorch")})
