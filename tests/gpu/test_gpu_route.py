"""GPU tests of the launch route (megawino.gpu.route): ``megawino.conv2d`` and a Winograd plan's
call with a weight token run the plan once, then launch through the launcher bound at the
second call; its outputs are the plain call's bits for every algorithm and layout (fresh inputs,
NaN-poisoned outputs), and a new token for the same weight memory gives fresh results.  Marked
``gpu``."""
from __future__ import annotations

import numpy as np
import pytest

from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2

pytestmark = pytest.mark.gpu

TOL = 3e-6
CASES = [("megakernel", LayerSpec(2, 20, 28, 13, 13)), ("nonfused", LayerSpec(2, 20, 28, 13, 11)),
         ("direct", LayerSpec(2, 8, 24, 17, 17, 3, 3, 2, 1)), ("pointwise", LayerSpec(2, 32, 64, 14, 14, 1, 1, 1, 0))]


def _nchw(a, layout):
    return a if layout == "NCHW" else a.transpose(0, 3, 1, 2)


def _reference(x, w, spec):
    return direct_conv_nchw(_nchw(x, spec.layout), w, spec.stride, spec.padding)


def _route(plan, wd):
    import cupy as cp
    return plan._routes[(wd.data.ptr, int(cp.cuda.get_current_stream().ptr))]


@pytest.mark.parametrize("algo, spec", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_binds_its_route_once_and_gives_the_plain_calls_bits(algo, spec, layout):
    import cupy as cp
    import megawino
    from megawino import runtime
    spec = spec.with_(layout=layout)
    rng = np.random.default_rng(17)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    wd = cp.asarray(w)
    xs = [rng.standard_normal(spec.input_shape).astype(np.float32) + 0.25 for _ in range(3)]
    kw = dict(stride=spec.stride, padding=spec.padding, algo=algo, layout=layout)
    plain = [megawino.conv2d(cp.asarray(x), wd, **kw) for x in xs]
    outs = []
    for x in xs + xs:
        out = cp.full(spec.output_shape, np.nan, dtype=cp.float32)
        outs.append(megawino.conv2d(cp.asarray(x), wd, out=out, weight_token=("route", algo, layout), **kw))
    megawino.synchronize()
    route = _route(runtime.cached_plan(spec, algo, "3xtf32", cp.cuda.Device().id), wd)
    assert route.launcher is not None and route.launcher.valid()      # the later calls took it
    for i, y in enumerate(outs):
        assert bool(cp.array_equal(y, plain[i % 3])), (algo, layout, i)
    for i in range(3):
        assert rel_l2(_nchw(outs[i + 3].get(), layout), _reference(xs[i], w, spec)) < TOL
    # New contents under a new token, same memory: the route is replaced, the results fresh.
    wd += 1.0
    fresh = [megawino.conv2d(cp.asarray(xs[0]), wd, weight_token=("route", algo, layout, 2), **kw)
             for _ in range(3)]
    megawino.synchronize()
    assert _route(runtime.cached_plan(spec, algo, "3xtf32", cp.cuda.Device().id), wd).token[-1] == 2
    for y in fresh:
        assert rel_l2(_nchw(y.get(), layout), _reference(xs[0], w + 1.0, spec)) < TOL


@pytest.mark.parametrize("algo", ["megakernel", "nonfused"])
def test_a_plans_call_launches_through_its_route(algo):
    import cupy as cp
    import megawino
    spec = CASES[0][1]
    rng = np.random.default_rng(29)
    w = rng.standard_normal(spec.weight_shape).astype(np.float32)
    x = rng.standard_normal(spec.input_shape).astype(np.float32) + 0.25
    xd, wd = cp.asarray(x), cp.asarray(w)
    plan = megawino.plan(spec, algo=algo)
    plain = plan(xd, wd)
    outs = [plan(xd, wd, out=cp.full(spec.output_shape, np.nan, dtype=cp.float32), weight_token="w")
            for _ in range(3)]
    plan.check()
    assert _route(plan, wd).launcher is not None
    for y in outs:
        assert bool(cp.array_equal(y, plain))
    assert rel_l2(outs[-1].get(), _reference(x, w, spec)) < TOL
    # A strided weight is copied for the kernels on every call: no route is kept for the copy.
    strided = cp.asarray(np.repeat(w, 2, axis=0))[::2]
    assert bool(cp.array_equal(plan(xd, strided, weight_token="w-strided"), plain))
    plan.check()
    assert len(plan._routes) == 1
