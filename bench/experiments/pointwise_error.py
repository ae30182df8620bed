"""Per-layer error of the pointwise path on a model's own activations (GPU): each 1x1 stride-1
layer's input captured in one forward, then that layer run as megawino's pointwise path and as
cuDNN IEEE fp32, both against a float64 convolution of the same input.

    python3 bench/experiments/pointwise_error.py --model resnet50 --batch 8
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import set_fp32_precision  # noqa: E402
from models import MODELS, build_model  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet50", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import megawino.torch as mwt
    from megawino.direct.pointwise import check_pointwise
    from megawino import LayerSpec
    torch.manual_seed(0)
    model = build_model(args.model).eval().cuda()
    resolution = MODELS[args.model][1]
    captured = []

    def hook(module, inputs, _out):
        if module.kernel_size == (1, 1) and module.stride == (1, 1) and module.padding == (0, 0):
            captured.append((module, inputs[0].detach().clone()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    set_fp32_precision("ieee")
    with torch.inference_mode():
        model(torch.randn(args.batch, 3, resolution, resolution, device="cuda"))
    for h in handles:
        h.remove()
    rel = lambda y, ref: float((y.double() - ref).norm() / ref.norm())
    print(f"{'layer':28s} {'pointwise':>10s} {'cudnn':>10s} {'x>=0':>5s}")
    for module, x in captured:
        w = module.weight.detach()
        n, c, h, wd = x.shape
        try:
            check_pointwise(LayerSpec(n, c, w.shape[0], h, wd, 1, 1, 1, 0))
        except ValueError:
            continue
        with torch.inference_mode():
            ref = F.conv2d(x.double(), w.double())
            ours = mwt.conv2d(x, w, algo="pointwise")
            theirs = F.conv2d(x, w)
        print(f"{c:4d}->{w.shape[0]:4d} {h}x{wd:<14d} {rel(ours, ref):10.2e} {rel(theirs, ref):10.2e} "
              f"{str(bool((x >= 0).all())):>5s}")


if __name__ == "__main__":
    main()
