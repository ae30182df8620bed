"""The pointwise path (algo ``"pointwise"``): a 1x1, stride-1, unpadded convolution as one GEMM
per image on the Winograd GEMM's tensor-core tiles (``cuda/pointwise.cu``), read and written in
the user's own tensors:

* NCHW: ``y[n] [K][H*W] = w [K][C] @ x[n] [C][H*W]``: the weight tensor is the A operand as it
  is, so nothing is prepared;
* NHWC: ``y [N*H*W][K] = x [N*H*W][C] @ w^T [C][K]``: the transposed filter is prepared once
  per weight token (megawino.gpu.weights), or per call without one.

The GEMM's arithmetic is the plan's ``gemm_math`` (3xTF32 by default: fp32-grade error), and
each output element is one fixed reduction over C, so results do not depend on the tiling.
"""
from __future__ import annotations

import numpy as np

from ..core.spec import LayerSpec
from ..core.tasks import GEMM_TILE_COLS, K_ALIGN
from ..gpu import weights, workspace
from ..gpu.launch import KernelLaunch, Launcher
from ..gpu.call_checks import require_gpu
from ..gpu.nvrtc import BLOCK_THREADS, DEFAULT_GEMM_MATH, GemmSmemKernel, check_gemm_math, module
from .plan import KernelPlan

# The row heights of the two kernels (mw_pointwise_128, mw_pointwise_64).
TILE_ROWS = (128, 64)
# The GEMM tile's 16-byte copies: rows of both operands start on K_ALIGN-float boundaries.
VECTOR_FLOATS = K_ALIGN
GRID_LIMIT = 65535      # the grid's y and z extents


def gemm_dims(spec: LayerSpec) -> tuple[int, int, int, int]:
    """(rows, columns, reduction length, batch) of the layer's GEMM."""
    hw = spec.H * spec.W
    if spec.layout == "NCHW":
        return spec.K, hw, spec.C, spec.N
    return spec.N * hw, spec.K, spec.C, 1


def check_pointwise(spec: LayerSpec) -> None:
    """ValueError unless the pointwise kernels can run ``spec``."""
    if (spec.R, spec.S, spec.stride, spec.padding) != (1, 1, 1, 0):
        raise ValueError(f"the pointwise path runs 1x1 filters at stride 1 without padding, got "
                         f"{spec.R}x{spec.S} at stride {spec.stride}, padding {spec.padding}")
    rows, cols, channels, batch = gemm_dims(spec)
    if channels % VECTOR_FLOATS:
        raise ValueError(f"the pointwise path needs C divisible by {VECTOR_FLOATS} (16-byte rows), got C={channels}")
    if cols % VECTOR_FLOATS:
        what = "H*W" if spec.layout == "NCHW" else "K"
        raise ValueError(f"the pointwise path needs {what} divisible by {VECTOR_FLOATS} in {spec.layout} "
                         f"(16-byte rows), got {what}={cols}")
    if -(-cols // GEMM_TILE_COLS) > GRID_LIMIT or batch > GRID_LIMIT or rows >= 2 ** 31:
        raise ValueError(f"{spec.describe()} is too large for the pointwise grid")


def choose_tile_rows(rows: int, col_tiles: int, batch: int, sm_count: int) -> int:
    """The row-tile height: 128, unless 64-row tiles waste less of a partial last tile or are
    needed to give every SM the two blocks it holds at once."""
    if rows % 128 and rows % 128 <= 64:
        return 64
    blocks_128 = -(-rows // 128) * col_tiles * batch
    return 64 if blocks_128 < 2 * sm_count else 128


class PointwisePlan(KernelPlan):
    """A 1x1 stride-1 convolution on the GEMM tiles; the same call as the other plans.
    ``tile_rows`` (128 or 64) overrides the row-tile height the plan would choose."""

    algo = "pointwise"

    def __init__(self, spec: LayerSpec, gemm_math: str = DEFAULT_GEMM_MATH, tile_rows: int | None = None):
        if not isinstance(spec, LayerSpec):
            raise ValueError(f"spec must be a LayerSpec, got {type(spec).__name__}")
        check_pointwise(spec)
        if tile_rows is not None and tile_rows not in TILE_ROWS:
            raise ValueError(f"tile_rows must be one of {TILE_ROWS} or None, got {tile_rows!r}")
        self.gemm_math = check_gemm_math(gemm_math)
        cupy = require_gpu()
        self.spec = spec
        self.device = cupy.cuda.Device().id
        self.rows, self.cols, self.channels, self.batch = gemm_dims(spec)
        col_tiles = -(-self.cols // GEMM_TILE_COLS)
        sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]
        self.tile_rows = tile_rows or choose_tile_rows(self.rows, col_tiles, self.batch, sm_count)
        self.grid = (-(-self.rows // self.tile_rows), col_tiles, self.batch)
        self._kernel = GemmSmemKernel(module("pointwise", 4, "NCHW", gemm_math=self.gemm_math),
                                      f"mw_pointwise_{self.tile_rows}")
        self.transposed_shape = (spec.C, spec.K)
        self._transposed = workspace.StreamBuffers(self.transposed_shape) if spec.layout == "NHWC" else None
        self.captured = False                   # a CUDA graph holds its buffers: never evicted

    def run(self, x, w, out, check: bool = True, weight_token=None):
        """The launch of :meth:`__call__` on arrays already checked and made ready."""
        spec = self.spec
        capturing = workspace.is_capturing()
        self.captured = self.captured or capturing
        if spec.layout == "NCHW":
            self.run_pointers(x.data.ptr, w.data.ptr, out.data.ptr)
            return out
        stream = workspace.current_stream_ptr()

        def transpose(dst):
            dst[...] = w.reshape(spec.K, spec.C).T

        transposed = weights.prepared(self._transposed_key(weight_token), self.transposed_shape, stream,
                                      capturing, transpose, self._transposed)
        self._launch(x.data.ptr, transposed.data.ptr, out.data.ptr, (0, 0, 0))
        return out

    def run_pointers(self, x_ptr: int, w_ptr: int, out_ptr: int) -> None:
        """The NCHW launch on raw device pointers of C-contiguous, 16-byte aligned float32 tensors
        of the plan's shapes, on CuPy's current stream: the caller has checked them."""
        if self.spec.layout != "NCHW":
            raise ValueError("run_pointers takes NCHW layers (NHWC prepares a transposed filter)")
        self._launch(*self._operands(x_ptr, w_ptr, out_ptr, None))

    def launcher(self, x, w, weight_token=None):
        """A :class:`megawino.gpu.launch.Launcher` of :meth:`run` for inputs and outputs of the
        plan's shapes on the current stream, with the weight ``w`` (NHWC: transposed under
        ``weight_token``; None until that is ready); ``x`` stands for every later input."""
        entry = None
        if self.spec.layout == "NHWC":
            entry = weights.CACHE.ready(self._transposed_key(weight_token))
            if entry is None:
                return None
        a_ptr, b_ptr, out_ptr, strides = self._operands(x.data.ptr, w.data.ptr, 0, entry)
        x_slot = 0 if self.spec.layout == "NHWC" else 1
        launch = KernelLaunch(self._kernel, self.grid, (BLOCK_THREADS,), self._args(a_ptr, b_ptr, out_ptr, strides),
                              workspace.current_stream_ptr())
        return Launcher([launch], [(0, x_slot)], [(0, 2)], keep=(self, w) + ((entry,) if entry else ()))

    def _transposed_key(self, weight_token):
        return None if weight_token is None else ("pointwise", self.device, weight_token, self.transposed_shape)

    def _operands(self, x_ptr: int, w_ptr: int, out_ptr: int, transposed):
        """(A, B, output, batch strides) of the GEMM: NCHW multiplies the weight by each image,
        NHWC all pixels by the ``transposed`` filter entry."""
        spec = self.spec
        if spec.layout == "NCHW":
            hw = spec.H * spec.W
            return w_ptr, x_ptr, out_ptr, (0, spec.C * hw, spec.K * hw)
        return x_ptr, transposed.array.data.ptr, out_ptr, (0, 0, 0)

    def _args(self, a_ptr: int, b_ptr: int, out_ptr: int, batch_strides) -> tuple:
        return (np.uint64(a_ptr), np.uint64(b_ptr), np.uint64(out_ptr), np.int32(self.rows),
                np.int32(self.cols), np.int32(self.channels), *(np.int64(s) for s in batch_strides))

    def _launch(self, a_ptr: int, b_ptr: int, out_ptr: int, batch_strides) -> None:
        self._kernel(self.grid, (BLOCK_THREADS,), self._args(a_ptr, b_ptr, out_ptr, batch_strides))

    def __repr__(self) -> str:
        return (f"PointwisePlan({self.spec.describe()}, {self.spec.layout}, {self.gemm_math}, "
                f"{self.tile_rows}-row tiles, device={self.device})")
