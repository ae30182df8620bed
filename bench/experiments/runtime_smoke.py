"""Smoke timing of the asynchronous runtime on a GPU: host time per conv2d call on a small
cached layer (no synchronisation) against torch.nn.functional.conv2d, and the device time of
a layer with and without a weight token (prepared U)."""
from __future__ import annotations

import argparse

import numpy as np

import megawino
from megawino.core.spec import LayerSpec
from megawino.gpu.timing import host_time_per_call


def host_us(fn, calls=2000):
    import cupy as cp
    return host_time_per_call(fn, calls, cp.cuda.Device().synchronize, warmup=1)[0]


def device_us(fn, reps=15, calls=20):
    """Median device time per call over bursts of ``calls`` back-to-back calls (the GPU stays
    busy, so host time per call does not count while it is below the device time)."""
    import cupy as cp
    for _ in range(3):
        fn()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(reps):
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) * 1e3 / calls)
    return float(np.median(times))


def main(argv=None):
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    import cupy as cp
    spec = LayerSpec(1, 64, 64, 14, 14)
    x = cp.random.standard_normal(spec.input_shape, dtype=cp.float32)
    w = cp.random.standard_normal(spec.weight_shape, dtype=cp.float32)
    y = cp.empty(spec.output_shape, dtype=cp.float32)
    rows = []
    for algo in ("megakernel", "nonfused", "direct"):
        rows.append((f"host us/call conv2d {algo} check=True", host_us(
            lambda: megawino.conv2d(x, w, padding=1, algo=algo, out=y))))
        rows.append((f"host us/call conv2d {algo} token", host_us(
            lambda: megawino.conv2d(x, w, padding=1, algo=algo, out=y, check=False, weight_token=1))))
    p = megawino.plan(spec)
    rows.append(("host us/call plan() megakernel", host_us(lambda: p(x, w, out=y, check=False))))
    try:
        import torch
        xt, wt = torch.from_dlpack(x), torch.from_dlpack(w)
        rows.append(("host us/call torch F.conv2d", host_us(
            lambda: torch.nn.functional.conv2d(xt, wt, padding=1))))
    except Exception as exc:  # noqa: BLE001
        rows.append((f"torch unavailable: {exc}", float("nan")))
    megawino.synchronize()
    for shape in (LayerSpec(64, 256, 256, 14, 14), LayerSpec(64, 512, 512, 7, 7), LayerSpec(64, 64, 64, 56, 56)):
        x = cp.random.standard_normal(shape.input_shape, dtype=cp.float32)
        w = cp.random.standard_normal(shape.weight_shape, dtype=cp.float32)
        y = cp.empty(shape.output_shape, dtype=cp.float32)
        for algo in ("megakernel", "nonfused"):
            full = device_us(lambda: megawino.conv2d(x, w, padding=1, algo=algo, out=y, check=False))
            prep = device_us(lambda: megawino.conv2d(x, w, padding=1, algo=algo, out=y, check=False,
                                                     weight_token=("bench", shape)))
            rows.append((f"device us {shape.describe()} {algo} full / prepared U", f"{full:.1f} / {prep:.1f}"))
        rows.append((f"auto choice {shape.describe()}", megawino.runtime.choose_algo(shape)))
    megawino.synchronize()
    for name, value in rows:
        print(f"{name:60s} {value if isinstance(value, str) else f'{value:.1f}'}")


if __name__ == "__main__":
    main()
