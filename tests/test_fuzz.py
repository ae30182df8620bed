"""Property-based fuzz of the task decomposition on the CPU (runs in CI).

Random small layers (N, C, K, H, W, padding, layout, m), random valid task sizes and random
valid ticket orders (Algorithm 1 with random DIG / DGO / M, the sequential order, and a random
topological order of the task graph) run through the CPU executor, whose buffers start
NaN-poisoned, on random non-zero inputs (normal, and uniform with a non-zero mean); every output
element must be within the float32 forward-error bound of a float64 direct convolution, and
bitwise the same as the sequential order's.  The examples are derandomized, so CI runs the same
cases every time.

Why a per-element bound and not a relative L2 error: on layers this small an output can be a
near-cancellation, and the relative L2 error has a heavy tail (up to 2e-5 for m = 4 on 1- and
2-channel layers) that says nothing about a bug, while the bound below holds for every element
and a wrong or missing term breaks it by orders of magnitude.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from megawino import executor, mapping as mapping_mod, winograd
from megawino.spec import LAYOUTS, LayerSpec
from megawino.tasks import (CHANNEL_ALIGN, GEMM_BLOCK_ROWS, K_ALIGN, TRANSFORM_MIN_TILES, TaskParams,
                            build_graph, round_up)
from megawino.winograd import direct_conv_nchw

FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
# Roundings of one output besides its C-term reduction: the filter (6), input (2 x 6) and
# output (2 x 6) transforms' sums and the float32 transform coefficients, rounded up.
TRANSFORM_ROUNDINGS = 40
FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GROUP_SIZES = (GEMM_BLOCK_ROWS, 2 * GEMM_BLOCK_ROWS)
ORDERS = ("interleaved", "sequential", "topological")


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


@st.composite
def layers(draw):
    """(spec, params): a small layer and random valid task sizes for it."""
    m = draw(st.sampled_from((2, 4)))
    padding = draw(st.integers(0, 2))
    lowest = max(1, 3 - 2 * padding)                      # a non-empty output
    spec = LayerSpec(draw(st.integers(1, 2)), draw(st.integers(1, 40)), draw(st.integers(1, 40)),
                     draw(st.integers(lowest, 14)), draw(st.integers(lowest, 14)), padding=padding,
                     layout=draw(st.sampled_from(LAYOUTS)))
    tiles_per_group = draw(st.sampled_from(GROUP_SIZES))
    parts = [t for t in range(TRANSFORM_MIN_TILES, tiles_per_group + 1, TRANSFORM_MIN_TILES)
             if tiles_per_group % t == 0]
    c_stride, k_stride = round_up(spec.C, CHANNEL_ALIGN), round_up(spec.K, K_ALIGN)
    params = TaskParams(
        m=m, tiles_per_group=tiles_per_group,
        input_channels_per_task=draw(st.integers(1, c_stride + CHANNEL_ALIGN)),
        gemm_k_per_task=K_ALIGN * draw(st.integers(1, k_stride // K_ALIGN + 1)),
        output_k_per_task=draw(st.integers(1, spec.K + 3)),
        filter_pairs_per_task=draw(st.integers(1, c_stride * k_stride + 8)),
        input_tiles_per_task=draw(st.sampled_from(parts)),
        output_tiles_per_task=draw(st.sampled_from(parts)))
    return spec, params


def _inputs(spec, rng, distribution):
    if distribution == "normal":
        draw = rng.standard_normal
    else:                                                  # non-zero mean, away from denormals
        draw = lambda shape: rng.uniform(-0.5, 2.0, shape)  # noqa: E731
    x = draw(spec.input_shape).astype(np.float32)
    w = draw(spec.weight_shape).astype(np.float32)
    assert np.count_nonzero(x) == x.size and np.count_nonzero(w) == w.size
    return x, w


def _to_nchw(spec, y):
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


def assert_within_float32_bound(spec, m, y_nchw, x_nchw, w) -> None:
    """|y - exact| <= (C + TRANSFORM_ROUNDINGS) u * magnitude for every element (the forward
    error bound of a float32 sum of products, u = 2^-24)."""
    ref = direct_conv_nchw(x_nchw, w, 1, spec.padding)
    bound = (spec.C + TRANSFORM_ROUNDINGS) * FLOAT32_UNIT_ROUNDOFF * winograd_magnitude(spec, m, x_nchw, w)
    err = np.abs(y_nchw.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"output {worst}: {y_nchw[worst]!r} vs exact {ref[worst]!r}, error "
                                  f"{err[worst]:.3g} > bound {bound[worst]:.3g}")


@FUZZ
@given(layer=layers(), order_kind=st.sampled_from(ORDERS), dig=st.integers(0, 400),
       dgo=st.integers(0, 400), group_m=st.integers(1, 8), seed=st.integers(0, 2**32 - 1),
       distribution=st.sampled_from(("normal", "uniform")))
def test_executor_matches_float64_for_any_valid_mapping(layer, order_kind, dig, dgo, group_m, seed,
                                                        distribution):
    spec, params = layer
    rng = np.random.default_rng(seed)
    graph = build_graph(spec, params)
    if order_kind == "interleaved":
        order = mapping_mod.build_interleaved(graph, mapping_mod.MappingParams(dig, dgo, group_m)).order
    elif order_kind == "sequential":
        order = mapping_mod.sequential_mapping(graph)
    else:
        order = random_topological_order(graph, rng)
    x, w = _inputs(spec, rng, distribution)
    y = executor.execute(graph, order, x, w).y           # y starts all-NaN
    assert np.isfinite(y).all(), f"unwritten or non-finite outputs: {spec.describe()} {params}"
    x_nchw = x if spec.layout == "NCHW" else x.transpose(0, 3, 1, 2)
    assert_within_float32_bound(spec, params.m, _to_nchw(spec, y), x_nchw, w)
    # one fixed reduction order per output element: every valid order gives the same bits
    y_seq = executor.execute(graph, mapping_mod.sequential_mapping(graph), x, w).y
    assert np.array_equal(y.view(np.uint32), y_seq.view(np.uint32))


def _is_topological(graph, order) -> bool:
    """Independent of the validator: every edge parent -> counter -> child goes forward."""
    if sorted(order.tolist()) != list(range(graph.num_tasks)):
        return False
    ticket = np.empty(graph.num_tasks, dtype=np.int64)
    ticket[order] = np.arange(order.size)
    g = graph.to_networkx()
    return all(ticket[parent[1]] < ticket[child[1]]
               for counter in g if counter[0] == "counter"
               for parent in g.predecessors(counter) for child in g.successors(counter))


@FUZZ
@given(layer=layers(), seed=st.integers(0, 2**32 - 1), swaps=st.integers(0, 3),
       drop=st.booleans())
def test_validator_accepts_exactly_the_topological_orders(layer, seed, swaps, drop):
    spec, params = layer
    rng = np.random.default_rng(seed)
    graph = build_graph(spec, params)
    order = random_topological_order(graph, rng)
    for _ in range(swaps):                                 # a few random transpositions
        i, j = rng.integers(order.size, size=2)
        order[i], order[j] = order[j], order[i]
    if drop:
        order = np.delete(order, rng.integers(order.size))
    if _is_topological(graph, order):
        mapping_mod.validate_mapping(graph, order)
    else:
        with pytest.raises(mapping_mod.MappingError, match=r"ticket \d+|mapping has \d+ tickets"):
            mapping_mod.validate_mapping(graph, order)
