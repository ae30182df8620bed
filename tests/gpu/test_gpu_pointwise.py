"""GPU tests of the pointwise path (1x1 stride-1 layers on the GEMM tiles): float64 reference on
fresh inputs, poisoned outputs, both layouts, partial row and column tiles, bitwise identity
across row-tile heights and between the wgmma and mma.sync builds, prepared weights under
tokens, and the refusals.  Marked ``gpu``."""
from __future__ import annotations

import numpy as np
import pytest

from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2

pytestmark = pytest.mark.gpu

# Partial row tiles (K = 48, 200; N*H*W = 3*12*10), C not a multiple of the 16-wide k tile,
# a shape with 128-row tiles and a full-size ResNet layer.
SHAPES = [(3, 36, 48, 12, 10), (2, 20, 200, 6, 6), (1, 64, 256, 28, 28), (4, 256, 512, 14, 14),
          (2, 1024, 96, 8, 8)]
TOLERANCE = 2e-6


def _cp():
    import cupy
    return cupy


def _inputs(spec: LayerSpec, seed: int):
    """NCHW x (non-zero mean) and w as float32 NumPy arrays."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((spec.N, spec.C, spec.H, spec.W)) + 0.3).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    return x, w


def _layout_in(x, layout):
    return x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def _run(plan, xd, wd, token=None):
    cp = _cp()
    out = cp.full(plan.spec.output_shape, np.nan, dtype=cp.float32)     # poisoned
    plan(xd, wd, out=out, weight_token=token)
    cp.cuda.get_current_stream().synchronize()
    return out


def _to_nchw(y, layout):
    y = y.get() if hasattr(y, "get") else y
    return y if layout == "NCHW" else y.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dims", SHAPES)
def test_pointwise_matches_float64_and_is_the_same_for_every_tile_height(dims, layout):
    from megawino.direct.pointwise import PointwisePlan
    cp = _cp()
    n, c, k, h, w_ = dims
    spec = LayerSpec(n, c, k, h, w_, 1, 1, 1, 0, layout)
    x, w = _inputs(spec, seed=sum(dims))
    ref = direct_conv_nchw(x, w, 1, 0)
    xd, wd = cp.asarray(_layout_in(x, layout)), cp.asarray(w)
    outs = {}
    for rows in (128, 64):
        y = _run(PointwisePlan(spec, tile_rows=rows), xd, wd)
        assert bool(cp.isfinite(y).all()), f"{rows}-row tiles left poisoned outputs"
        err = rel_l2(_to_nchw(y, layout), ref)
        assert err < TOLERANCE, (rows, err)
        outs[rows] = y
    assert bool((outs[128] == outs[64]).all()), "128- and 64-row tiles differ bitwise"


def test_pointwise_wgmma_and_mma_sync_builds_agree_bitwise(monkeypatch):
    import megawino
    from megawino.gpu import nvrtc
    cp = _cp()
    capability = cp.cuda.Device().compute_capability
    spec = LayerSpec(2, 96, 160, 10, 12, 1, 1, 1, 0)
    x, w = _inputs(spec, seed=7)
    xd, wd = cp.asarray(x), cp.asarray(w)
    outs = {}
    for define in ("", "-DMW_GEMM_WGMMA=0"):
        monkeypatch.setenv(nvrtc.EXTRA_DEFINES_ENV, define)
        mod = nvrtc.module("pointwise", 4, "NCHW")
        assert nvrtc.gemm_uses_wgmma(mod) == (capability == "90" and not define)
        outs[define] = _run(megawino.plan(spec, algo="pointwise"), xd, wd)
    assert bool((outs[""] == outs["-DMW_GEMM_WGMMA=0"]).all()), "wgmma and mma.sync pointwise builds differ"
    assert rel_l2(outs[""].get(), direct_conv_nchw(x, w, 1, 0)) < TOLERANCE


def test_nhwc_prepared_weights_follow_the_token():
    """NHWC prepares the transposed filter per token: a new token after new weights gives the new
    result, and the same token reuses the prepared filter bitwise."""
    import megawino
    cp = _cp()
    spec = LayerSpec(2, 32, 64, 9, 7, 1, 1, 1, 0, "NHWC")
    x, w = _inputs(spec, seed=11)
    xd, wd = cp.asarray(_layout_in(x, "NHWC")), cp.asarray(w)
    first = megawino.conv2d(xd, wd, padding=0, algo="pointwise", layout="NHWC", weight_token="w1")
    again = megawino.conv2d(xd, wd, padding=0, algo="pointwise", layout="NHWC", weight_token="w1")
    megawino.synchronize()
    assert bool((first == again).all())
    w2 = -2.0 * w + 0.5
    wd[...] = cp.asarray(w2)
    second = megawino.conv2d(xd, wd, padding=0, algo="pointwise", layout="NHWC", weight_token="w2")
    megawino.synchronize()
    assert rel_l2(_to_nchw(second, "NHWC"), direct_conv_nchw(x, w2, 1, 0)) < TOLERANCE


def test_pointwise_refusals_come_before_any_launch():
    import megawino
    cp = _cp()
    x = cp.ones((1, 8, 7, 7), dtype=cp.float32)
    with pytest.raises(ValueError, match="H\\*W divisible by 4"):
        megawino.conv2d(x, cp.ones((16, 8, 1, 1), dtype=cp.float32), padding=0, algo="pointwise")
    with pytest.raises(ValueError, match="1x1 filters"):
        megawino.conv2d(x, cp.ones((16, 8, 3, 3), dtype=cp.float32), padding=1, algo="pointwise")
    with pytest.raises(ValueError, match="C divisible by 4"):
        megawino.conv2d(cp.ones((1, 6, 8, 8), dtype=cp.float32), cp.ones((16, 6, 1, 1), dtype=cp.float32),
                        padding=0, algo="pointwise")


def test_auto_and_torch_run_pointwise_layers_correctly():
    """algo='auto' measures the pointwise path against the direct path for a 1x1 layer, and
    megawino.torch runs it on torch tensors (NCHW and channels_last) against float64."""
    torch = pytest.importorskip("torch")
    import megawino
    import megawino.torch as mwt
    cp = _cp()
    spec = LayerSpec(8, 128, 256, 20, 20, 1, 1, 1, 0)
    from megawino import runtime
    assert runtime.candidate_algos(spec) == ("direct", "pointwise")
    x, w = _inputs(spec, seed=5)
    ref = direct_conv_nchw(x, w, 1, 0)
    y = megawino.conv2d(cp.asarray(x), cp.asarray(w), padding=0)
    megawino.synchronize()
    assert rel_l2(y.get(), ref) < TOLERANCE
    xt, wt = torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()
    for memory_format in (torch.contiguous_format, torch.channels_last):
        out = mwt.conv2d(xt.contiguous(memory_format=memory_format), wt, algo="pointwise")
        assert out.is_contiguous(memory_format=memory_format)
        assert rel_l2(out.cpu().numpy(), ref) < TOLERANCE
