"""The direct kernel on the GPU: host-side data, compile, launch, :func:`conv2d_direct`.

* :func:`build_table` (the per-layer gather table) and :func:`pack_weights` (the
  filters as a zero-padded ``[roundup(CRS, 16)][roundup(K, 128)]`` matrix in the
  kernel's reduction order), shared with the NumPy emulation;
* :func:`conv2d_direct`: validation, compile (NVRTC via CuPy, cached per config
  and source hash) and launch.

CuPy is imported inside the functions that need it, never at import time.
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from ..core import abi
from ..gpu.nvrtc import as_cupy
from ..core.resources import cuda_dir, source_hash
from ..core.arguments import pair_argument
from ..core.spec import LayerSpec
from .config import (INT32_LIMIT, MAX_FILTER, PACK_COLS, PACK_ROWS, TAP_COL_BIT, TAP_SENTINEL, DirectConfig,
                     flush_terms, resource_ok)
from ..core.tasks import round_up
from ..gpu.identity import current_gpu_key
from .model import heuristic_config


# ---------------------------------------------------------------------------
# Host-side data: gather table and packed filters (shared by GPU path and emulation)
# ---------------------------------------------------------------------------

def tap_bits(r, s):
    """Tap bits of filter row r and column s (the table's second column)."""
    return (np.left_shift(1, r) | np.left_shift(1, TAP_COL_BIT + np.asarray(s))).astype(np.uint32)


def outside_taps(iy0, ix0, spec: LayerSpec):
    """Per pixel window origin: the tap bits of the filter rows / columns outside the
    image, plus TAP_SENTINEL (what the kernel's ``pixel_info`` computes)."""
    iy0, ix0 = np.asarray(iy0), np.asarray(ix0)
    out = np.full(np.broadcast(iy0, ix0).shape, TAP_SENTINEL, dtype=np.uint32)
    for r in range(spec.R):
        out |= np.where((iy0 + r < 0) | (iy0 + r >= spec.H), np.uint32(1 << r), np.uint32(0))
    for s in range(spec.S):
        out |= np.where((ix0 + s < 0) | (ix0 + s >= spec.W), np.uint32(1 << (TAP_COL_BIT + s)), np.uint32(0))
    return out


def build_table(spec: LayerSpec) -> np.ndarray:
    """int32 [roundup(CRS, 16)][2]: {offset, tap bits of (r, s)} of each reduction index kk;
    rows past CRS hold TAP_SENTINEL, which every pixel counts as outside (they read zero)."""
    C, R, S, H, W = spec.C, spec.R, spec.S, spec.H, spec.W
    crs = C * R * S
    rows = round_up(crs, PACK_ROWS)
    table = np.zeros((rows, 2), dtype=np.int32)
    if spec.layout == "NCHW":          # kk = (c * R + r) * S + s
        c, r, s = np.meshgrid(np.arange(C), np.arange(R), np.arange(S), indexing="ij")
        off = c * (H * W) + r * W + s
    else:                              # kk = (r * S + s) * C + c
        r, s, c = np.meshgrid(np.arange(R), np.arange(S), np.arange(C), indexing="ij")
        off = (r * W + s) * C + c
    table[:crs, 0] = off.reshape(-1)
    table[:crs, 1] = tap_bits(r.reshape(-1), s.reshape(-1)).view(np.int32)
    table[crs:, 1] = np.array([TAP_SENTINEL], dtype=np.uint32).view(np.int32)[0]
    return table


def pack_weights(w, layout: str = "NCHW", xp=np):
    """[K][C][R][S] -> zero-padded [roundup(CRS, 16)][roundup(K, 128)] in the
    kernel's reduction order ((c, r, s) for NCHW, (r, s, c) for NHWC)."""
    K, C, R, S = w.shape
    crs = C * R * S
    if layout == "NCHW":
        mat = w.reshape(K, crs)
    else:
        mat = w.transpose(0, 2, 3, 1).reshape(K, crs)
    out = xp.zeros((round_up(crs, PACK_ROWS), round_up(K, PACK_COLS)), dtype=w.dtype)
    out[:crs, :K] = mat.T
    return out



def _spec_from(x_shape, w_shape, stride, padding, layout) -> LayerSpec:
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if len(x_shape) != 4:
        raise ValueError(f"input must be 4-D ({layout}), got shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"filter must be 4-D (K, C, R, S), got shape {tuple(w_shape)}")
    if layout == "NCHW":
        N, C, H, W = x_shape
    else:
        N, H, W, C = x_shape
    K, C2, R, S = w_shape
    if C != C2:
        raise ValueError(f"input has C={C} channels but the filter expects C={C2}")
    return LayerSpec(N=int(N), C=int(C), K=int(K), H=int(H), W=int(W), R=int(R), S=int(S),
                     stride=pair_argument("stride", stride, 1), padding=pair_argument("padding", padding, 0),
                     layout=layout)


# ---------------------------------------------------------------------------
# GPU: compile and launch
# ---------------------------------------------------------------------------

_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _source_hash_cached() -> str:
    """source_hash() once per process (the sources do not change under a running program)."""
    return source_hash()
_kernels: dict = {}
_tables: dict = {}


def compile_kernel(cfg: DirectConfig, nhwc: bool, flush: int = 0):
    """The compiled ``mw_direct_conv`` for a config (cached per config, layout,
    flush, source hash and device)."""
    import cupy

    digest = _source_hash_cached()
    dev = cupy.cuda.Device().id
    key = (cfg, bool(nhwc), int(flush), digest, dev)
    with _lock:
        kern = _kernels.get(key)
    if kern is not None:
        return kern
    src = (cuda_dir() / "direct.cu").read_text()
    options = ("-I" + str(cuda_dir()), "--std=c++17", f"-DMW_SOURCE_HASH={digest[:16]}",
               *cfg.defines(nhwc, flush))
    module = cupy.RawModule(code=src, options=options)
    kern = module.get_function("mw_direct_conv")
    with _lock:
        _kernels[key] = kern
    return kern


def _device_table(spec: LayerSpec):
    import cupy

    key = (spec.layout, spec.C, spec.R, spec.S, spec.H, spec.W, cupy.cuda.Device().id)
    with _lock:
        tab = _tables.get(key)
    if tab is None:
        tab = cupy.asarray(build_table(spec))
        with _lock:
            if len(_tables) > 256:
                _tables.clear()
            _tables[key] = tab
    return tab


def check_spec(spec: LayerSpec) -> None:
    """ValueError for a layer the direct kernel cannot run (checked before any launch)."""
    M = spec.N * spec.out_h * spec.out_w
    if spec.N * spec.C * spec.H * spec.W >= INT32_LIMIT or M * spec.K >= INT32_LIMIT:
        raise ValueError(f"tensors over {INT32_LIMIT} elements are not supported by the direct "
                         "kernel's 32-bit offsets; split the batch")
    if spec.R > MAX_FILTER or spec.S > MAX_FILTER:
        raise ValueError(f"the direct kernel takes filters up to {MAX_FILTER}x{MAX_FILTER} "
                         f"(its gather marks each filter row and column with one bit), got {spec.R}x{spec.S}")
    if -(-spec.K // 32) > 65535:
        raise ValueError(f"K={spec.K} is too large for the direct kernel's grid")


def _validate(x, w, stride, padding, layout) -> LayerSpec:
    if str(getattr(x, "dtype", None)) != "float32" or str(getattr(w, "dtype", None)) != "float32":
        raise ValueError(f"direct convolution is float32 only, got input {getattr(x, 'dtype', None)} "
                         f"and filter {getattr(w, 'dtype', None)}")
    spec = _spec_from(tuple(x.shape), tuple(w.shape), stride, padding, layout)
    check_spec(spec)
    return spec


def conv2d_direct(x, w, stride=1, padding=0, layout: str = "NCHW",
                  config: DirectConfig | None = None, out=None):
    """Direct convolution (cross-correlation) of CuPy float32 arrays.

    ``x`` is NCHW or NHWC (``layout``), ``w`` is K x C x R x S; ``stride`` and ``padding``
    an int or an (h, w) pair; returns a new CuPy
    array (or fills ``out``) in the input's layout.  Raises ValueError before any
    launch on bad shapes, dtypes, strides, paddings or configs.
    """
    spec = _validate(x, w, stride, padding, layout)
    import cupy

    x = as_cupy(x, "input")
    w = as_cupy(w, "filter")
    nhwc = layout == "NHWC"
    if config is None:
        config = heuristic_config(spec, gpu=_current_gpu())
    elif not isinstance(config, DirectConfig):
        raise ValueError(f"config must be a DirectConfig, got {type(config).__name__}")
    flush = flush_terms(spec)
    if not resource_ok(config, nhwc, flush=flush):
        raise ValueError(f"config {config.key} does not pass the resource filter for {layout}"
                         f"{' with flush' if flush else ''}")
    if out is not None:
        out = as_cupy(out, "out")
        if tuple(out.shape) != spec.output_shape or str(out.dtype) != "float32" \
                or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {spec.output_shape}")
    x = cupy.ascontiguousarray(x)
    wt = pack_weights(cupy.ascontiguousarray(w), layout, xp=cupy)
    table = _device_table(spec)
    y = out if out is not None else cupy.empty(spec.output_shape, dtype=cupy.float32)
    kern = compile_kernel(config, nhwc, flush)
    launch(kern, config, spec, x, wt, table, y)
    return y


def vector_x(spec: LayerSpec, x_ptr: int) -> bool:
    """Whether the kernel may copy x rows 4 pixels at a time (``Params::vec_x``): a 1x1,
    stride-1, unpadded NCHW layer whose planes hold a multiple of 4 pixels, x 16-byte aligned.
    The shared-memory tiles are the same as with the per-element gather."""
    return (spec.layout == "NCHW" and spec.R == 1 and spec.S == 1 and spec.stride == 1
            and spec.padding == 0 and (spec.out_h * spec.out_w) % 4 == 0 and x_ptr % 16 == 0)


def launch_args(cfg: DirectConfig, spec: LayerSpec, x, wt, table, y) -> tuple[tuple, tuple, tuple]:
    """(grid, block, arguments) of the direct kernel's launch."""
    M = spec.N * spec.out_h * spec.out_w
    crs = spec.C * spec.R * spec.S
    grid = (-(-M // cfg.BM), -(-spec.K // cfg.BN), 1)
    values = {"x": x, "wt": wt, "table": table, "y": y, "C": spec.C, "H": spec.H, "W": spec.W,
              "K": spec.K, "R": spec.R, "S": spec.S, "OH": spec.out_h, "OW": spec.out_w, "M": M,
              "stride_h": spec.stride_h, "stride_w": spec.stride_w, "pad_h": spec.pad_h, "pad_w": spec.pad_w,
              "ktiles": -(-crs // cfg.BK),
              "ldw": wt.shape[1], "vec_x": vector_x(spec, int(x.data.ptr))}
    return grid, (cfg.threads, 1, 1), kernel_args(values)


def launch(kern, cfg: DirectConfig, spec: LayerSpec, x, wt, table, y) -> None:
    kern(*launch_args(cfg, spec, x, wt, table, y))


def kernel_args(values: dict) -> tuple:
    """The direct kernel's arguments in ``abi.DIRECT_KERNEL_ARGS`` order: arrays as they are,
    every int as numpy.int32."""
    return tuple(values[name] if c_type != "int" else np.int32(values[name])
                 for name, c_type in abi.DIRECT_KERNEL_ARGS)


@functools.lru_cache(maxsize=None)
def _current_gpu() -> str:
    return current_gpu_key()
