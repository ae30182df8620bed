"""The GPU backend of ``megawino.torch.conv2d``: CUDA tensors on megawino's runtime, zero copy
(CuPy views of the tensors' memory), on torch's current stream, without synchronising the host.

* per-layer choice (``algo="auto"``): the runtime's fastest megawino path for the shape against
  PyTorch's cuDNN convolution in IEEE fp32, measured once per shape and GPU;
* weight tokens (:mod:`megawino.torch.weight_tokens`): the runtime reuses a prepared
  (transformed or packed) filter while the weight's token is unchanged;
* the runtime's workspaces come from torch's caching allocator: a graph's pool while a CUDA
  graph is captured, else torch's own pool, even while torch.compile warms up its CUDA graphs
  (``mode="reduce-overhead"``), which must not find buffers the runtime keeps in a graph's pool.

Nothing here imports CuPy or touches CUDA at import time.
"""
from __future__ import annotations

import concurrent.futures
import functools
import threading
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..runtime import ALGOS as MEGAWINO_ALGOS, candidate_algos as megawino_candidates
from ..core.resources import source_hash
from ..core.spec import LayerSpec
from .precision import conv2d_ieee_fp32
from .weight_tokens import generation, tracked, weight_token, weights_changed

__all__ = ["run_gpu", "fast_call", "FastCall", "current_stream_handle", "candidate_algos", "weight_token", "weights_changed",
           "runtime_views", "is_channels_last", "MEGAWINO_ALGOS"]

# algo="auto" keeps a megawino path only where PyTorch's measured time is at least this factor
# of megawino's: a layer timed on its own leaves out what it costs a whole forward (host time
# between small kernels, the bias of its tensor-core sums), so a narrow win is not taken.
ENV_CHOICE_MARGIN = "MEGAWINO_CHOICE_MARGIN"
DEFAULT_CHOICE_MARGIN = 1.15


# ---------------------------------------------------------------------------
# Runtime set-up, layers and the per-layer choice
# ---------------------------------------------------------------------------

def _torch_workspace(nbytes: int):
    """The runtime's workspace allocator: bytes from torch's caching allocator, from the graph's
    pool while a CUDA graph is captured (nothing else may allocate then), else outside every
    graph's pool (:func:`outside_graph_pools`)."""
    import cupy
    index = cupy.cuda.Device().id
    make = functools.partial(torch.empty, int(nbytes), dtype=torch.uint8, device=torch.device("cuda", index))
    tensor = make() if torch.cuda.is_current_stream_capturing() else outside_graph_pools(make, index)
    return _cupy_view(cupy, tensor, index, cupy.uint8)


@functools.cache
def _allocating_thread() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="megawino-allocate")


def outside_graph_pools(make, index: int):
    """``make()`` (which allocates) on a thread of megawino's own, with this thread's current
    stream and device.  torch.compile's CUDA graphs route every allocation of the thread that
    warms a graph up into the graph's pool, and fail where a buffer kept after the call stays
    there: the runtime's workspaces and prepared weights are kept."""
    stream = torch.cuda.current_stream(index)

    def run():
        with torch.cuda.device(index), torch.cuda.stream(stream):
            return make()
    return _allocating_thread().submit(run).result()


@functools.cache
def _gpu():
    """(cupy, megawino.runtime), with the runtime's workspaces on torch's allocator."""
    from .. import runtime
    from ..gpu.nvrtc import cupy_module
    cupy = cupy_module()
    runtime.set_allocator(_torch_workspace)
    return cupy, runtime


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


def is_channels_last(t: torch.Tensor) -> bool:
    """True when ``t`` is laid out channels_last and not also plainly contiguous (torch's rule)."""
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


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
    entry = tracked(weight)
    if token is not None and entry.token == token and stream in entry.views:
        return entry.views[stream]
    keep = token is not None and not torch.cuda.is_current_stream_capturing()
    dense = weight.detach()
    if not dense.is_contiguous():       # a kept copy is made outside any CUDA graph's pool
        dense = outside_graph_pools(dense.contiguous, device) if keep and dense.is_cuda else dense.contiguous()
    view = _cupy_view(cupy, dense, device)
    if keep:
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
    stream = _cupy_stream(cupy, torch_stream.cuda_stream, dev)

    def run(name: str) -> torch.Tensor:
        if name == "pytorch":
            return conv2d_ieee_fp32(x, weight, None, stride, padding)
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
        # Later calls: arrays of the checked shapes and dtype, a fresh output, aligned input, on
        # the route of runtime.conv2d: its launcher where one is bound for this stream, else the
        # plan's run.  This path binds none itself: torch.compile's CUDA graphs warm up on a
        # stream of their own, and what a binding made there would stay in the graph's pool.
        route = runtime.route(layer.spec, name, gemm_math, dev, w_view, token)
        launcher = route.bound()
        if launcher is not None:
            launcher.launch(x.data_ptr(), out.data_ptr())
        elif name == "pointwise" and not channels_last:
            route.plan.run_pointers(x.data_ptr(), w_view.data.ptr, out.data_ptr())
        else:
            route.plan.run(_cupy_view(cupy, x_view, dev), w_view, _cupy_view(cupy, out_view, dev), True, token)
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


def _cupy_stream(cupy, handle: int, dev: int):
    """CuPy's view of torch's stream ``handle`` on device ``dev``."""
    stream = _STREAMS.get((handle, dev))
    if stream is None:
        stream = _STREAMS[(handle, dev)] = cupy.cuda.ExternalStream(handle, dev)
    return stream


# ---------------------------------------------------------------------------
# The later calls of a converted layer
# ---------------------------------------------------------------------------

def _raw_stream_getter():
    """``device index -> torch's current stream handle`` at the lowest host cost torch offers."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw is not None else (lambda index: torch.cuda.current_stream(index).cuda_stream)


_RAW_STREAM = _raw_stream_getter()


def current_stream_handle(x) -> int | None:
    """torch's current stream handle on ``x``'s CUDA device (None for other tensors)."""
    return _RAW_STREAM(x.get_device()) if x.is_cuda else None


_THREADS = threading.local()       # .devices: the devices whose context this thread has made current


class FastCall:
    """The later calls of one converted layer while nothing differs from the full call it was
    made after: input shape, layout, dtype and alignment, device, torch's stream, the weight (its
    token) and no autograd or CUDA-graph capture.  It allocates the output and launches the
    plan's kernels on the tensors' pointers (megawino.gpu.launch); ``__call__`` returns None where
    anything differs, and the caller takes the full path."""

    __slots__ = ("shape", "out_shape", "memory_format", "channels_last", "device", "index", "stream",
                 "weight", "weight_ptr", "weight_version", "generation", "launcher", "algo")

    def __init__(self, x, weight, out_shape, channels_last: bool, stream: int, launcher, algo: str):
        self.shape, self.out_shape = x.shape, tuple(out_shape)
        self.channels_last = channels_last
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.device, self.index, self.stream = x.device, x.device.index, stream
        self.weight, self.weight_ptr, self.weight_version = weight, weight.data_ptr(), weight._version
        self.generation = generation()
        self.launcher, self.algo = launcher, algo

    def __reduce__(self):
        # A copied or pickled model makes its own launches at its first call.
        return _nothing, ()

    def matches(self, x, weight, bias=None, stream: int | None = None) -> bool:
        """Whether ``x``, ``weight`` and ``bias`` can take this call (see the class); ``stream``:
        torch's current stream handle where the caller has it already."""
        if x.shape != self.shape or x.device != self.device or x.dtype is not torch.float32:
            return False
        if weight is not self.weight or weight._version != self.weight_version \
                or weight.data_ptr() != self.weight_ptr or generation() != self.generation:
            return False
        if self.channels_last:
            if not is_channels_last(x):
                return False
        elif not x.is_contiguous():
            return False
        if x.data_ptr() % 16 or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (
                bias is not None and bias.requires_grad))):
            return False
        if stream is None:
            stream = _RAW_STREAM(self.index)
        return (stream == self.stream and torch.cuda.current_device() == self.index
                and not torch.cuda.is_current_stream_capturing() and self.launcher.valid())

    def __call__(self, x, weight, bias=None, stream: int | None = None):
        """The convolution of ``x`` and ``weight`` (bias not added), or None."""
        if not self.matches(x, weight, bias, stream):
            return None
        devices = getattr(_THREADS, "devices", None)
        if devices is None:
            devices = _THREADS.devices = set()
        if self.index not in devices:          # the driver launch needs the device's context current
            cupy, _ = _gpu()
            cupy.cuda.runtime.setDevice(self.index)
            devices.add(self.index)
        out = torch.empty(self.out_shape, dtype=torch.float32, device=self.device,
                          memory_format=self.memory_format)
        self.launcher.launch(x.data_ptr(), out.data_ptr())
        return out


def _nothing():
    return None


def fast_call(x, weight, stride: int, padding: int, algo: str, gemm_math: str) -> FastCall | None:
    """A :class:`FastCall` for the next calls like the one that just ran ``algo`` on ``x`` and
    ``weight`` (4-D CUDA tensors), or None where the full path must run them: PyTorch's
    algorithm, a weight without a token, an input not already in its layout or not 16-byte
    aligned, capture, or a plan whose prepared weight is not ready."""
    if algo not in MEGAWINO_ALGOS or x.dim() != 4 or x.data_ptr() % 16 \
            or torch.cuda.is_current_stream_capturing():
        return None
    channels_last = is_channels_last(x) or is_channels_last(weight)
    if channels_last != is_channels_last(x) or not (channels_last or x.is_contiguous()):
        return None
    token = weight_token(weight)
    n, c, h, w = x.shape
    k, _, r, s = weight.shape
    layer = _LAYERS.get((n, c, k, h, w, r, s, stride, padding, "NHWC" if channels_last else "NCHW", gemm_math))
    dev = x.device.index
    if token is None or layer is None or (algo, dev) not in layer.checked:
        return None
    cupy, runtime = _gpu()
    handle = _RAW_STREAM(dev)
    with cupy.cuda.Device(dev), _cupy_stream(cupy, handle, dev):
        # The launcher of the route runtime.conv2d and the later full calls use (one binding).
        route = runtime.route(layer.spec, algo, gemm_math, dev, _weight_view(cupy, weight, token, dev, handle), token)
        x_view = x.permute(0, 2, 3, 1) if channels_last else x
        launcher = route.bind(_cupy_view(cupy, x_view, dev))
    if launcher is None:
        return None
    out_shape = (n, k, layer.spec.out_h, layer.spec.out_w)
    return FastCall(x, weight, out_shape, channels_last, handle, launcher, algo)


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
