"""Why is a converted DenseNet-161 at batch 1 slower than PyTorch when every layer runs PyTorch?
Times whole forwards (CUDA events) of the plain model, the converted model with every layer
forced to PyTorch, with the garbage collector on and off, and after megawino's caches were
filled by a converted ResNet-50."""
from __future__ import annotations

import argparse
import gc
import statistics


def time_ms(model, x, reps=20):
    import torch
    for _ in range(3):
        model(x)
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        model(x)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main(argv=None):
    argparse.ArgumentParser(description=__doc__).parse_args(argv)
    import torch
    import torchvision

    import megawino.torch as mwt
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    x = torch.randn(1, 3, 224, 224, device="cuda")
    rows = []
    with torch.inference_mode():
        plain = torchvision.models.densenet161().eval().cuda()
        rows.append(("plain", time_ms(plain, x)))
        forced = torchvision.models.densenet161().eval().cuda()
        mwt.convert(forced, algo="pytorch", verbose=False)
        rows.append(("converted, algo=pytorch", time_ms(forced, x)))
        gc.disable()
        rows.append(("converted, algo=pytorch, gc off", time_ms(forced, x)))
        rows.append(("plain, gc off", time_ms(plain, x)))
        gc.enable()
        auto = torchvision.models.densenet161().eval().cuda()
        mwt.convert(auto, example_input=x, verbose=False)
        rows.append(("converted, auto", time_ms(auto, x)))
        gc.freeze()
        rows.append(("converted, auto, gc.freeze()", time_ms(auto, x)))
        rows.append(("plain again", time_ms(plain, x)))
    for name, ms in rows:
        print(f"{name:40s} {ms:8.2f} ms")


if __name__ == "__main__":
    main()
