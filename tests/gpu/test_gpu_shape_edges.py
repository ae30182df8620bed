"""GPU: every size-1 dimension (N, C, K, H, W and the partial tiles they cause) on every path that
claims the layer (megakernel, non-fused, direct, pointwise), and stride / padding pairs and
non-square filters on the direct path, through megawino.conv2d and megawino.torch, against the
float64 reference with NaN-poisoned outputs (tests/cpu/test_shape_edges.py runs the CPU paths)."""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

import megawino
from megawino import runtime
from megawino.core.spec import LAYOUTS, LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2
from megawino.direct import conv2d_direct, rank
from fuzz_support import REL_L2_TOL

pytestmark = pytest.mark.gpu

SIZES = (1, 2, 3, 5, 32)
# Relative L2 against float64 per path: Winograd's bound for 1- and 2-channel layers at m = 4
# (the looser m), the direct kernel's fp32 sums, the pointwise 3xTF32 GEMM's.
TOLERANCE = {"megakernel": REL_L2_TOL[4], "nonfused": REL_L2_TOL[4], "direct": 1e-6, "pointwise": 2e-6}
MAX_WORK = 1 << 17


def _edge_layers() -> list[LayerSpec]:
    """For each dimension and each size of SIZES, layers with that dimension at that size and the
    others drawn from SIZES (seeded), each as 3x3 / padding 1, 3x3 / padding 0, 1x1 and 5x5."""
    rng = np.random.default_rng(38)
    layers = [LayerSpec(1, 1, 1, 1, 1), LayerSpec(1, 1, 1, 1, 1, R=1, S=1, padding=0)]
    for axis, size in itertools.product(range(5), SIZES):
        while True:
            dims = [int(rng.choice(SIZES)) for _ in range(5)]
            dims[axis] = size
            if np.prod(dims) <= MAX_WORK:
                break
        for R, padding in ((3, 1), (3, 0), (1, 0), (5, 2)):
            try:
                layers.append(LayerSpec(*dims, R=R, S=R, padding=padding))
            except ValueError:           # an empty output: a 3x3 without padding on a 1x1 image
                pass
    return layers


EDGE_LAYERS = _edge_layers()
PAIR_LAYERS = [   # Inception-v3's factorised 7x7s, strides and paddings that differ per dimension
    LayerSpec(2, 32, 32, 17, 17, R=1, S=7, padding=(0, 3)), LayerSpec(2, 32, 32, 17, 17, R=7, S=1, padding=(3, 0)),
    LayerSpec(1, 5, 1, 9, 32, R=1, S=7, padding=(0, 3)), LayerSpec(3, 2, 3, 32, 1, R=7, S=1, padding=(3, 0)),
    LayerSpec(2, 3, 8, 9, 11, R=3, S=5, padding=(1, 2)), LayerSpec(2, 4, 5, 13, 7, stride=(2, 1), padding=(1, 0)),
    LayerSpec(1, 3, 2, 8, 33, R=5, S=3, stride=(1, 3), padding=(0, 2)), LayerSpec(1, 1, 1, 1, 9, R=1, S=3, padding=(0, 1)),
    LayerSpec(2, 7, 33, 10, 10, R=2, S=4, stride=(3, 2), padding=(2, 0)),
]

# 1x1 layers the pointwise path claims in one layout or both: one output channel, one-row and
# one-column images, a single pixel (NHWC: N*H*W rows), partial row tiles.
POINTWISE_LAYERS = [LayerSpec(n, c, k, h, w, R=1, S=1, padding=0) for n, c, k, h, w in (
    (1, 4, 1, 1, 4), (1, 4, 1, 4, 1), (2, 32, 1, 2, 2), (1, 4, 2, 1, 32), (2, 4, 3, 32, 4), (1, 32, 5, 4, 4),
    (3, 4, 32, 1, 4), (1, 4, 4, 1, 1), (2, 8, 4, 1, 1), (1, 4, 32, 1, 1), (5, 36, 36, 3, 5), (1, 4, 4, 3, 3))]


def _arrays(spec: LayerSpec, seed: int = 0):
    """Host x (NCHW), w (no element zero, non-zero mean), and the device x in the layer's layout."""
    import cupy as cp
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.5, 2.0, (spec.N, spec.C, spec.H, spec.W)).astype(np.float32)
    w = rng.uniform(-0.5, 2.0, spec.weight_shape).astype(np.float32)
    xl = x if spec.layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return x, w, cp.asarray(xl), cp.asarray(w)


def _got(spec: LayerSpec, y) -> np.ndarray:
    import cupy as cp
    got = cp.asnumpy(y)
    return got if spec.layout == "NCHW" else got.transpose(0, 3, 1, 2)


def _check_every_algo(spec: LayerSpec, expect=None):
    """Each path that claims ``spec`` fills a poisoned output with the float64 result, with and
    without a weight token (the prepared-filter path), twice (the cached plan's path)."""
    import cupy as cp
    x, w, xd, wd = _arrays(spec)
    ref = direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), spec.stride, spec.padding)
    algos = runtime.candidate_algos(spec)
    if expect is not None:
        assert set(expect) <= set(algos), (spec.describe(), algos)
    assert algos, spec.describe()
    for algo, token, _ in itertools.product(algos, (None, ("edge", spec)), range(2)):
        out = cp.full(spec.output_shape, cp.nan, dtype=cp.float32)
        y = megawino.conv2d(xd, wd, stride=spec.stride, padding=spec.padding, algo=algo,
                            layout=spec.layout, out=out, weight_token=token)
        assert y is out
        got = _got(spec, y)
        assert not np.isnan(got).any(), f"{spec.describe()} {spec.layout} {algo}: unwritten outputs"
        err = rel_l2(got, ref)
        assert err < TOLERANCE[algo], f"{spec.describe()} {spec.layout} {algo}: rel L2 {err:.2e}"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec", EDGE_LAYERS, ids=lambda s: s.shape_string)
def test_every_path_at_every_edge(spec, layout):
    spec = spec.with_(layout=layout)
    _check_every_algo(spec, ("megakernel", "nonfused", "direct") if spec.winograd_eligible else ("direct",))


@pytest.mark.parametrize("spec", POINTWISE_LAYERS, ids=lambda s: s.shape_string)
def test_pointwise_at_every_edge(spec):
    layouts = [layout for layout in LAYOUTS if "pointwise" in runtime.candidate_algos(spec.with_(layout=layout))]
    assert layouts, spec.describe()
    for layout in layouts:
        _check_every_algo(spec.with_(layout=layout), ("direct", "pointwise"))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec", PAIR_LAYERS, ids=lambda s: s.shape_string)
def test_stride_and_padding_pairs_on_the_direct_path(spec, layout):
    spec = spec.with_(layout=layout)
    assert runtime.candidate_algos(spec) == ("direct",)
    _check_every_algo(spec, ("direct",))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec", PAIR_LAYERS[:2] + PAIR_LAYERS[5:6], ids=lambda s: s.shape_string)
def test_pairs_on_the_models_best_configs(spec, layout):
    """The five best configs of the model for a pair layer (tile shapes that split rows and
    columns of the image differently) all give the float64 result."""
    import cupy as cp
    spec = spec.with_(layout=layout)
    x, w, xd, wd = _arrays(spec, seed=1)
    ref = direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), spec.stride, spec.padding)
    for cfg, _ in rank(spec, top=5):
        out = cp.full(spec.output_shape, cp.nan, dtype=cp.float32)
        conv2d_direct(xd, wd, spec.stride, spec.padding, layout, config=cfg, out=out)
        assert rel_l2(_got(spec, out), ref) < TOLERANCE["direct"], (spec.describe(), cfg.key)


# ---------------------------------------------------------------------------
# megawino.torch: one-output-channel heads, pairs, padding="same"
# ---------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


HEADS = [(8, 1, 3, 1), (8, 1, 1, 0), (8, 1, 5, 2), (1, 1, 3, 1), (1, 4, 1, 0), (32, 1, 3, 1), (3, 2, 3, 1)]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("c, k, r, padding", HEADS)
def test_torch_one_output_channel_layers_on_every_path(c, k, r, padding, channels_last):
    """Conv2d(c, 1, 3), Conv2d(c, 1, 1), 5x5 (a U-Net / depth head): every megawino path that
    claims the layer, and the per-layer choice, give the float64 result."""
    torch = _torch()
    from megawino.torch import functional
    from megawino.torch.gpu import candidate_algos, is_channels_last
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.rand(2, c, 12, 12, generator=g, device="cuda") * 2.5 - 0.5
    weight = torch.rand(k, c, r, r, generator=g, device="cuda") * 2.5 - 0.5
    bias = torch.rand(k, generator=g, device="cuda")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    ref = torch.nn.functional.conv2d(x.double(), weight.double(), bias.double(), 1, padding)
    # One input channel: a channels_last tensor is also contiguous, and runs as NCHW.
    spec = LayerSpec(2, c, k, 12, 12, r, r, 1, padding, "NHWC" if is_channels_last(x) else "NCHW")
    with torch.no_grad():
        for algo in ("auto",) + tuple(a for a in candidate_algos(spec) if a != "pytorch"):
            for _ in range(2):
                out, ran = functional.conv2d_with_algo(x, weight, bias, 1, padding, algo=algo)
                err = float((out.double() - ref).norm() / ref.norm())
                assert err < TOLERANCE.get(ran, 1e-5), (algo, ran, err)


def test_torch_convert_inception_and_heads():
    """Inception-v3's 1x7 / 7x1 layers (padding (0, 3) / (3, 0)), a 'same' 1x5, a stride (2, 1)
    layer and one-channel heads are all converted; the per-layer choice (shown by the report) is a
    megawino path or PyTorch, and the model's output is float64's."""
    torch = _torch()
    from torch import nn
    import megawino.torch as mwt
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, (1, 7), padding=(0, 3)), nn.Conv2d(32, 32, (7, 1), padding=(3, 0)),
        nn.Conv2d(32, 32, (1, 5), padding="same"), nn.Conv2d(32, 16, 3, stride=(2, 1), padding=(1, 0)),
        nn.Conv2d(16, 1, 3, padding=1), nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 5, padding=2)).cuda().eval()
    forced = copy.deepcopy(model)
    x = torch.rand(4, 3, 17, 17, device="cuda")
    with torch.no_grad():
        expected = model.double()(x.double())
        model.float()
        mwt.convert(model, example_input=x, verbose=False)
        got = model(x)
    report = mwt.report(model)
    assert report.left_alone == {}
    for row in report.rows:
        assert row.algo in runtime.ALGOS + ("pytorch",), (row.name, row.algo)
    choices = {row.shape: row.algo for row in report.rows}
    assert choices["32->32 1x7 s1 p0x3"] in ("direct", "pytorch")
    assert choices["32->32 7x1 s1 p3x0"] in ("direct", "pytorch")
    assert float((got.double() - expected).norm() / expected.norm()) < 1e-5
    # Every layer forced onto the direct path (the choice above may have been PyTorch's).
    mwt.convert(forced, algo="direct", example_input=x, verbose=False)
    assert {row.algo for row in mwt.report(forced).rows} == {"direct"}
    with torch.no_grad():
        again = forced(x)
    assert float((again.double() - expected).norm() / expected.norm()) < 1e-5
