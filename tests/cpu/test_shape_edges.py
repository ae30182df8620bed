"""Every size-1 dimension (N, C, K, H, W, and the partial tiles they cause) and independent
stride / padding pairs on every path that runs without a GPU: the CPU executor (the Winograd task
list the megakernel and the non-fused kernels run), the direct kernel's emulation (its exact index
math, with poisoned outputs and a check that every output is written once), the direct plan's
filter packing, the plans' host-side construction, and megawino.torch on the CPU backend.
Outputs are held against the float64 reference; tests/gpu/test_gpu_shape_edges.py runs the same
shapes on the GPU paths."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from fuzz_support import REL_L2_TOL
from megawino import runtime
from megawino.core.spec import LAYOUTS, LayerSpec, parse_shape
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.tasks import GEMM_TILE_COLS
from megawino.core.winograd import direct_conv_nchw, rel_l2
from megawino.cpu.executor import conv2d_cpu
from megawino.direct import (build_table, emulate_direct, heuristic_config, mapping_key, pack_weights,
                             resource_ok, flush_terms)
from megawino.direct import model as direct_model
from megawino.direct.plan import pack_into
from megawino.direct.pointwise import check_pointwise, choose_tile_rows, gemm_dims
from megawino.schedule import mapping as mapping_mod

# Each dimension: 1, 2, 3, an odd size, a multiple of 32.
SIZES = (1, 2, 3, 5, 32)
FILTERS = (1, 2, 3, 5, 7)
# Work bound of one drawn layer (N * C * K * H * W) that keeps an example well under a second.
MAX_WORK = 1 << 17
EDGE_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _draw_layer(draw, R: int, S: int, stride, padding) -> LayerSpec:
    dims = [draw(st.sampled_from(SIZES)) for _ in range(5)]
    assume(np.prod(dims) <= MAX_WORK)
    n, c, k, h, w = dims
    try:
        spec = LayerSpec(n, c, k, h, w, R, S, stride, padding, draw(st.sampled_from(LAYOUTS)))
    except ValueError:        # an empty output (a filter larger than the padded image)
        assume(False)
    return spec


@st.composite
def direct_layers(draw) -> LayerSpec:
    """Any filter up to 7x7, stride and padding pairs (padding up to a full filter: an output
    whose window is all padding is legal too)."""
    R, S = draw(st.sampled_from(FILTERS)), draw(st.sampled_from(FILTERS))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, R)), draw(st.integers(0, S)))
    return _draw_layer(draw, R, S, stride, padding)


@st.composite
def winograd_layers(draw) -> LayerSpec:
    """3x3, stride 1, the same padding in both dimensions (what the Winograd paths take)."""
    return _draw_layer(draw, 3, 3, 1, draw(st.integers(0, 2)))


def _inputs(spec: LayerSpec, seed: int = 0):
    """float32 x (NCHW and in the layer's layout) and w, no element zero."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.5, 2.0, (spec.N, spec.C, spec.H, spec.W)).astype(np.float32)
    w = rng.uniform(-0.5, 2.0, spec.weight_shape).astype(np.float32)
    x_layout = x if spec.layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    return x, x_layout, w


def _nchw(spec: LayerSpec, y: np.ndarray) -> np.ndarray:
    return y if spec.layout == "NCHW" else y.transpose(0, 3, 1, 2)


def _reference(spec: LayerSpec, x, w) -> np.ndarray:
    return direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), spec.stride, spec.padding)


@EDGE_SETTINGS
@given(spec=direct_layers())
def test_direct_emulation_every_edge(spec):
    """The direct kernel's index math (gather table, tap bits, partial pixel / channel / reduction
    tiles, vector and scalar stores) on every edge: every output written once, float64-exact."""
    x, xl, w = _inputs(spec)
    y = emulate_direct(xl, w, spec.stride, spec.padding, spec.layout)    # NaN-poisoned, write-checked
    assert rel_l2(_nchw(spec, y), _reference(spec, x, w)) < 1e-12, spec.describe()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("spec", [LayerSpec(1, 64, 3, 9, 10, R=7, S=5, stride=(1, 2), padding=(3, 2)),
                                  LayerSpec(2, 320, 1, 5, 17, R=1, S=7, stride=1, padding=(0, 3)),
                                  LayerSpec(1, 320, 5, 17, 3, R=7, S=1, stride=(2, 1), padding=(3, 0))],
                         ids=lambda s: s.shape_string)
def test_direct_emulation_pairs_with_the_flush(spec, layout):
    """Reductions long enough for the chunked flush (C*R*S > FLUSH_MIN_CRS) with pairs."""
    spec = spec.with_(layout=layout)
    assert flush_terms(spec)
    x, xl, w = _inputs(spec)
    y = emulate_direct(xl, w, spec.stride, spec.padding, spec.layout)
    assert rel_l2(_nchw(spec, y), _reference(spec, x, w)) < 1e-12


@EDGE_SETTINGS
@given(spec=direct_layers())
def test_direct_plan_host_side_every_edge(spec):
    """What DirectPlan does on the host: its config (the tuned table or the model) passes the
    resource filter, the gather table covers the packed rows, and packing the filter into the
    plan's buffer (pack_into, the path of every call) gives the packed matrix, with the zero padding
    left as it is."""
    cfg = heuristic_config(spec)
    assert resource_ok(cfg, spec.layout == "NHWC", flush=flush_terms(spec))
    _, _, w = _inputs(spec)
    packed = pack_weights(w, spec.layout)
    assert build_table(spec).shape == (packed.shape[0], 2)
    dst = np.full(packed.shape, -7.0, dtype=np.float32)
    pack_into(dst, w, spec.layout)
    crs = spec.C * spec.R * spec.S
    assert np.array_equal(dst[:crs, :spec.K], packed[:crs, :spec.K])
    assert (dst[crs:] == -7.0).all() and (dst[:, spec.K:] == -7.0).all()


@pytest.mark.parametrize("shape", [(1, 4, 3, 3), (1, 4, 1, 1), (1, 1, 1, 1), (1, 3, 5, 5), (2, 4, 1, 1),
                                   (3, 1, 3, 3), (1, 2, 1, 7), (5, 2, 7, 1)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_pack_into_one_output_channel(shape, layout):
    """One output channel (a segmentation or depth head: Conv2d(c, 1, 3)) packs like any other:
    reshape() gave the packed rows' size-1 axis a stride of its own and a self-check refused it."""
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    packed = pack_weights(w, layout)
    dst = np.zeros_like(packed)
    pack_into(dst, w, layout)
    assert np.array_equal(dst, packed)


@EDGE_SETTINGS
@given(spec=winograd_layers(), m=st.sampled_from((2, 4)))
def test_cpu_executor_every_edge(spec, m):
    """The Winograd task list (the megakernel's and the non-fused kernels' work, each task on its
    own slices of NaN-poisoned buffers) on every edge: single tiles, partial tiles, one channel."""
    x, xl, w = _inputs(spec)
    y = conv2d_cpu(xl, w, padding=spec.padding, layout=spec.layout, m=m)
    got = _nchw(spec, y)
    assert not np.isnan(got).any(), f"{spec.describe()}: unwritten outputs"
    assert rel_l2(got, _reference(spec, x, w)) < REL_L2_TOL[m], spec.describe()


@EDGE_SETTINGS
@given(spec=st.one_of(winograd_layers(), direct_layers()))
def test_plans_host_side_every_edge(spec):
    """Every algorithm that claims a layer builds its host-side plan: the Winograd task graphs and
    their mapping (both tile sizes), the pointwise GEMM's dimensions, the direct config."""
    names = runtime.candidate_algos(spec)
    assert "direct" in names                     # every drawn layer fits the direct kernel
    if spec.winograd_eligible:
        assert {"megakernel", "nonfused"} <= set(names)
        for m in (2, 4):
            graph = build_graph(spec, default_params(spec, m))
            mapping_mod.validate_mapping(graph, mapping_mod.build_interleaved(graph, mapping_mod.MappingParams()).order)
    else:
        assert not {"megakernel", "nonfused"} & set(names)
    if "pointwise" in names:
        check_pointwise(spec)
        rows, cols, _, batch = gemm_dims(spec)
        assert choose_tile_rows(rows, -(-cols // GEMM_TILE_COLS), batch, 132) in (64, 128)


# ---------------------------------------------------------------------------
# Stride and padding pairs: one layer, one spelling, one table key
# ---------------------------------------------------------------------------

@EDGE_SETTINGS
@given(spec=direct_layers())
def test_shape_strings_round_trip(spec):
    """A layer's shape string (the key of the tuned tables) parses back to the layer."""
    assert parse_shape(spec.shape_string, spec.layout) == spec


def test_layer_spec_pairs_keep_single_values_as_they_were():
    assert LayerSpec(2, 3, 4, 9, 7, stride=(2, 2), padding=[1, 1]) == LayerSpec(2, 3, 4, 9, 7, stride=2, padding=1)
    single = LayerSpec(2, 3, 4, 9, 7, stride=2, padding=0)
    assert (single.stride, single.padding, single.shape_string) == (2, 0, "n2c3k4h9w7u2p0")
    pair = LayerSpec(2, 3, 4, 9, 7, R=1, S=7, stride=(1, 2), padding=(0, 3))
    assert (pair.stride_h, pair.stride_w, pair.pad_h, pair.pad_w) == (1, 2, 0, 3)
    assert (pair.out_h, pair.out_w) == (9, 4)
    assert pair.shape_string == "n2c3k4h9w7r1s7u1x2p0x3"
    assert parse_shape(pair.shape_string) == pair
    assert "1x7/s1x2/p0x3" in pair.describe()


@pytest.mark.parametrize("kwargs, words", [
    (dict(stride=(1, 0)), "stride"), (dict(padding=(0, -1)), "padding"), (dict(padding=(1, 2, 3)), "padding"),
    (dict(stride=(1.0, 2)), "stride"), (dict(padding=(True, 1)), "padding")])
def test_layer_spec_refuses_bad_pairs(kwargs, words):
    with pytest.raises(ValueError, match=words):
        LayerSpec(1, 1, 1, 8, 8, **kwargs)


@pytest.mark.parametrize("text", ["n1c2k3h8r3x1", "n1c2k3h8x2", "n1c2k3h8p1x2x3", "n1c2k3h8px1"])
def test_parse_shape_takes_pairs_for_stride_and_padding_only(text):
    with pytest.raises(ValueError):
        parse_shape(text)


def test_winograd_needs_the_same_padding_in_both_dimensions():
    spec = LayerSpec(1, 4, 4, 8, 8, padding=(1, 0))
    assert not spec.winograd_eligible
    with pytest.raises(ValueError, match="same padding"):
        spec.require_winograd()
    assert runtime.candidate_algos(spec) == ("direct",)
    with pytest.raises(ValueError, match="padding"):
        conv2d_cpu(np.ones((1, 4, 8, 8), np.float32), np.ones((4, 4, 3, 3), np.float32), padding=(1, 0))


def test_direct_table_keys_tell_1x7_from_7x1(monkeypatch):
    """A tuned entry of a 7x1 layer is not the entry of the 1x7 layer of the same sizes (nor of a
    layer with its padding or stride pair swapped)."""
    row = LayerSpec(8, 64, 64, 17, 17, R=1, S=7, padding=(0, 3))
    column = LayerSpec(8, 64, 64, 17, 17, R=7, S=1, padding=(3, 0))
    swapped = row.with_(padding=(3, 0))
    keys = {mapping_key(s) for s in (row, column, swapped, row.with_(stride=(1, 2)), row.with_(stride=(2, 1)))}
    assert len(keys) == 5
    model_choice = heuristic_config(row)
    tuned = next(cfg for cfg, _ in direct_model.rank(column, top=50) if cfg != model_choice)
    monkeypatch.setattr(direct_model, "load_mapping", lambda gpu="h100": {mapping_key(column): tuned})
    assert heuristic_config(column) == tuned
    assert heuristic_config(row) == model_choice


def test_the_runtime_takes_pairs_and_refuses_bad_ones():
    x, w = np.ones((1, 4, 8, 8), np.float32), np.ones((4, 4, 1, 7), np.float32)
    for kwargs, words in ((dict(stride=(1, 0)), "stride"), (dict(padding=(0, 1.5)), "padding"),
                          (dict(padding=(0, 3)), "3x3 stride-1")):
        with pytest.raises(ValueError, match=words):
            runtime.conv2d(x, w, **kwargs)
