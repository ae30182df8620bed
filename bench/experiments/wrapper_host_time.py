"""Host time of a converted layer whose measured choice is PyTorch (MegawinoConv2d's first branch)
against nn.Conv2d, on CPU tensors (the Python side only), under three settings of the cuDNN
precision flags: torch's default (conv "tf32"), the legacy ``allow_tf32 = False`` (conv "none")
and conv "ieee".  Run from outside the checkout: python3 bench/experiments/wrapper_host_time.py"""
import torch, time, copy
from torch import nn
from megawino.torch.modules import MegawinoConv2d
torch.set_num_threads(1)
x=torch.randn(1,4,2,2); c=nn.Conv2d(4,4,3,padding=1)
mc=copy.deepcopy(c); mc.__class__=MegawinoConv2d; mc._set_megawino("auto","auto","3xtf32")
def bench(f):
    for _ in range(500): f(x)
    best=1e9
    for r in range(9):
        t=time.perf_counter()
        for _ in range(5000): f(x)
        best=min(best,(time.perf_counter()-t)/5000*1e6)
    return round(best,2)
for label, setup in [("default (conv tf32)", lambda: None), ("legacy allow_tf32=False", lambda: setattr(torch.backends.cudnn, "allow_tf32", False)), ("conv ieee", lambda: setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee"))]:
    setup()
    with torch.no_grad():
        s=(x.shape, x.device, x.dtype, x.is_contiguous(), x.requires_grad, mc.weight.requires_grad, torch.is_grad_enabled())
        mc.__dict__["_megawino_pytorch_signature"]=s
        print(f"{label:26s} conv={torch.backends.cudnn.conv.fp32_precision:5s} nn.Conv2d {bench(c):6.2f} us  MegawinoConv2d (PyTorch path) {bench(mc):6.2f} us")
