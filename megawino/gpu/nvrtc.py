"""CuPy access, NVRTC compilation of the Winograd modules (``cuda/megakernel.cu``,
``cuda/nonfused.cu``) cached per build (compile-time options), and their occupancy.

Nothing here touches CUDA at import time; CuPy is imported on first use.
"""
from __future__ import annotations

import functools
import os
import re
import threading

import numpy as np

from ..core.resources import cuda_dir, source_hash
from .identity import ARCH_SPECIFIC_TARGETS

BLOCK_THREADS = 256
WINOGRAD_ALGOS = ("megakernel", "nonfused")      # the algos of the Winograd modules
MODULE_SOURCES = WINOGRAD_ALGOS + ("pointwise",)  # every module built from the GEMM tiles (cuda/<source>.cu)
# How the batched GEMM multiplies (cuda/gemm.cuh) -> its (MW_GEMM_TF32X3, MW_GEMM_BF16X3) values.
# "3xtf32": tensor cores, each fp32 operand split into two TF32 parts, fp32 accumulation (the
# default: fp32-level error, below the FFMA chain's on the suite); "ffma": one FFMA chain per
# element; "bf16x3": the TF32-grade mode, each operand split into two BF16 parts (three products,
# fp32 accumulation): error well under PyTorch's TF32 convolutions' (README, "TF32-grade mode").
GEMM_MATHS = {"3xtf32": (1, 0), "ffma": (0, 0), "bf16x3": (0, 1)}
DEFAULT_GEMM_MATH = "3xtf32"


def gemm_output_tasks_allowed(gemm_math: str) -> bool:
    """Whether plans of ``gemm_math`` may run GEMM_OUTPUT tasks (cuda/gemm_output.cuh multiplies
    3xTF32 on float32 operands only)."""
    return check_gemm_math(gemm_math) == "3xtf32"


def check_gemm_math(gemm_math: str) -> str:
    if gemm_math not in GEMM_MATHS:
        raise ValueError(f"gemm_math must be one of {tuple(GEMM_MATHS)}, got {gemm_math!r}")
    return gemm_math


def gpu_available() -> bool:
    """True when CuPy is installed and sees a CUDA device."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return bool(cupy.is_available())
    except Exception:  # driver missing or broken
        return False


def cupy_module():
    """The cupy module, or a RuntimeError that says how to install it."""
    try:
        import cupy
    except ImportError:  # pragma: no cover - depends on the machine
        raise RuntimeError("megawino's GPU runtime needs CuPy (pip install 'megawino[gpu]'); without a "
                           "GPU, megawino.conv2d_cpu runs the reference path") from None
    return cupy


def as_cupy(arr, name: str):
    """``arr`` as a CuPy array: CuPy arrays as they are, DLPack GPU tensors through
    ``cupy.from_dlpack``; anything else (NumPy arrays included) is a ValueError."""
    cupy = cupy_module()
    if isinstance(arr, cupy.ndarray):
        return arr
    if hasattr(arr, "__dlpack__") and not isinstance(arr, np.ndarray):
        return cupy.from_dlpack(arr)
    raise ValueError(f"{name} must be a CuPy array (or a DLPack GPU tensor), got {type(arr).__name__}")


# ---------------------------------------------------------------------------
# Compilation (NVRTC via CuPy), cached per build
# ---------------------------------------------------------------------------

_MODULES: dict = {}
_LOCK = threading.Lock()

EXTRA_DEFINES_ENV = "MEGAWINO_CUDA_DEFINES"


# What a user sets instead of each define the runtime owns (compile_options decides which
# defines those are; tests check that every one of them has a hint here).
OWNED_DEFINE_HINTS = {
    "MW_M": "the task parameters' m (TaskParams(m=...))",
    "MW_NHWC": "the layer's layout (LayerSpec(layout=...) or conv2d(layout=...))",
    "MW_TRACE": "plan(..., trace=True)",
    "MW_GEMM_TF32X3": "the gemm_math= argument of conv2d / plan",
    "MW_GEMM_BF16X3": "the gemm_math= argument of conv2d / plan",
    "MW_SOURCE_HASH": "nothing: it keys the kernel cache to the CUDA sources",
    "MW_NONFUSED_MODULE": "nothing: cuda/nonfused.cu defines it (the non-fused module's U format)",
}
# Defines a CUDA source sets itself: which module it is (cuda/params.cuh).
SOURCE_DEFINES = frozenset({"MW_NONFUSED_MODULE"})
_DEFINE_RE = re.compile(r"-D([A-Za-z_][A-Za-z0-9_]*)(=\S*)?")


def define_name(option: str) -> str | None:
    """NAME of a well-formed ``-DNAME`` / ``-DNAME=VALUE`` option, else None."""
    match = _DEFINE_RE.fullmatch(option)
    return match.group(1) if match else None


def extra_defines() -> tuple[str, ...]:
    """``-D`` options from ``$MEGAWINO_CUDA_DEFINES`` added to every megakernel / non-fused
    compile: how an opt-in CUDA build runs under the tests and bench scripts.
    Malformed entries and defines the runtime owns (:func:`owned_defines`) are a ValueError."""
    return check_extra_defines(tuple(os.environ.get(EXTRA_DEFINES_ENV, "").split()))


def check_extra_defines(extra) -> tuple[str, ...]:
    """``extra`` if every entry is ``-DNAME`` or ``-DNAME=VALUE`` and no NAME is one the runtime
    owns (:func:`owned_defines`); else a ValueError naming the entry."""
    extra = tuple(extra)
    bad = [t for t in extra if define_name(t) is None]
    if bad:
        raise ValueError(f"{EXTRA_DEFINES_ENV} takes -DNAME or -DNAME=VALUE options only, got "
                         f"{' '.join(bad)}")
    for option in extra:
        name = define_name(option)
        if name in owned_defines():
            hint = OWNED_DEFINE_HINTS.get(name, "the runtime's own arguments")
            raise ValueError(f"{EXTRA_DEFINES_ENV}: {option} sets {name}, which the runtime "
                             f"defines itself; use {hint} instead")
    return extra


def _runtime_options(m: int, layout: str, trace: bool, gemm_math: str) -> list[str]:
    """The options the runtime itself passes (include path, standard, its own defines)."""
    check_gemm_math(gemm_math)
    opts = ["-I" + str(cuda_dir()), "--std=c++17", f"-DMW_M={int(m)}",
            f"-DMW_NHWC={1 if layout == 'NHWC' else 0}", f"-DMW_SOURCE_HASH={source_hash()}",
            f"-DMW_GEMM_TF32X3={GEMM_MATHS[gemm_math][0]}", f"-DMW_GEMM_BF16X3={GEMM_MATHS[gemm_math][1]}"]
    if trace:
        opts.append("-DMW_TRACE")
    return opts


@functools.lru_cache(maxsize=1)
def owned_defines() -> frozenset[str]:
    """Names of the defines the runtime sets in some build (of :func:`compile_options`, traced:
    MW_TRACE is owned even where a build leaves it undefined), and those the sources set."""
    names = (define_name(o) for o in _runtime_options(4, "NCHW", True, DEFAULT_GEMM_MATH))
    return frozenset(n for n in names if n is not None) | SOURCE_DEFINES


def compile_options(m: int, layout: str, trace: bool, gemm_math: str = DEFAULT_GEMM_MATH) -> tuple[str, ...]:
    return with_defines(_runtime_options(m, layout, trace, gemm_math), extra_defines())


def with_defines(options, extra) -> tuple[str, ...]:
    """``options`` + ``extra``; an entry of ``extra`` that is malformed or defines a name the
    runtime owns is a ValueError (a build must not silently change m, the layout, tracing or
    the GEMM arithmetic under a plan that was made for other values)."""
    return tuple(options) + check_extra_defines(extra)


# Compute capabilities whose architecture-specific target the kernels are built for
# (megawino.gpu.identity); NVRTC takes this -arch after CuPy's own.


def arch_options(compute_capability: str) -> tuple[str, ...]:
    """The ``-arch`` option for a device of ``compute_capability`` (CuPy's string, e.g. "90"):
    its architecture-specific target where one is used, else none (CuPy's own -arch)."""
    target = ARCH_SPECIFIC_TARGETS.get(str(compute_capability))
    return (f"-arch={target}",) if target else ()


def module(source: str, m: int, layout: str, trace: bool = False, gemm_math: str = DEFAULT_GEMM_MATH):
    """The compiled RawModule of ``cuda/<source>.cu`` for one build (its compile-time options), built for the current
    device: ``megakernel`` or ``nonfused`` (the Winograd modules), or ``pointwise`` (the 1x1
    GEMM kernels, which read neither m nor the layout)."""
    if source not in MODULE_SOURCES:
        raise ValueError(f"source must be one of {MODULE_SOURCES}, got {source!r}")
    build = (source, int(m), layout, bool(trace and source == "megakernel"), check_gemm_math(gemm_math),
               source_hash(), extra_defines())    # checked before CuPy is imported
    cupy = cupy_module()
    capability = cupy.cuda.Device().compute_capability
    key = build + (capability,)
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            code = (cuda_dir() / f"{source}.cu").read_text()
            options = compile_options(m, layout, key[3], gemm_math) + arch_options(capability)
            mod = cupy.RawModule(code=code, options=options)
            _MODULES[key] = mod
    return mod


def module_int(mod, name: str) -> int:
    """The value of a compiled module's ``extern "C" __device__ int`` ``name``."""
    return module_ints(mod, name, 1)[0]


def module_ints(mod, name: str, count: int) -> list[int]:
    """The values of a compiled module's ``extern "C" __device__ int name[count]``."""
    cupy = cupy_module()
    return [int(v) for v in cupy.ndarray((count,), cupy.int32, memptr=mod.get_global(name)).get()]


def gemm_smem_bytes(mod, c_stride: int) -> int:
    """Dynamic shared memory of a launch whose GEMM tiles reduce over ``c_stride`` k (cuda/gemm_config.cuh
    ``mw_gemm_smem_bytes_by_k_tiles``: a ring of fewer k tiles than stages leaves the rest to the L1)."""
    by_k_tiles = module_ints(mod, "mw_gemm_smem_bytes_by_k_tiles", 4)
    k_tiles = -(-int(c_stride) // module_int(mod, "mw_gemm_k_per_tile"))
    return by_k_tiles[min(k_tiles, len(by_k_tiles)) - 1]


def gemm_uses_wgmma(mod) -> bool:
    """Whether a compiled Winograd module's GEMM runs on warpgroup MMAs (its ``mw_gemm_wgmma``)."""
    return bool(module_int(mod, "mw_gemm_wgmma"))


def operand_format(mod) -> str:
    """How a compiled Winograd module keeps U and V (``mw_split_operands``, ``mw_u_paired``): one of
    megawino.core.abi.OPERAND_FORMATS."""
    if module_int(mod, "mw_split_operands"):
        return "split_bf16"
    return "float32_u_paired" if module_int(mod, "mw_u_paired") else "float32"


class GemmSmemKernel:
    """A kernel of a module that keeps the GEMM tile's shared memory (``GemmSmem``, cuda/gemm_config.cuh)
    in dynamic shared memory: the megakernel, the non-fused GEMM kernel and the pointwise
    kernels.  Every launch passes ``shared_bytes`` (calls here, KernelLaunch, blocks_per_sm;
    ``kernel`` is the driver function as on a RawKernel): all of the module's
    ``mw_gemm_smem_bytes``, or with ``c_stride`` what GEMM tiles of that depth use
    (gemm_smem_bytes), or after ``reserve_gemm_output`` at least ``gemm_output_bytes``.  The
    driver function is allowed the larger of ``mw_gemm_smem_bytes`` and ``gemm_output_bytes``:
    every plan of a module shares that function, so each sets the same value and none takes
    away what another launches with."""

    def __init__(self, mod, name: str, c_stride: int | None = None, gemm_output_bytes: int = 0):
        self._raw = mod.get_function(name)
        whole = module_int(mod, "mw_gemm_smem_bytes")
        self.gemm_output_bytes = gemm_output_bytes
        self._raw.max_dynamic_shared_size_bytes = max(whole, gemm_output_bytes)
        self.shared_bytes = whole if c_stride is None else gemm_smem_bytes(mod, c_stride)
        self.kernel = self._raw.kernel

    @classmethod
    def winograd(cls, mod, name: str, c_stride: int | None = None) -> "GemmSmemKernel":
        """A kernel of a Winograd module (megakernel.cu, nonfused.cu), whose plans with GEMM_OUTPUT
        tasks launch with ``mw_gemm_output_smem_bytes``."""
        return cls(mod, name, c_stride, module_int(mod, "mw_gemm_output_smem_bytes"))

    def reserve_gemm_output(self) -> None:
        """Launch with at least the GEMM_OUTPUT task's shared memory (a group's products wait there)."""
        self.shared_bytes = max(self.shared_bytes, self.gemm_output_bytes)

    def __call__(self, grid, block, args, stream=None):
        self._raw(grid, block, args, shared_mem=self.shared_bytes, stream=stream)


def blocks_per_sm(fn, threads: int = BLOCK_THREADS) -> int:
    """Resident blocks per SM of a loaded kernel (the occupancy API), with the dynamic shared
    memory its launches pass."""
    from cupy_backends.cuda.api import driver
    ptr = int(getattr(fn, "kernel", fn).ptr)
    dynamic_smem = int(getattr(fn, "shared_bytes", 0))
    return int(driver.occupancyMaxActiveBlocksPerMultiprocessor(ptr, threads, dynamic_smem))
