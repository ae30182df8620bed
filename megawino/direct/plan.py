"""The direct path behind the same call as a Winograd plan (megawino.gpu.winograd_plan.Plan): compiled kernel,
gather table and tile configuration made once per shape; the packed filter matrix kept per
weight token (megawino.gpu.weights) or packed into the stream's own buffer on every call."""
from __future__ import annotations

import numpy as np

from ..core.abi import DIRECT_KERNEL_ARGS
from ..gpu import route, weights, workspace
from ..gpu.launch import KernelLaunch, Launcher
from ..gpu.nvrtc import cupy_module
from ..gpu.call_checks import prepare_call, require_gpu
from ..core.spec import LayerSpec
from ..core.tasks import round_up
from . import config as config_mod
from .kernel import _device_table, check_spec, compile_kernel, launch, launch_args
from .model import heuristic_config


ARG_INDEX = {name: i for i, (name, _) in enumerate(DIRECT_KERNEL_ARGS)}


def pack_into(dst, w, layout: str) -> None:
    """Write [K][C][R][S] ``w`` into the packed matrix ``dst`` ([>= CRS][>= K], NumPy or CuPy, zero
    padding left as it is) in the kernel's reduction order, without allocating (CUDA-graph safe)."""
    K, C, R, S = w.shape
    rows = dst[:C * R * S, :K]
    dims = (C, R, S, K) if layout == "NCHW" else (R, S, C, K)
    # The rows as a 4-D view, its strides set here: reshape() of a strided matrix may give a
    # size-1 axis any stride (or make a copy), so nothing is asked of it.
    row_bytes, col_bytes = rows.strides
    strides = (dims[1] * dims[2] * row_bytes, dims[2] * row_bytes, row_bytes, col_bytes)
    view = _array_module(dst).lib.stride_tricks.as_strided(rows, shape=dims, strides=strides)
    view[...] = w.transpose(1, 2, 3, 0) if layout == "NCHW" else w.transpose(2, 3, 1, 0)


def _array_module(array):
    """NumPy for a NumPy array, else CuPy (imported only then)."""
    if isinstance(array, np.ndarray):
        return np
    import cupy
    return cupy


class KernelPlan:
    """What the plans of the direct and pointwise paths share: the call of the Winograd plans,
    and ``check`` without a watchdog (kernel errors surface at synchronisation)."""

    spec: LayerSpec
    device: int
    evicted = False              # dropped from the runtime's plan cache

    def __call__(self, x, w, out=None, check: bool = True, weight_token=None):
        """Launch through the plan's route (megawino.gpu.route), as a Winograd plan's call does."""
        x, ready_w, out = prepare_call(self.spec, self.device, x, w, out, check, weight_token)
        return route.launch(self, x, ready_w, out, check, weight_token, copied_weight=ready_w is not w)

    def check(self) -> None:
        if workspace.is_capturing():
            raise ValueError("check() synchronizes: it cannot run while the stream is captured")
        cupy_module().cuda.Device(self.device).synchronize()


class DirectPlan(KernelPlan):
    """The direct-convolution path (cuda/direct.cu): filters up to 15x15, any stride and padding;
    its tile configuration comes from ``mapping/direct_<gpu>.json`` or the model's heuristic."""

    algo = "direct"

    def __init__(self, spec: LayerSpec, config=None):
        if not isinstance(spec, LayerSpec):
            raise ValueError(f"spec must be a LayerSpec, got {type(spec).__name__}")
        check_spec(spec)
        if config is not None and not isinstance(config, config_mod.DirectConfig):
            raise ValueError(f"config must be a DirectConfig, got {type(config).__name__}")
        from ..gpu.identity import current_gpu_key
        cupy = require_gpu()
        self.spec = spec
        self.device = cupy.cuda.Device().id
        self.config = config if config is not None else heuristic_config(spec, gpu=current_gpu_key())
        self._nhwc = spec.layout == "NHWC"
        flush = config_mod.flush_terms(spec)
        if not config_mod.resource_ok(self.config, self._nhwc, flush=flush):
            raise ValueError(f"config {self.config.key} does not pass the resource filter for "
                             f"{spec.layout}{' with flush' if flush else ''}")
        self._kernel = compile_kernel(self.config, self._nhwc, flush)
        self._table = _device_table(spec)
        crs = spec.C * spec.R * spec.S
        self.packed_shape = (round_up(crs, config_mod.PACK_ROWS), round_up(spec.K, config_mod.PACK_COLS))
        self._packed = workspace.StreamBuffers(self.packed_shape)   # for calls without a token
        self.captured = False                   # a CUDA graph holds its buffers: never evicted
        cupy.cuda.get_current_stream().synchronize()

    def run(self, x, w, out, check: bool = True, weight_token=None):
        """The launch of :meth:`__call__` on arrays already checked and made ready."""
        spec = self.spec
        stream = workspace.current_stream_ptr()
        capturing = workspace.is_capturing()
        self.captured = self.captured or capturing
        packed = weights.prepared(self._packed_key(weight_token), self.packed_shape, stream, capturing,
                                  lambda dst: pack_into(dst, w, spec.layout),
                                  self._packed)
        launch(self._kernel, self.config, spec, x, packed, self._table, out)
        return out

    def launcher(self, x, w, weight_token=None):
        """A :class:`megawino.gpu.launch.Launcher` of :meth:`run` for 16-byte aligned inputs and
        outputs of the plan's shapes on the current stream, with the weight ``w`` packed under
        ``weight_token`` (None until that is ready); ``x`` stands for every later input."""
        entry = weights.CACHE.ready(self._packed_key(weight_token))
        if entry is None:
            return None
        grid, block, args = launch_args(self.config, self.spec, x, entry.array, self._table, np.uint64(0))
        kernel_launch = KernelLaunch(self._kernel, grid, block, args, workspace.current_stream_ptr())
        return Launcher([kernel_launch], [(0, ARG_INDEX["x"])], [(0, ARG_INDEX["y"])],
                        keep=(self, entry, self._table))

    def _packed_key(self, weight_token):
        return (None if weight_token is None else
                ("direct", self.device, weight_token, self.spec.layout, self.packed_shape))

    def __repr__(self) -> str:
        return (f"DirectPlan({self.spec.describe()}, {self.spec.layout}, config={self.config.key}, "
                f"device={self.device})")
