"""Host time of a PyTorch-chosen converted layer with the conv precision flag read and switched
through torch's C functions (megawino.torch.precision's fast path) and through the
torch.backends attributes (its fallback), on CPU tensors, under torch's default conv flag
("tf32", switched at each call), the legacy ``allow_tf32 = False`` and "ieee".
Run from outside the checkout: python3 bench/experiments/flag_access_host_time.py"""
import copy
import time

import torch
from torch import nn

from megawino.torch import precision
from megawino.torch.modules import MegawinoConv2d

torch.set_num_threads(1)
x = torch.randn(1, 4, 2, 2)
plain = nn.Conv2d(4, 4, 3, padding=1)
layer = copy.deepcopy(plain)
layer.__class__ = MegawinoConv2d
layer._set_megawino("auto", "auto", "3xtf32")
fast_access = precision._conv_flag_access()
attribute_access = lambda: None  # noqa: E731


def best_us(calls, rounds=15):
    """Best µs per call of each of ``calls`` (name -> f), their rounds interleaved against drift."""
    best = dict.fromkeys(calls, float("inf"))
    for f in calls.values():
        for _ in range(500):
            f()
    for _ in range(rounds):
        for name, f in calls.items():
            t = time.perf_counter()
            for _ in range(2000):
                f()
            best[name] = min(best[name], (time.perf_counter() - t) / 2000 * 1e6)
    return best


def through(access):
    def call():
        precision._conv_flag_access = access
        return layer(x)
    return call


settings = [("default (conv tf32)", lambda: None),
            ("legacy allow_tf32=False", lambda: setattr(torch.backends.cudnn, "allow_tf32", False)),
            ("conv ieee", lambda: setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee"))]
print(f"C functions: {fast_access is not None}")
with torch.no_grad():
    signature = (x.shape, x.device, x.dtype, x.is_contiguous(), x.requires_grad, layer.weight.requires_grad,
                 torch.is_grad_enabled())
    layer.__dict__["_megawino_pytorch_signature"] = signature
    for label, setup in settings:
        setup()
        row = best_us({"nn.Conv2d": lambda: plain(x), "MegawinoConv2d, C functions": through(lambda: fast_access),
                       "MegawinoConv2d, attributes": through(attribute_access)})
        print(f"{label:26s} " + "  ".join(f"{k} {v:6.2f} us" for k, v in row.items()))
