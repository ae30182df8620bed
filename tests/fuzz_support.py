"""Shared by the CPU fuzz (tests/cpu/test_fuzz.py) and the GPU fuzz (tests/gpu/test_gpu_reliability.py):
random small layers with random valid task sizes, random topological ticket orders, and the
per-element float32 error bound the outputs are held to."""
from __future__ import annotations

import types

import numpy as np

from megawino.core import winograd
from megawino.core.spec import LAYOUTS, LayerSpec
from megawino.core.tasks import CHANNEL_ALIGN, GEMM_BLOCK_ROWS, K_ALIGN, TRANSFORM_MIN_TILES, TaskParams, round_up
from megawino.core.winograd import direct_conv_nchw, rel_l2

FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
# Roundings of one output besides its C-term reduction: the filter (6), input (2 x 6) and
# output (2 x 6) transforms' sums and the float32 transform coefficients, rounded up.
TRANSFORM_ROUNDINGS = 40
GROUP_SIZES = (GEMM_BLOCK_ROWS, 2 * GEMM_BLOCK_ROWS)
# Relative L2 error bound against float64 per m, on top of the per-element bound: about 5x the
# largest error of 2 x 10^4 random layers of random_layer's distribution per m (the tail is on
# 1- and 2-channel layers, whose outputs can nearly cancel).
REL_L2_TOL = {4: 1e-4, 2: 3e-5}


def random_layer(integer, pick, max_batch: int = 2, max_channels: int = 40, max_size: int = 14):
    """(spec, params): a small layer and random valid task sizes for it.  ``integer(lo, hi)``
    (inclusive) and ``pick(options)`` are the source of randomness: hypothesis draws on the
    CPU, a seeded NumPy generator on the GPU."""
    m = pick((2, 4))
    padding = integer(0, 2)
    lowest = max(1, 3 - 2 * padding)                      # a non-empty output
    spec = LayerSpec(integer(1, max_batch), integer(1, max_channels), integer(1, max_channels),
                     integer(lowest, max_size), integer(lowest, max_size), padding=padding,
                     layout=pick(LAYOUTS))
    tiles_per_group = pick(GROUP_SIZES)
    parts = tuple(t for t in range(TRANSFORM_MIN_TILES, tiles_per_group + 1, TRANSFORM_MIN_TILES)
                  if tiles_per_group % t == 0)
    c_stride, k_stride = round_up(spec.C, CHANNEL_ALIGN), round_up(spec.K, K_ALIGN)
    params = TaskParams(
        m=m, tiles_per_group=tiles_per_group,
        input_channels_per_task=integer(1, c_stride + CHANNEL_ALIGN),
        gemm_k_per_task=K_ALIGN * integer(1, k_stride // K_ALIGN + 1),
        output_k_per_task=integer(1, spec.K + 3),
        filter_pairs_per_task=integer(1, c_stride * k_stride + 8),
        input_tiles_per_task=pick(parts), output_tiles_per_task=pick(parts))
    return spec, params


def random_topological_order(graph, rng) -> np.ndarray:
    """Kahn's algorithm on the task graph (counters as join nodes), taking a random ready node."""
    g = graph.to_networkx()
    indegree = dict(g.in_degree())
    ready = [node for node, d in indegree.items() if d == 0]
    order = []
    while ready:
        i = int(rng.integers(len(ready)))
        ready[i], ready[-1] = ready[-1], ready[i]
        node = ready.pop()
        if node[0] == "task":
            order.append(node[1])
        for child in g.successors(node):
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return np.asarray(order, dtype=np.int32)


def random_inputs(spec, rng, distribution: str):
    """Host float32 x (in the layer's layout) and w, every element non-zero: standard normal, or
    uniform on [-0.5, 2) (a non-zero mean; far from denormals either way)."""
    if distribution == "normal":
        draw = rng.standard_normal
    else:
        draw = lambda shape: rng.uniform(-0.5, 2.0, shape)  # noqa: E731
    x = draw(spec.input_shape).astype(np.float32)
    w = draw(spec.weight_shape).astype(np.float32)
    assert np.count_nonzero(x) == x.size and np.count_nonzero(w) == w.size
    return x, w


def to_nchw(spec, y):
    return y if spec.layout == "NCHW" else y.transpose(0, 3, 1, 2)


def winograd_magnitude(spec, m, x_nchw, w) -> np.ndarray:
    """float64 [N][K][Ho][Wo]: the four Winograd stages on |x| and |w| with |G|, |B^T|, |A^T|,
    the magnitude every rounding error of an output element is relative to."""
    tf = winograd.transform(m)
    tf_abs = types.SimpleNamespace(m=m, alpha=tf.alpha, AT=np.abs(tf.AT), G=np.abs(tf.G),
                                   BT=np.abs(tf.BT))
    U = winograd.filter_transform(np.abs(w), tf_abs, np.float64)
    V = winograd.input_transform(np.abs(x_nchw).transpose(0, 2, 3, 1), spec.padding, tf_abs,
                                 spec.out_h, spec.out_w, np.float64)
    y = winograd.output_transform(winograd.batched_gemm(V, U), tf_abs, spec.N, spec.out_h,
                                  spec.out_w, np.float64)
    return y.transpose(0, 3, 1, 2)


def float32_bound_violation(spec, m, y_nchw, x_nchw, w, roundings_per_term: int = 1) -> str | None:
    """None if the relative L2 error against float64 is below REL_L2_TOL[m] and every element
    satisfies |y - exact| <= (roundings_per_term * C + TRANSFORM_ROUNDINGS) u * magnitude (the
    forward error bound of a float32 sum of products, u = 2^-24; ``roundings_per_term`` > 1 for
    GEMMs whose products are not exact fp32 FMAs), else what is wrong.  NaN (an unwritten output)
    is a violation."""
    ref = direct_conv_nchw(x_nchw, w, 1, spec.padding)
    rel = rel_l2(y_nchw, ref)
    if not rel < REL_L2_TOL[m]:
        return f"relative L2 error {rel:.3g} >= {REL_L2_TOL[m]:.0e}"
    bound = ((roundings_per_term * spec.C + TRANSFORM_ROUNDINGS) * FLOAT32_UNIT_ROUNDOFF
             * winograd_magnitude(spec, m, x_nchw, w))
    err = np.abs(np.asarray(y_nchw, dtype=np.float64) - ref)
    ok = err <= bound                                      # False where y is NaN
    if ok.all():
        return None
    worst = np.unravel_index(np.argmax(np.where(ok, -np.inf, np.nan_to_num(err - bound, nan=np.inf))),
                             err.shape)
    return (f"{np.count_nonzero(~ok)} of {ok.size} outputs outside the bound; output {tuple(map(int, worst))}: "
            f"{float(y_nchw[worst])!r} vs exact {float(ref[worst])!r}, bound {float(bound[worst]):.3g}")
