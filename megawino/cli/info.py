"""``megawino info``: versions, GPU, nvcc."""
from __future__ import annotations

import os
import shutil
import sys

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="versions, GPU, nvcc")
    p.set_defaults(func=cmd_info)


def _version_of(module: str) -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(module)
        except PackageNotFoundError:
            pass
    except ImportError:  # pragma: no cover
        pass
    try:
        mod = __import__(module)
        return str(getattr(mod, "__version__", "installed"))
    except Exception as exc:   # a broken install can raise anything on import
        return f"not importable ({type(exc).__name__})"


def _gpu_rows(table, has_gpu: bool) -> None:
    """The GPU's identity, the tuned tables its plans read, and the simulator's ceilings."""
    from ..gpu import identity
    from ..gpu.nvrtc import GEMM_MATHS
    from ..tuning.choice import tables_in_use
    gpu = identity.current_identity() if has_gpu else identity.DEFAULT_TARGET
    where = "" if has_gpu else " (no GPU: the default target)"
    table.add_row("GPU identity", gpu.describe() + where)
    for gemm_math in GEMM_MATHS:
        try:
            text = tables_in_use(gpu, gemm_math)
        except ValueError as exc:        # a broken table: say which
            text = str(exc)
        style = "yellow" if text.startswith("none") or "No table of this GPU" in text else ""
        table.add_row(f"tables ({gemm_math})", Text(text, style=style))
    c = identity.ceilings(gpu)
    table.add_row("simulator ceilings", f"{c.bytes_per_s / 1e12:.2f} TB/s, {c.sms} SMs, "
                                        f"{c.flops_per_s / 1e12:.1f} TFLOP/s ({c.source})")


def cmd_info(args, out: Console, err: Console) -> int:
    import platform

    from .. import sweep
    from ..sweep import gpu as sweep_gpu
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column("what", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("megawino", sweep.megawino_version())
    table.add_row("python", f"{platform.python_version()} ({sys.executable})")
    for module in ("numpy", "networkx", "rich"):
        table.add_row(module, _version_of(module))
    problem = sweep_gpu._cupy_problem()
    try:
        from importlib.metadata import packages_distributions, version
        dists = packages_distributions().get("cupy", [])
        cupy_version = f"{version(dists[0])} ({dists[0]})" if dists else "not installed"
    except Exception:
        cupy_version = "unknown"
    table.add_row("cupy", Text(f"{cupy_version}: {problem}", style="yellow") if problem
                  else cupy_version)
    runtime, why = sweep.gpu_status()
    if runtime is not None:
        gpu_name = sweep.machine_info("gpu").get("gpu", "yes")
        table.add_row("GPU", Text(f"yes: {gpu_name}", style="green"))
    else:
        why = "see cupy above" if why.startswith("CuPy does not import") else why
        table.add_row("GPU", Text(f"no: {why} (the CPU executor and the simulator work)",
                                  style="yellow"))
    _gpu_rows(table, runtime is not None)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
                nvcc = os.path.join(root, "bin", "nvcc")
                break
    table.add_row("nvcc", nvcc or "not found (not needed: kernels compile with NVRTC)")
    from ..gpu.nvrtc import DEFAULT_GEMM_MATH, GEMM_MATHS, extra_defines
    others = ", ".join(repr(m) for m in GEMM_MATHS if m != DEFAULT_GEMM_MATH)
    table.add_row("Winograd GEMM", f"{DEFAULT_GEMM_MATH} by default (gemm_math={others} on conv2d / plan)")
    try:
        defines = extra_defines()
    except ValueError as exc:
        defines = (str(exc),)
    if defines:
        table.add_row("CUDA defines", Text(" ".join(defines), style="yellow"))
    out.print(table)
    return 0
