"""GPU tests of the direct-convolution kernel (skipped without a GPU).

Every output is poisoned with NaN before the launch and compared against the
float64 reference (relative L2 < 1e-6).  Run with ``-s`` to see the timings of
``test_suite_batch64_timings``."""
import random

import numpy as np
import pytest

from megawino import direct
from megawino.direct import conv2d_direct, flush_terms, heuristic_config
from megawino.core.suite import load_suite
from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2

pytestmark = pytest.mark.gpu

TOL = 1e-6


def _cupy():
    return pytest.importorskip("cupy")


def _data(spec, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((spec.N, spec.C, spec.H, spec.W)).astype(np.float32)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    return x, w


def _check(spec, config=None, seed=0, out_offset=0, ref=None, data=None):
    cp = _cupy()
    x, w = data if data is not None else _data(spec, seed)
    if ref is None:
        ref = direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), spec.stride, spec.padding)
    xi = x if spec.layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    size = int(np.prod(spec.output_shape))
    buf = cp.full(size + out_offset, cp.nan, dtype=cp.float32)           # poisoned
    out = buf[out_offset:].reshape(spec.output_shape)
    y = conv2d_direct(cp.asarray(xi), cp.asarray(w), spec.stride, spec.padding, spec.layout,
                      config=config, out=out)
    assert y is out
    got = cp.asnumpy(y)
    if spec.layout == "NHWC":
        got = got.transpose(0, 3, 1, 2)
    assert not np.isnan(got).any(), f"{spec.describe()} {config}: unwritten outputs"
    err = rel_l2(got, ref)
    assert err < TOL, f"{spec.describe()} {spec.layout} {config}: rel L2 {err:.2e}"
    return err


def _suite(batch, layout="NCHW"):
    try:
        return load_suite(suite="direct", batch=batch, layout=layout)
    except FileNotFoundError:
        pytest.skip("the shipped suite megawino/data/suite_layers.json is missing")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_direct_suite_batch2(layout):
    for i, spec in enumerate(_suite(2, layout)):
        _check(spec, seed=i)


def _random_specs(count, seed):
    rng = random.Random(seed)
    specs = []
    while len(specs) < count:
        R = rng.randint(1, 7)
        try:
            spec = LayerSpec(N=rng.randint(1, 3), C=rng.randint(1, 300), K=rng.randint(1, 300),
                             H=rng.randrange(1, 32, 2), W=rng.randrange(1, 32, 2),
                             R=R, S=rng.choice([R, rng.randint(1, 7)]),
                             stride=rng.randint(1, 4), padding=rng.randint(0, 3))
        except ValueError:
            continue
        specs.append(spec)
    return specs


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_random_shapes(layout):
    for i, spec in enumerate(_random_specs(24, seed=5 if layout == "NCHW" else 6)):
        _check(spec.with_(layout=layout), seed=100 + i)


def test_flush_path_long_reduction():
    # C*R*S = 14700 terms: one float32 chain would miss 1e-6; the flushed sum does not
    for layout in ("NCHW", "NHWC"):
        spec = LayerSpec(N=1, C=300, K=37, H=15, W=13, R=7, S=7, stride=1, padding=3, layout=layout)
        assert flush_terms(spec) > 0
        _check(spec, seed=3)


def test_every_candidate_config():
    """An even sample of the configs the filter lets through, on awkward shapes, both
    layouts, with and without the flush (about 30 NVRTC compiles, cached by CuPy)."""
    shapes = [LayerSpec(N=2, C=5, K=70, H=11, W=9, R=3, S=2, stride=2, padding=1),
              LayerSpec(N=1, C=240, K=36, H=7, W=8, R=3, S=3, stride=1, padding=1)]  # 2160 terms: flushed
    for spec0 in shapes:
        x, w = _data(spec0, 1)
        ref = direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), spec0.stride,
                               spec0.padding)
        for layout in ("NCHW", "NHWC"):
            spec = spec0.with_(layout=layout)
            flush = flush_terms(spec)
            configs = [c for c in direct.all_configs()
                       if direct.resource_ok(c, layout == "NHWC", flush=flush)]
            # an even sample of the space (every config is one NVRTC compile)
            configs = configs[::max(1, len(configs) // 6)] + [heuristic_config(spec)]
            assert configs
            for cfg in configs:
                _check(spec, config=cfg, ref=ref, data=(x, w))


def test_unaligned_output_and_vector_paths():
    # P % 4 == 0 and K % 4 == 0 (vector stores) with an aligned and a misaligned out
    for layout in ("NCHW", "NHWC"):
        spec = LayerSpec(N=2, C=16, K=32, H=8, W=8, R=1, S=1, padding=0, layout=layout)
        _check(spec, seed=1, out_offset=0)
        _check(spec, seed=1, out_offset=1)


def test_returns_new_array_and_is_deterministic():
    cp = _cupy()
    spec = LayerSpec(N=2, C=64, K=48, H=15, W=15, R=5, S=5, stride=2, padding=2)
    x, w = _data(spec, 2)
    xd, wd = cp.asarray(x), cp.asarray(w)
    a = conv2d_direct(xd, wd, 2, 2)
    b = conv2d_direct(xd, wd, 2, 2)
    assert isinstance(a, cp.ndarray) and a.shape == spec.output_shape and a.dtype == cp.float32
    assert bool((a == b).all())
    # non-contiguous input is accepted (copied)
    xt = cp.asfortranarray(xd)
    c = conv2d_direct(xt, wd, 2, 2)
    assert bool((a == c).all())


def test_bad_config_rejected(spilling_direct_config):
    cp = _cupy()
    x = cp.zeros((1, 3, 8, 8), cp.float32)
    w = cp.zeros((4, 3, 3, 3), cp.float32)
    with pytest.raises(ValueError):
        conv2d_direct(x, w, config=spilling_direct_config)
    with pytest.raises(ValueError):
        conv2d_direct(x, w, config="bm128")
    with pytest.raises(ValueError):
        conv2d_direct(x, w, out=cp.zeros((1, 4, 7, 7), cp.float32))        # wrong out shape
