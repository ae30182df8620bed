"""The GPU backend of ``megawino.torch.conv2d``: CUDA tensors on megawino's runtime, zero copy
(CuPy views of the tensors' memory), on torch's current stream, without synchronising the host.

* per-layer choice (``algo="auto"``): the runtime's fastest megawino path for the shape against
  PyTorch's cuDNN convolution in IEEE fp32, measured once per shape and GPU;
* weight tokens: the runtime reuses a prepared (transformed or packed) filter while the
  weight's token is unchanged;
* the runtime's workspaces come from torch's caching allocator (CUDA-graph pools included).

Nothing here imports CuPy or touches CUDA at import time.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..runtime import ALGOS as MEGAWINO_ALGOS, candidate_algos as megawino_candidates
from ..core.resources import source_hash
from ..core.spec import LayerSpec

__all__ = ["run_gpu", "candidate_algos", "weight_token", "weights_changed", "runtime_views",
           "MEGAWINO_ALGOS"]

# algo="auto" keeps a megawino path only where PyTorch's measured time is at least this factor
# of megawino's: a burst of calls of one layer leaves out the host time a converted layer adds
# to a whole forward, which decides host-bound models.
ENV_CHOICE_MARGIN = "MEGAWINO_CHOICE_MARGIN"
DEFAULT_CHOICE_MARGIN = 1.15


# ---------------------------------------------------------------------------
# Weight tokens: the runtime reuses a transformed filter while its token is unchanged
# ---------------------------------------------------------------------------

_SERIALS = itertools.count()
_generation = 0


class _Tracked:
    """What megawino.torch keeps about a weight tensor while it lives: a serial no other tensor
    shares, and its CuPy views per stream with the token they were made under."""

    __slots__ = ("ref", "serial", "token", "views")


# id(tensor) -> _Tracked.  Kept here, not as tensor attributes, which deepcopy and pickling
# would copy onto other tensors.
_TRACKED: dict = {}


def _forget(key: int):
    def callback(ref):
        entry = _TRACKED.get(key)
        if entry is not None and entry.ref is ref:
            del _TRACKED[key]
    return callback


def _tracked(tensor: torch.Tensor) -> _Tracked:
    key = id(tensor)
    entry = _TRACKED.get(key)
    if entry is None or entry.ref() is not tensor:
        entry = _Tracked()
        entry.ref = weakref.ref(tensor, _forget(key))
        entry.serial, entry.token, entry.views = next(_SERIALS), None, {}
        _TRACKED[key] = entry
    return entry


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
    try:
        version = weight._version
    except RuntimeError:          # inference tensors carry no version counter: never cache
        return None
    return (_tracked(weight).serial, weight.data_ptr(), version, tuple(weight.shape),
            weight.device.index, _generation)


# ---------------------------------------------------------------------------
# Runtime set-up, layers and the per-layer choice
# ---------------------------------------------------------------------------

def _torch_workspace(nbytes: int):
    """The runtime's workspace allocator: bytes from torch's caching allocator (so workspaces
    made while a CUDA graph is captured come from the graph's pool)."""
    import cupy
    index = cupy.cuda.Device().id
    tensor = torch.empty(int(nbytes), dtype=torch.uint8, device=torch.device("cuda", index))
    return _cupy_view(cupy, tensor, index, cupy.uint8)


@functools.cache
def _gpu():
    """(cupy, megawino.runtime), with the runtime's workspaces on torch's allocator."""
    from .. import runtime
    from ..gpu.nvrtc import cupy_module
    cupy = cupy_module()
    runtime.set_allocator(_torch_workspace)
    return cupy, runtime


@functools.cache
def _conv_flags():
    """torch's per-operator cuDNN convolution flags where it has them (mixing them with the
    legacy ``allow_tf32`` is an error), else None."""
    flags = getattr(torch.backends.cudnn, "conv", None)
    return flags if flags is not None and hasattr(flags, "fp32_precision") else None


def convolutions_are_ieee() -> bool:
    """Whether cuDNN convolutions already run in IEEE fp32 (no TF32)."""
    flags = _conv_flags()
    return flags.fp32_precision == "ieee" if flags is not None else not torch.backends.cudnn.allow_tf32


@contextlib.contextmanager
def ieee_fp32_convolutions():
    """cuDNN convolutions in IEEE fp32 (no TF32) inside, the user's setting restored after."""
    if convolutions_are_ieee():
        yield
        return
    flags = _conv_flags()
    owner, name = (flags, "fp32_precision") if flags is not None else (torch.backends.cudnn, "allow_tf32")
    saved = getattr(owner, name)
    setattr(owner, name, "ieee" if flags is not None else False)
    try:
        yield
    finally:
        setattr(owner, name, saved)


class _Layer(NamedTuple):
    spec: LayerSpec
    candidates: tuple[str, ...]     # the algorithms that can run it, megawino's paths first
    choice_key: str                 # the key of runtime.choose_fastest's cache
    checked: set                    # (algorithm, device) that runtime.conv2d has run once


def candidate_algos(spec: LayerSpec) -> tuple[str, ...]:
    """The algorithms algo="auto" chooses from for ``spec``: megawino's paths that take the
    shape (megawino.runtime.candidate_algos), and PyTorch."""
    return megawino_candidates(spec) + ("pytorch",)


_LAYERS: dict = {}     # (shape, stride, padding, layout, gemm_math) -> _Layer
_CHOICES: dict = {}    # same key + device -> the algorithm algo="auto" runs
_STREAMS: dict = {}    # (torch stream handle, device) -> cupy.cuda.ExternalStream


def _layer(key) -> _Layer:
    layer = _LAYERS.get(key)
    if layer is None:
        n, c, k, h, w, r, s, stride, padding, layout, gemm_math = key
        spec = LayerSpec(n, c, k, h, w, r, s, stride, padding, layout)
        choice_key = (f"torch{torch.__version__}-cudnn{torch.backends.cudnn.version()}-"
                      f"megawino{source_hash()[:12]}-margin{choice_margin()}/"
                      f"{spec.shape_string}/{layout}/{gemm_math}")
        layer = _LAYERS[key] = _Layer(spec, candidate_algos(spec), choice_key, set())
    return layer


def runtime_views(x, out, channels_last: bool):
    """Input and output as the runtime reads and writes them: for channels_last the NHWC views
    (contiguous in memory), else the tensors themselves."""
    if channels_last:
        return x.permute(0, 2, 3, 1), out.permute(0, 2, 3, 1)
    return x, out


def _cupy_view(cupy, tensor: torch.Tensor, device: int, dtype=None):
    """A CuPy array over a C-contiguous CUDA tensor (float32 unless ``dtype``), zero copy,
    keeping ``tensor`` alive; the host cost of a DLPack round trip is not needed on the stream
    both share."""
    dtype = cupy.float32 if dtype is None else dtype
    memory = cupy.cuda.UnownedMemory(tensor.data_ptr(), tensor.numel() * tensor.element_size(), tensor, device)
    return cupy.ndarray(tuple(tensor.shape), dtype, cupy.cuda.MemoryPointer(memory, 0))


def _weight_view(cupy, weight: torch.Tensor, token, device: int, stream: int):
    """The [K][C][R][S]-contiguous weight as a CuPy array, made once per weight token and stream
    (a channels_last weight is copied once, and on the stream that reads the copy).  Views made
    during CUDA-graph capture are not kept: a copy made there is only written by replays."""
    entry = _tracked(weight)
    if token is not None and entry.token == token and stream in entry.views:
        return entry.views[stream]
    view = _cupy_view(cupy, weight.detach().contiguous(), device)
    if token is not None and not torch.cuda.is_current_stream_capturing():
        if entry.token != token:
            entry.token, entry.views = token, {}
        entry.views[stream] = view
    return view


def run_gpu(x, weight, stride: int, padding: int, channels_last: bool, algo: str, gemm_math: str):
    """The convolution of CUDA tensors ``x`` [N][C][H][W] and ``weight`` (no bias), channels_last
    in and out or not; returns (output, the algorithm that ran)."""
    layout = "NHWC" if channels_last else "NCHW"
    n, c, h, w = x.shape
    k, _, r, s = weight.shape
    key = (n, c, k, h, w, r, s, stride, padding, layout, gemm_math)
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
            with ieee_fp32_convolutions():
                return F.conv2d(x, weight, None, stride, padding)
        # Allocated by torch (its caching allocator, the graph's pool under capture).
        out = torch.empty((n, k, layer.spec.out_h, layer.spec.out_w), dtype=torch.float32,
                          device=x.device, memory_format=memory_format)
        x_view, out_view = runtime_views(x, out, channels_last)
        token = weight_token(weight)
        w_view = _weight_view(cupy, weight, token, dev, torch_stream.cuda_stream)
        if (name, dev) not in layer.checked or x.data_ptr() % 16 or weight.data_ptr() % 16:
            # The first call of a shape and path goes through every check of runtime.conv2d
            # (and a misaligned input through its copy).
            runtime.conv2d(_cupy_view(cupy, x_view, dev), w_view,
                           stride=stride, padding=padding, algo=name, layout=layout,
                           gemm_math=gemm_math, out=_cupy_view(cupy, out_view, dev), weight_token=token)
            layer.checked.add((name, dev))
            return out
        # Later calls: arrays of the checked shapes and dtype, a fresh output, aligned input.
        plan = runtime.cached_plan(layer.spec, name, gemm_math, dev)
        if name == "pointwise" and not channels_last:
            plan.run_pointers(x.data_ptr(), w_view.data.ptr, out.data_ptr())
        else:
            plan.run(_cupy_view(cupy, x_view, dev), w_view, _cupy_view(cupy, out_view, dev), True, token)
        return out

    with cupy.cuda.Device(dev), stream:
        if algo == "auto":
            algo = _CHOICES.get((key, dev))
            if algo is None:
                algo = _choose(runtime, layer, gemm_math, run)
                # Under capture nothing is measured: choose again at the next eager call.
                if not torch.cuda.is_current_stream_capturing():
                    _CHOICES[(key, dev)] = algo
        return run(algo), algo


def _choose(runtime, layer: _Layer, gemm_math: str, run) -> str:
    """The runtime's fastest megawino path for the shape (its own measurement and cache), then
    the faster of that and PyTorch, timed on these tensors (cached per GPU by the runtime)."""
    if torch.cuda.is_current_stream_capturing():
        return layer.candidates[0]         # nothing can be timed (or allocated by CuPy) now
    ours = [name for name in layer.candidates if name != "pytorch"]
    if not ours:
        return "pytorch"
    best = runtime.choose_algo(layer.spec, gemm_math, prepared_weights=True)
    return runtime.choose_fastest(layer.choice_key, {best: functools.partial(run, best),
                                                     "pytorch": functools.partial(run, "pytorch")},
                                  handicaps={best: choice_margin()})


def choice_margin() -> float:
    """``$MEGAWINO_CHOICE_MARGIN`` (>= 1), else DEFAULT_CHOICE_MARGIN."""
    from ..gpu.call_checks import env_number
    value = env_number(ENV_CHOICE_MARGIN, DEFAULT_CHOICE_MARGIN, float, 1.0)
    return float(value)
