"""Where the host time of one small megawino call goes (GPU): per-call host µs of variants of
the call on a tiny cached layer, the GPU time per call in a burst, and a cProfile of the
slowest variant."""
from __future__ import annotations

import argparse
import cProfile
import pstats

import megawino
from megawino import runtime
from megawino.gpu import workspace
from megawino.gpu.timing import host_time_per_call


def host_us(fn, calls=1000):
    import torch
    return host_time_per_call(fn, calls, torch.cuda.synchronize)


def main(argv=None):
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    import cupy as cp
    import torch
    x = torch.randn(1, 16, 8, 8, device="cuda")
    w = torch.randn(16, 16, 3, 3, device="cuda")
    y = torch.empty(1, 16, 8, 8, device="cuda")
    xc, wc, yc = cp.from_dlpack(x), cp.from_dlpack(w), cp.from_dlpack(y)
    rows = {}
    rows["F.conv2d"] = host_us(lambda: torch.nn.functional.conv2d(x, w, None, 1, 1))
    rows["cupy.from_dlpack x3"] = host_us(lambda: (cp.from_dlpack(x), cp.from_dlpack(w), cp.from_dlpack(y)))
    for algo in ("megakernel", "nonfused", "direct"):
        rows[f"{algo} out= token"] = host_us(lambda: runtime.conv2d(xc, wc, 1, 1, algo=algo, out=yc, weight_token=1))
        rows[f"{algo} out= token check=False"] = host_us(
            lambda: runtime.conv2d(xc, wc, 1, 1, algo=algo, out=yc, weight_token=1, check=False))
    rows["megakernel no out, cupy alloc"] = host_us(lambda: runtime.conv2d(xc, wc, 1, 1, algo="megakernel", weight_token=1))
    p = runtime.plan(megawino.LayerSpec(1, 16, 16, 8, 8))
    rows["plan() direct call, token"] = host_us(lambda: p(xc, wc, out=yc, weight_token=1))
    rows["plan() direct call, no token"] = host_us(lambda: p(xc, wc, out=yc))
    workspace.set_allocator(lambda n: cp.from_dlpack(torch.empty(n, dtype=torch.uint8, device="cuda")))
    rows["megakernel no out, torch alloc"] = host_us(lambda: runtime.conv2d(xc, wc, 1, 1, algo="megakernel", weight_token=1))
    workspace.set_allocator(None)
    megawino.synchronize()
    for name, (h, t) in rows.items():
        print(f"{name:45s} host {h:8.1f} us   with GPU {t:8.1f} us")
    import megawino.torch as mwt
    x1, w1 = torch.randn(1, 16, 8, 8, device="cuda"), torch.randn(16, 16, 1, 1, device="cuda")
    torch_calls = {f"megawino.torch {algo}": (lambda algo=algo: mwt.conv2d(x1, w1, algo=algo))
                   for algo in ("pointwise", "direct", "auto")}
    torch_calls["F.conv2d 1x1"] = lambda: torch.nn.functional.conv2d(x1, w1)
    for name, fn in torch_calls.items():
        h, t = host_us(fn)
        print(f"{name:45s} host {h:8.1f} us   with GPU {t:8.1f} us")
    calls = {"runtime.conv2d megakernel": lambda: runtime.conv2d(xc, wc, 1, 1, algo="megakernel", out=yc,
                                                                   weight_token=1),
             "megawino.torch pointwise": torch_calls["megawino.torch pointwise"]}
    for name, fn in calls.items():
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        print(f"--- cProfile of 300 calls: {name}")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
