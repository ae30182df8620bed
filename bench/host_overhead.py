"""Host time per call of megawino's PyTorch and CuPy entry points against PyTorch's own, on a tiny
cached 3x3 layer (and a 1x1 one): bench/models.py's last table."""
from __future__ import annotations

from common import set_fp32_precision

OVERHEAD_SHAPE = (1, 16, 16, 8, 8)    # N, C, K, H, W of the tiny 3x3 layer of the overhead rows


def host_overhead(calls: int) -> list[dict]:
    """Host µs per call, ``calls`` back-to-back calls without synchronising (and the total per
    call once the GPU has caught up), on a tiny cached 3x3 layer."""
    import torch
    import torch.nn.functional as F
    import cupy
    import megawino
    import megawino.torch as mwt
    from megawino import runtime
    from megawino.gpu.timing import host_time_per_call
    from megawino.torch.gpu import weight_token
    n, c, k, h, w = OVERHEAD_SHAPE
    x = torch.randn(n, c, h, w, device="cuda")
    weight = torch.randn(k, c, 3, 3, device="cuda")
    set_fp32_precision("ieee")
    x_cupy, w_cupy = cupy.from_dlpack(x), cupy.from_dlpack(weight)
    runtime_token = weight_token(weight)
    variants = {
        "torch.nn.functional.conv2d": lambda: F.conv2d(x, weight, None, 1, 1),
        "megawino.runtime.conv2d (CuPy, megakernel)": lambda: runtime.conv2d(
            x_cupy, w_cupy, 1, 1, algo="megakernel", weight_token=runtime_token),
    }
    for algo in ("megakernel", "direct", "auto"):
        variants[f"megawino.torch.conv2d algo={algo}"] = (
            lambda algo=algo: mwt.conv2d(x, weight, None, 1, 1, algo=algo))
    # Layers as a converted model calls them (the later calls of a MegawinoConv2d), against the
    # plain nn.Conv2d of the same shape.
    for r, algos in ((3, ("megakernel", "nonfused", "direct")), (1, ("pointwise",))):
        plain = torch.nn.Conv2d(c, k, r, padding=r // 2, bias=False).cuda().eval()
        variants[f"nn.Conv2d {r}x{r} (PyTorch)"] = lambda plain=plain: plain(x)
        for algo in algos + (("pytorch",) if r == 3 else ()):
            layer = mwt.MegawinoConv2d(c, k, r, padding=r // 2, bias=False, algo=algo).cuda().eval()
            variants[f"MegawinoConv2d {r}x{r} algo={algo}"] = lambda layer=layer: layer(x)
    rows = []
    with torch.inference_mode():
        def synchronize():
            torch.cuda.synchronize()
            megawino.synchronize()

        for label, call in variants.items():
            host_us, total_us = host_time_per_call(call, calls, synchronize, warmup=50)
            rows.append({"call": label, "calls": calls, "host_us": host_us, "total_us": total_us})
    _, ran = mwt.functional.conv2d_with_algo(x, weight, None, 1, 1)
    auto = next(row for row in rows if row["call"] == "megawino.torch.conv2d algo=auto")
    auto["call"] += f" (runs {ran})"
    return rows


def overhead_table(rows: list[dict]):
    from rich.table import Table
    n, c, k, h, w = OVERHEAD_SHAPE
    table = Table(title=f"host time per call, N{n} C{c} K{k} {h}x{w} (3x3 unless named; cached layer)")
    for column in ("call", "host µs / call", "with the GPU µs / call"):
        table.add_column(column, justify="left" if column == "call" else "right")
    for row in rows:
        if "error" in row:
            table.add_row(row["call"], f"[red]{row['error']}[/]", "")
        else:
            table.add_row(row["call"], f"{row['host_us']:.1f}", f"{row['total_us']:.1f}")
    return table
