"""cuDNN float32 through PyTorch, timed the same way as megawino (``megawino.gpu.timing``):
the side-by-side number for ``megawino sweep --compare cudnn`` and ``megawino tune``.

TF32 is off and ``cudnn.benchmark`` on; both NCHW and channels_last run and the
faster counts ("best fp32"), as in bench/compare.py and the suite's baseline.
"""
from __future__ import annotations

from ..core.spec import LayerSpec
from .timing import time_cuda_stats


def torch_module():
    """PyTorch with cuDNN set for float32 comparisons, or None when it is not importable."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def cudnn_fp32_us(spec: LayerSpec, xs_nchw, w, warmup: int = 5, reps: int = 20) -> dict:
    """Median microseconds of torch's conv2d (cuDNN, float32) on CuPy inputs ``xs_nchw``
    (a rotation list of [N][C][H][W] arrays) and ``w``: {"nchw_us", "nhwc_us", "best_us"}."""
    torch = torch_module()
    if torch is None:
        raise RuntimeError("--compare cudnn needs PyTorch with CUDA")
    conv = torch.nn.functional.conv2d
    tw = torch.from_dlpack(w)
    ts = [torch.from_dlpack(x) for x in xs_nchw]
    out = {}
    for name, fmt in (("nchw_us", torch.contiguous_format), ("nhwc_us", torch.channels_last)):
        inputs = [t.contiguous(memory_format=fmt) for t in ts]
        weight = tw.contiguous(memory_format=fmt)
        fn = lambda t: conv(t, weight, None, spec.stride, spec.padding)  # noqa: E731
        out[name] = time_cuda_stats(fn, inputs, warmup, reps)["median_us"]
        del inputs
    out["best_us"] = min(out["nchw_us"], out["nhwc_us"])
    return out
