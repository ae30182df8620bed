"""Shared helpers for the bench scripts: statistics, L2-rotation sizing, CUDA-event
timing, JSON hygiene, cuDNN's legacy convolution API through ctypes and the static part of
compare.py's layer records.

Importing this module needs neither CuPy nor PyTorch nor a GPU: everything that
touches the device imports CuPy / PyTorch inside the function that needs it.
"""
from __future__ import annotations

import ctypes
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Iterable

try:                      # the bench scripts run from a checkout as well as an install
    import megawino  # noqa: F401
except ImportError:
    sys.path.append(str(Path(__file__).resolve().parent.parent))

from megawino.gpu.timing import (L2_BYTES_DEFAULT, MiB, gpu_rel_l2, gpu_spin, rotation_sets,  # noqa: F401
                             time_cuda, time_cuda_stats)


# ---------------------------------------------------------------------------
# Pure helpers (CPU-tested)
# ---------------------------------------------------------------------------

def _finite_positive(values: Iterable) -> list[float]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v) and v > 0:
            out.append(float(v))
    return out


def median(values: Iterable) -> float | None:
    """Median of the finite numbers in ``values`` (None where there are none)."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v)]
    return statistics.median(vals) if vals else None


def synchronous_median_us(call, reps: int) -> float:
    """Median microseconds of ``call()`` over ``reps`` launches, each between its own CUDA events
    on the current stream and waited for before the next (no host run-ahead)."""
    import cupy
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(times)


def geomean(values: Iterable) -> float | None:
    """Geometric mean of the finite positive numbers in ``values`` (None if none)."""
    vals = _finite_positive(values)
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def ratio(num, den) -> float | None:
    """num / den, or None when either is missing, non-finite or not positive."""
    if not _finite_positive([num]) or not _finite_positive([den]):
        return None
    return float(num) / float(den)


def tflops(flops, us) -> float | None:
    """TFLOP/s of ``flops`` done in ``us`` microseconds."""
    r = ratio(flops, us)
    return None if r is None else r / 1e6


def json_clean(obj):
    """A copy of ``obj`` that json.dump writes as standard JSON: non-finite floats
    become the strings "nan" / "inf" / "-inf", NumPy scalars become Python numbers,
    tuples become lists, unknown objects become their str()."""
    if isinstance(obj, dict):
        return {str(k): json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    item = getattr(obj, "item", None)          # NumPy / CuPy 0-d values
    if callable(item):
        try:
            return json_clean(item())
        except Exception:
            pass
    return str(obj)


def short_error(err: BaseException, limit: int = 300) -> str:
    """One line: exception type and message, whitespace squeezed, truncated."""
    text = re.sub(r"\s+", " ", f"{type(err).__name__}: {err}").strip()
    return text if len(text) <= limit else text[:limit - 3] + "..."


def free_gpu_memory() -> None:
    """Return cached blocks of CuPy's pools and PyTorch's allocator to the driver."""
    import gc
    gc.collect()
    try:
        import cupy
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:
        pass
    try:
        import sys
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass



def set_fp32_precision(convolutions: str, matmul: str = "ieee") -> None:
    """cuDNN convolutions and cuBLAS matmuls in "ieee" fp32 or "tf32", through the
    per-operator flags where torch has them (megawino.torch uses those too; mixing them with
    the legacy allow_tf32 flags is an error in torch)."""
    if convolutions not in ("ieee", "tf32") or matmul not in ("ieee", "tf32"):
        raise ValueError(f"precision must be 'ieee' or 'tf32', got {convolutions!r}, {matmul!r}")
    import torch
    conv_flags = getattr(torch.backends.cudnn, "conv", None)
    if conv_flags is not None and hasattr(conv_flags, "fp32_precision"):
        conv_flags.fp32_precision = convolutions
        torch.backends.cuda.matmul.fp32_precision = matmul
    else:
        torch.backends.cudnn.allow_tf32 = convolutions == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = matmul == "tf32"

# ---------------------------------------------------------------------------
# cuDNN legacy convolution API through ctypes (the libcudnn.so.9 PyTorch loads)
# ---------------------------------------------------------------------------

CUDNN_ALGOS = {"implicit_gemm": 0, "implicit_precomp_gemm": 1, "gemm": 2, "direct": 3,
               "fft": 4, "fft_tiling": 5, "winograd": 6, "winograd_nonfused": 7}
CUDNN_FMA_MATH = 3
_CUDNN_NCHW, _CUDNN_FLOAT, _CUDNN_CROSS_CORRELATION = 0, 0, 1


def find_loaded_library(pattern: str = r"/libcudnn\.so\.9(\.[\d.]*)?$",
                        maps_path: str = "/proc/self/maps") -> str | None:
    """Path of the first mapped shared object whose path matches ``pattern``."""
    try:
        with open(maps_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and re.search(pattern, parts[5].strip()):
                    return parts[5].strip()
    except OSError:
        return None
    return None


class CudnnError(RuntimeError):
    pass


class CudnnLegacy:
    """Minimal legacy-API cuDNN forward convolution (NCHW float32) via ctypes.

    ``CudnnLegacy(lib_path)`` opens the library and creates a handle;
    ``conv(spec, algo, stream)`` builds a :class:`CudnnConv`. Every status is
    checked; failures raise CudnnError with cuDNN's error string.
    """

    def __init__(self, lib_path: str):
        self.path = lib_path
        self.lib = ctypes.CDLL(lib_path)
        L, vp, i, sz = self.lib, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        ptr = ctypes.POINTER
        sigs = {
            "cudnnGetVersion": ([], sz),
            "cudnnGetErrorString": ([i], ctypes.c_char_p),
            "cudnnCreate": ([ptr(vp)], i), "cudnnDestroy": ([vp], i),
            "cudnnSetStream": ([vp, vp], i),
            "cudnnCreateTensorDescriptor": ([ptr(vp)], i),
            "cudnnSetTensor4dDescriptor": ([vp, i, i, i, i, i, i], i),
            "cudnnDestroyTensorDescriptor": ([vp], i),
            "cudnnCreateFilterDescriptor": ([ptr(vp)], i),
            "cudnnSetFilter4dDescriptor": ([vp, i, i, i, i, i, i], i),
            "cudnnDestroyFilterDescriptor": ([vp], i),
            "cudnnCreateConvolutionDescriptor": ([ptr(vp)], i),
            "cudnnSetConvolution2dDescriptor": ([vp, i, i, i, i, i, i, i, i], i),
            "cudnnSetConvolutionMathType": ([vp, i], i),
            "cudnnDestroyConvolutionDescriptor": ([vp], i),
            "cudnnGetConvolution2dForwardOutputDim": ([vp, vp, vp, ptr(i), ptr(i), ptr(i), ptr(i)], i),
            "cudnnGetConvolutionForwardWorkspaceSize": ([vp, vp, vp, vp, vp, i, ptr(sz)], i),
            "cudnnConvolutionForward": ([vp, vp, vp, vp, vp, vp, vp, i, vp, sz, vp, vp, vp], i),
        }
        for name, (args, res) in sigs.items():
            f = getattr(L, name)
            f.argtypes, f.restype = args, res
        self.version = int(L.cudnnGetVersion())
        self.handle = vp()
        self._check(L.cudnnCreate(ctypes.byref(self.handle)), "cudnnCreate")
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            try:
                text = self.lib.cudnnGetErrorString(status).decode(errors="replace")
            except Exception:
                text = "?"
            raise CudnnError(f"{what}: status {status} ({text})")

    def conv(self, spec, algo: int, stream_ptr: int = 0,
             math_type: int = CUDNN_FMA_MATH) -> "CudnnConv":
        """Descriptors for ``spec`` (NCHW float32, dilation 1) and one algorithm."""
        return CudnnConv(self, spec, algo, stream_ptr, math_type)

    def close(self) -> None:
        if self.handle:
            self.lib.cudnnDestroy(self.handle)
            self.handle = ctypes.c_void_p()


class CudnnConv:
    """One forward convolution: ``run(x_ptr, w_ptr, y_ptr, ws_ptr)``; ``workspace``
    bytes; ``close()`` destroys the descriptors."""

    def __init__(self, cudnn: CudnnLegacy, spec, algo: int, stream_ptr: int, math_type: int):
        L, vp, c = cudnn.lib, ctypes.c_void_p, cudnn._check
        self.cudnn, self.algo = cudnn, int(algo)
        self.xd, self.yd, self.wd, self.cd = vp(), vp(), vp(), vp()
        c(L.cudnnSetStream(cudnn.handle, vp(stream_ptr or None)), "cudnnSetStream")
        c(L.cudnnCreateTensorDescriptor(ctypes.byref(self.xd)), "cudnnCreateTensorDescriptor")
        c(L.cudnnCreateTensorDescriptor(ctypes.byref(self.yd)), "cudnnCreateTensorDescriptor")
        c(L.cudnnCreateFilterDescriptor(ctypes.byref(self.wd)), "cudnnCreateFilterDescriptor")
        c(L.cudnnCreateConvolutionDescriptor(ctypes.byref(self.cd)), "cudnnCreateConvolutionDescriptor")
        c(L.cudnnSetTensor4dDescriptor(self.xd, _CUDNN_NCHW, _CUDNN_FLOAT,
                                       spec.N, spec.C, spec.H, spec.W), "cudnnSetTensor4dDescriptor(x)")
        c(L.cudnnSetFilter4dDescriptor(self.wd, _CUDNN_FLOAT, _CUDNN_NCHW,
                                       spec.K, spec.C, spec.R, spec.S), "cudnnSetFilter4dDescriptor")
        c(L.cudnnSetConvolution2dDescriptor(self.cd, spec.pad_h, spec.pad_w, spec.stride_h,
                                            spec.stride_w, 1, 1, _CUDNN_CROSS_CORRELATION,
                                            _CUDNN_FLOAT), "cudnnSetConvolution2dDescriptor")
        c(L.cudnnSetConvolutionMathType(self.cd, math_type), "cudnnSetConvolutionMathType")
        dims = [ctypes.c_int() for _ in range(4)]
        c(L.cudnnGetConvolution2dForwardOutputDim(self.cd, self.xd, self.wd,
                                                  *[ctypes.byref(d) for d in dims]),
          "cudnnGetConvolution2dForwardOutputDim")
        got, want = tuple(d.value for d in dims), (spec.N, spec.K, spec.out_h, spec.out_w)
        if got != want:
            raise CudnnError(f"cuDNN output dims {got} != expected {want}")
        c(L.cudnnSetTensor4dDescriptor(self.yd, _CUDNN_NCHW, _CUDNN_FLOAT, *want),
          "cudnnSetTensor4dDescriptor(y)")
        ws = ctypes.c_size_t()
        c(L.cudnnGetConvolutionForwardWorkspaceSize(cudnn.handle, self.xd, self.wd, self.cd, self.yd,
                                                    self.algo, ctypes.byref(ws)),
          f"cudnnGetConvolutionForwardWorkspaceSize(algo {algo})")
        self.workspace = int(ws.value)
        self._alpha = ctypes.addressof(cudnn._alpha)
        self._beta = ctypes.addressof(cudnn._beta)

    def run(self, x_ptr: int, w_ptr: int, y_ptr: int, ws_ptr: int) -> None:
        L, vp = self.cudnn.lib, ctypes.c_void_p
        self.cudnn._check(L.cudnnConvolutionForward(
            self.cudnn.handle, vp(self._alpha), self.xd, vp(x_ptr), self.wd, vp(w_ptr), self.cd,
            self.algo, vp(ws_ptr or None), self.workspace, vp(self._beta), self.yd, vp(y_ptr)),
            f"cudnnConvolutionForward(algo {self.algo})")

    def close(self) -> None:
        L = self.cudnn.lib
        for destroy, d in ((L.cudnnDestroyTensorDescriptor, self.xd),
                           (L.cudnnDestroyTensorDescriptor, self.yd),
                           (L.cudnnDestroyFilterDescriptor, self.wd),
                           (L.cudnnDestroyConvolutionDescriptor, self.cd)):
            if d:
                destroy(d)
        self.xd = self.yd = self.wd = self.cd = ctypes.c_void_p()


RESULTS_DIR = Path(__file__).resolve().parent / "results"


def results_path(name: str, suffix: str = ".json") -> Path:
    """``bench/results/<gpu>/<name><suffix>``: each tool keeps only its latest run per GPU
    (older runs are in git history); ``cpu`` names the folder on a machine without a GPU."""
    from megawino.gpu.identity import device_name, gpu_key
    device = device_name()
    return RESULTS_DIR / (gpu_key(device) if device else "cpu") / f"{name}{suffix}"


def git_commit(repo_root) -> str | None:
    """HEAD of the checkout at ``repo_root``, with "+dirty" when tracked files differ (None: no git)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True,
                              text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return (head + ("+dirty" if dirty else "")) or None
    except Exception:
        return None


class NotAvailable(Exception):
    """A compare.py column that cannot run here (its reason goes into the record as is)."""


def layer_record(spec, layout=None) -> dict:
    """The static part of a layer record (shape, FLOPs, GEMM shape of the Winograd stage)."""
    rec = {"name": spec.name, "shape": spec.shape_string, "describe": spec.describe(),
           "N": spec.N, "C": spec.C, "K": spec.K, "H": spec.H, "W": spec.W, "R": spec.R,
           "S": spec.S, "stride": spec.stride, "padding": spec.padding,
           "direct_flops": spec.direct_flops, "min_bytes": spec.min_bytes, "backends": {}}
    if layout is not None:
        rec["gemm"] = {"alpha2": layout.alpha2, "tiles": layout.tiles, "tiles_padded": layout.tiles_padded,
                       "c_stride": layout.c_stride, "k_stride": layout.k_stride,
                       "flops": 2 * layout.alpha2 * layout.tiles_padded * layout.c_stride * layout.k_stride,
                       "useful_flops": 2 * layout.alpha2 * layout.tiles * spec.C * spec.K}
    return rec
