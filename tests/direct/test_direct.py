"""CPU tests of the direct-convolution path: parameter space and resource filter,
performance model, heuristic choice, the NumPy emulation of the kernel's index
math against the float64 reference, validation errors, tuning-table plumbing."""
import json
import math
import random
import shutil
import subprocess

import numpy as np
import pytest

from megawino import direct
from megawino.direct import (DEFAULT_CONFIG, H100, DirectConfig, Hardware, all_configs,
                             build_table, candidate_configs, conv2d_direct, emulate_direct,
                             flush_terms, heuristic_config, pack_weights, predict_us, rank,
                             resource_ok, structural_ok)
from megawino.core.suite import load_suite
from megawino.core.spec import LayerSpec
from megawino.core.winograd import direct_conv_nchw, rel_l2


def _suite(batch, layout="NCHW"):
    try:
        return load_suite(suite="direct", batch=batch, layout=layout)
    except FileNotFoundError:
        pytest.skip("the shipped suite megawino/data/suite_layers.json is missing")


def _random_spec(rng, layout="NCHW", max_c=300):
    while True:
        R = rng.randint(1, 7)
        S = rng.choice([R, rng.randint(1, 7)])
        stride = rng.randint(1, 4)
        padding = rng.randint(0, 3)
        H = rng.randrange(1, 40, 2)
        W = rng.randrange(1, 40, 2)
        try:
            return LayerSpec(N=rng.randint(1, 3), C=rng.randint(1, max_c), K=rng.randint(1, max_c),
                             H=H, W=W, R=R, S=S, stride=stride, padding=padding, layout=layout)
        except ValueError:     # empty output
            continue


# ---------------------------------------------------------------------------
# Parameter space and resource filter
# ---------------------------------------------------------------------------

def test_config_key_roundtrip_and_defines():
    for cfg in all_configs():
        assert DirectConfig.from_key(cfg.key) == cfg
        assert DirectConfig.from_dict(cfg.to_dict()) == cfg
    d = DEFAULT_CONFIG.defines(nhwc=True, flush=256)
    assert "-DMW_DIRECT_NHWC=1" in d and "-DMW_DIRECT_FLUSH_TERMS=256" in d
    with pytest.raises(ValueError):
        DirectConfig.from_key("bm128")


def test_structural_rules():
    assert structural_ok(DirectConfig(128, 128, 8, 8, 8))
    assert not structural_ok(DirectConfig(128, 128, 8, 6, 8))      # TM not a multiple of 4
    assert not structural_ok(DirectConfig(128, 256, 8, 8, 8))      # BN does not divide 128
    assert not structural_ok(DirectConfig(128, 128, 32, 8, 8))     # BK does not divide 16
    assert not structural_ok(DirectConfig(64, 32, 8, 8, 8))        # 32 threads < BM (NCHW gather)
    assert structural_ok(DirectConfig(64, 32, 8, 8, 8), nhwc=True)


def test_resource_filter_rejects_over_limits(spilling_direct_config):
    cfg = DirectConfig(128, 128, 8, 8, 8, 1)
    assert resource_ok(cfg)
    # threads: 256 x 256 tile of 4x4 is 4096 threads
    assert not resource_ok(DirectConfig(128, 128, 8, 4, 4, 1), hw=Hardware(threads_per_block=512))
    # registers: over 255 per thread, or over the register file
    assert not resource_ok(cfg, regs=256)
    assert not resource_ok(DirectConfig(128, 128, 8, 4, 4, 1), regs=72)   # 1024 thr x 72 > 64K
    assert resource_ok(DirectConfig(128, 128, 8, 4, 4, 1), regs=64)
    # shared memory: a ring of 4 slots of 8 x (132 + 132) floats (33 KB); a smaller static limit
    assert cfg.stages == 4 and cfg.smem_bytes() == 4 * 8 * (132 + 132) * 4
    assert DirectConfig(128, 128, 16, 8, 8, 1).stages == 2      # 16.5 KB slots: two fit 40 KB
    assert not resource_ok(cfg, hw=Hardware(smem_static_per_block=32 * 1024))
    # spills reported by ptxas (min_blocks=2 with 1024 threads caps registers at 32)
    assert not resource_ok(spilling_direct_config)
    # min_blocks that the register file cannot hold
    assert not resource_ok(DirectConfig(128, 128, 8, 8, 8, 2), regs=160)


def test_ptxas_table_covers_the_space():
    """Every config that can pass the filter was compiled here (sm_90) for both
    layouts and both flush variants; the report is what the filter uses."""
    table = direct._PTXAS_SM90
    assert table, "ptxas table is empty"
    for cfg in all_configs():
        for nhwc in (False, True):
            for flush in (0, direct.FLUSH_TERMS):
                if structural_ok(cfg, nhwc) and cfg.smem_bytes(nhwc) <= 48 * 1024:
                    assert direct._ptxas_key(cfg, nhwc, flush) in table, (cfg, nhwc, flush)
    # the default config and every config that passes have no spills
    for key, (regs, spills, smem) in table.items():
        if spills == 0:
            assert regs <= 255 and smem <= 48 * 1024
    assert resource_ok(DEFAULT_CONFIG) and resource_ok(DEFAULT_CONFIG, nhwc=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_ptxas_matches_table_for_default():
    regs, spills, smem = direct.ptxas_report(DEFAULT_CONFIG, False, 0)
    assert spills == 0
    assert (regs, spills, smem) == direct._PTXAS_SM90[direct._ptxas_key(DEFAULT_CONFIG, False, 0)]


def test_candidates_pass_filter_and_are_nonempty():
    rng = random.Random(1)
    specs = _suite(64) + _suite(2) + [_random_spec(rng, layout) for layout in ("NCHW", "NHWC")
                                      for _ in range(40)]
    for spec in specs:
        cands = candidate_configs(spec)
        assert cands, spec
        for cfg in cands:
            assert resource_ok(cfg, spec.layout == "NHWC", flush=flush_terms(spec))


# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------

def test_model_prefers_big_register_tiles_on_big_layers():
    spec = LayerSpec(N=64, C=256, K=256, H=56, W=56, R=1, S=1, stride=1, padding=0)
    big = predict_us(spec, DirectConfig(128, 128, 8, 8, 8, 2))
    small = predict_us(spec, DirectConfig(32, 32, 8, 4, 4, 1))
    assert big < small
    terms = direct.model_terms(spec, DirectConfig(128, 128, 8, 8, 8, 2))
    assert terms["issue_eff"] > direct.model_terms(spec, DirectConfig(32, 32, 8, 4, 4, 1))["issue_eff"]
    # the prediction is an upper bound in spirit: never faster than the FFMA peak
    peak = H100.sms * H100.ffma_lanes * 2 * H100.clock_hz
    assert big * 1e-6 >= spec.direct_flops / peak


def test_model_penalises_wasted_tiles_and_wave_tails():
    # K = 16: a 128-wide channel tile does 8x the work of a 32-wide one
    spec = LayerSpec(N=32, C=64, K=16, H=56, W=56, R=1, S=1, stride=1, padding=0)
    assert predict_us(spec, DirectConfig(128, 32, 8, 8, 4, 1)) < \
        predict_us(spec, DirectConfig(128, 128, 8, 8, 8, 2))
    # wave quantisation: one block more than a full wave costs a whole extra wave
    cfg = DirectConfig(128, 128, 8, 8, 8, 2)
    occ = direct.occupancy(cfg)
    full = H100.sms * occ
    a = LayerSpec(N=1, C=512, K=128, H=128, W=full, R=1, S=1, padding=0)       # exactly one wave
    b = LayerSpec(N=1, C=512, K=128, H=128, W=full + 1, R=1, S=1, padding=0)   # a wave and a bit
    ta, tb = direct.model_terms(a, cfg), direct.model_terms(b, cfg)
    assert ta["blocks"] == full and tb["blocks"] > full
    assert tb["compute_us"] > 1.3 * ta["compute_us"]


def test_model_memory_terms_scale():
    spec = LayerSpec(N=64, C=3, K=64, H=224, W=224, R=7, S=7, stride=2, padding=3)
    t = direct.model_terms(spec, DirectConfig(128, 64, 8, 8, 8, 1))
    assert t["dram_us"] >= spec.min_bytes / H100.dram_bw * 1e6 * 0.99
    assert all(t[k] > 0 for k in ("compute_us", "smem_us", "dram_us", "l2_us"))


def test_rank_sorted_and_top(spilling_direct_config):
    spec = _suite(64)[0]
    ranked = rank(spec, top=5)
    assert len(ranked) == 5
    times = [us for _, us in ranked]
    assert times == sorted(times)
    assert all(math.isfinite(us) for us in times)
    assert predict_us(spec, spilling_direct_config) == math.inf


# ---------------------------------------------------------------------------
# Heuristic choice and tuned table
# ---------------------------------------------------------------------------

def test_heuristic_valid_for_suite_and_random_shapes():
    rng = random.Random(7)
    specs = (_suite(2) + _suite(64) + _suite(64, "NHWC")
             + [_random_spec(rng, layout) for layout in ("NCHW", "NHWC") for _ in range(60)])
    for spec in specs:
        cfg = heuristic_config(spec)
        nhwc = spec.layout == "NHWC"
        assert structural_ok(cfg, nhwc) and resource_ok(cfg, nhwc, flush=flush_terms(spec)), spec


def test_suite_heuristic_uses_8x8_tiles_at_batch_64():
    for spec in _suite(64):
        cfg = heuristic_config(spec)
        assert cfg.TM * cfg.TN >= 32, (spec.name, cfg)


def test_mapping_file_overrides_model(tmp_path, monkeypatch, spilling_direct_config):
    spec = _suite(64)[1]
    chosen = DirectConfig(64, 64, 8, 4, 4, 1)
    assert heuristic_config(spec) != chosen
    (tmp_path / "direct_h100.json").write_text(json.dumps(
        {"gpu": "h100", "entries": {direct.mapping_key(spec): {"config": chosen.key, "us": 1.0}}}))
    monkeypatch.setattr(direct.model, "mapping_dir", lambda: tmp_path)
    assert heuristic_config(spec) == chosen
    assert heuristic_config(spec.with_(layout="NHWC")) != chosen or True   # other key: model
    # an entry that fails the filter is ignored
    (tmp_path / "direct_h100.json").write_text(json.dumps(
        {"entries": {direct.mapping_key(spec): {"config": spilling_direct_config.key}}}))
    assert heuristic_config(spec) != spilling_direct_config


def test_gpu_slug():
    assert direct.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert direct.gpu_slug("NVIDIA H200") == "h200"
    assert direct.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"


def test_tune_layers_with_fake_timer(tmp_path):
    from megawino.tuning.direct import tune_layers

    specs = _suite(64)[:3]
    calls = []

    def fake(spec, cfg):
        calls.append((spec, cfg))
        return 100.0 + cfg.BM / 128 + cfg.BN / 128     # smallest tile wins

    out = tmp_path / "direct_test.json"
    table = tune_layers(specs + specs[:1], top=3, budget_s=60, out=out, measure=fake, progress=False)
    assert len(calls) == 9                              # 3 distinct layers x top 3
    data = json.loads(out.read_text())
    assert set(data["entries"]) == {direct.mapping_key(s) for s in specs}
    for spec in specs:
        entry = data["entries"][direct.mapping_key(spec)]
        cands = [c for c, _ in rank(spec, top=3)]
        best = min(cands, key=lambda c: fake(spec, c))
        assert entry["config"] == best.key
        assert len(entry["measured"]) == 3
    assert table["entries"].keys() == data["entries"].keys()
    # zero budget: nothing measured, nothing written as tuned
    table = tune_layers(specs, top=2, budget_s=0, out=tmp_path / "z.json", measure=fake,
                        progress=False)
    assert table["entries"] == {} and not (tmp_path / "z.json").exists()


# ---------------------------------------------------------------------------
# Host data and the kernel emulation
# ---------------------------------------------------------------------------

def test_table_and_packed_weights():
    spec = LayerSpec(N=1, C=3, K=5, H=7, W=9, R=2, S=3, stride=1, padding=1)
    t = build_table(spec)
    assert t.shape == (32, 2) and t.dtype == np.int32
    kk = (2 * 2 + 1) * 3 + 2                   # c=2, r=1, s=2
    assert tuple(t[kk]) == (2 * 63 + 1 * 9 + 2, (1 << 1) | (1 << (direct.TAP_COL_BIT + 2)))
    assert np.all(t[18:, 1].view(np.uint32) == direct.TAP_SENTINEL)
    w = np.arange(5 * 3 * 2 * 3, dtype=np.float32).reshape(5, 3, 2, 3)
    wt = pack_weights(w, "NCHW")
    assert wt.shape == (32, 128) and wt[kk, 4] == w[4, 2, 1, 2] and wt[18:].sum() == 0
    assert wt[:, 5:].sum() == 0
    tn = build_table(spec.with_(layout="NHWC"))
    wn = pack_weights(w, "NHWC")
    kk = (1 * 3 + 2) * 3 + 2                   # r=1, s=2, c=2
    assert tuple(tn[kk]) == ((1 * 9 + 2) * 3 + 2, int(direct.tap_bits(1, 2))) and wn[kk, 4] == w[4, 2, 1, 2]


def test_outside_taps_mark_rows_and_columns_outside_the_image():
    spec = LayerSpec(N=1, C=1, K=1, H=5, W=6, R=3, S=3, stride=2, padding=1)
    col = direct.TAP_COL_BIT
    # Window origin (-1, -1): row 0 and column 0 are padding.
    assert int(direct.outside_taps(-1, -1, spec)) == direct.TAP_SENTINEL | 1 | (1 << col)
    # Origin (3, 4): rows 3..5 of H = 5 -> row 2 outside; columns 4..6 of W = 6 -> column 2 outside.
    assert int(direct.outside_taps(3, 4, spec)) == direct.TAP_SENTINEL | (1 << 2) | (1 << (col + 2))
    assert int(direct.outside_taps(0, 0, spec)) == direct.TAP_SENTINEL


def test_filters_past_the_tap_bits_are_refused_before_launch():
    big = direct.MAX_FILTER + 1
    spec = LayerSpec(N=1, C=1, K=1, H=40, W=40, R=big, S=big, stride=1, padding=0)
    with pytest.raises(ValueError, match="filters up to"):
        direct.check_spec(spec)
    direct.check_spec(spec.with_(R=direct.MAX_FILTER, S=direct.MAX_FILTER))


EMU_CONFIGS = [DirectConfig(32, 32, 8, 4, 4, 1), DirectConfig(128, 128, 8, 8, 8, 2),
               DirectConfig(64, 32, 16, 8, 4, 1), DirectConfig(32, 64, 8, 4, 8, 1),
               DirectConfig(64, 128, 16, 4, 4, 1), DirectConfig(128, 32, 8, 4, 8, 1)]

EMU_SHAPES = [  # N, C, K, H, W, R, S, stride, padding
    (2, 3, 5, 9, 11, 3, 3, 1, 1),
    (1, 7, 33, 13, 7, 5, 3, 2, 2),
    (2, 4, 4, 8, 8, 1, 1, 1, 0),       # P % 4 == 0 and K % 4 == 0: vector epilogues
    (3, 2, 130, 5, 6, 7, 7, 3, 3),     # K over one 128 tile, padding > half the filter
    (1, 1, 1, 1, 1, 1, 1, 1, 0),
    (2, 5, 9, 3, 17, 4, 2, 4, 3),      # stride 4, output 3 x 5
]


def _emulate_vs_reference(shape, layout, cfg, seed, flush=None):
    N, C, K, H, W, R, S, stride, padding = shape
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W))
    w = rng.standard_normal((K, C, R, S))
    ref = direct_conv_nchw(x, w, stride, padding)
    xi = x if layout == "NCHW" else np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = emulate_direct(xi, w, stride, padding, layout, cfg, flush=flush)
    if layout == "NHWC":
        y = y.transpose(0, 3, 1, 2)
    assert not np.isnan(y).any()
    err = rel_l2(y, ref)
    assert err < 1e-12, (shape, layout, cfg, err)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cfg", EMU_CONFIGS, ids=lambda c: c.key)
def test_emulation_matches_reference(cfg, layout):
    if not structural_ok(cfg, layout == "NHWC"):
        pytest.skip("not a valid config for this layout")
    for i, shape in enumerate(EMU_SHAPES):
        _emulate_vs_reference(shape, layout, cfg, seed=i)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_emulation_flush_chunks(layout):
    # a short flush interval exercises first-store / later-add on small shapes
    _emulate_vs_reference((2, 6, 7, 5, 9, 3, 3, 1, 1), layout, DirectConfig(32, 32, 8, 4, 4, 1),
                          seed=3, flush=16)
    _emulate_vs_reference((1, 5, 12, 4, 4, 3, 2, 1, 1), layout, DirectConfig(64, 32, 16, 8, 4, 1),
                          seed=4, flush=16)


def test_flush_threshold():
    assert direct.FLUSH_MIN_CRS == 2048
    assert flush_terms(LayerSpec(N=1, C=227, K=1, H=3, W=3)) == 0           # 2043 terms
    assert flush_terms(LayerSpec(N=1, C=228, K=1, H=3, W=3)) == direct.FLUSH_TERMS


def test_emulation_random_shapes_heuristic_config():
    rng = random.Random(11)
    for i in range(10):
        spec = _random_spec(rng, layout=("NCHW", "NHWC")[i % 2], max_c=12)
        spec = spec.with_(N=1, H=min(spec.H, 13), W=min(spec.W, 13)) \
            if min(spec.H, 13) + 2 * spec.padding >= spec.R and \
            min(spec.W, 13) + 2 * spec.padding >= spec.S else spec
        cfg = heuristic_config(spec)
        _emulate_vs_reference((spec.N, spec.C, spec.K, spec.H, spec.W, spec.R, spec.S,
                               spec.stride, spec.padding), spec.layout, cfg, seed=i)


# ---------------------------------------------------------------------------
# Validation (before anything CUDA)
# ---------------------------------------------------------------------------

def test_conv2d_direct_validates_before_launch():
    x = np.zeros((1, 3, 8, 8), np.float32)
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(ValueError, match="float32"):
        conv2d_direct(x.astype(np.float64), w)
    with pytest.raises(ValueError, match="channels"):
        conv2d_direct(x, np.zeros((4, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="4-D"):
        conv2d_direct(x[0], w)
    with pytest.raises(ValueError, match="layout"):
        conv2d_direct(x, w, layout="CHWN")
    with pytest.raises(ValueError, match="stride"):
        conv2d_direct(x, w, stride=0)
    with pytest.raises(ValueError, match="padding"):
        conv2d_direct(x, w, padding=-1)
    with pytest.raises(ValueError, match="stride"):
        conv2d_direct(x, w, stride=1.5)
    with pytest.raises(ValueError, match="empty output"):
        conv2d_direct(np.zeros((1, 3, 2, 2), np.float32), np.zeros((4, 3, 5, 5), np.float32))
    with pytest.raises(ValueError, match="channels"):      # NHWC reads C last
        conv2d_direct(x, w, layout="NHWC")


def test_conv2d_direct_rejects_huge_tensors():
    class Fake:
        def __init__(self, shape):
            self.shape = shape
            self.dtype = np.dtype(np.float32)
            self.size = int(np.prod(shape))

    with pytest.raises(ValueError, match="32-bit"):
        conv2d_direct(Fake((64, 512, 256, 256)), Fake((8, 512, 1, 1)))


def test_no_cuda_at_import():
    code = ("import sys; import megawino.direct, megawino.tuning.direct; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([__import__("sys").executable, "-c", code], check=True, cwd="/")


def test_vector_x_rule_and_emulation():
    """The 16-byte x copy (Params::vec_x) is used only for 1x1 / stride 1 / no padding NCHW
    layers with OH*OW % 4 == 0 and an aligned x, and its emulation (tails in C and M)
    matches the reference."""
    from megawino.direct.kernel import vector_x
    one = LayerSpec(N=3, C=13, K=9, H=6, W=6, R=1, S=1, stride=1, padding=0)
    assert vector_x(one, 256)
    assert not vector_x(one, 260)                                   # misaligned x
    assert not vector_x(one.with_(layout="NHWC"), 256)
    assert not vector_x(one.with_(H=5, W=5), 256)                   # 25 pixels per plane
    assert not vector_x(one.with_(stride=2), 256)
    assert not vector_x(one.with_(padding=1), 256)
    assert not vector_x(one.with_(R=3, S=3), 256)
    rng = np.random.default_rng(7)
    for N, C, K, H, W, cfg in [(3, 13, 9, 6, 6, DirectConfig(32, 32, 8, 4, 4, 1)),
                               (2, 37, 70, 4, 7, DirectConfig(64, 64, 16, 8, 8, 1))]:
        x = rng.standard_normal((N, C, H, W))
        w = rng.standard_normal((K, C, 1, 1))
        assert vector_x(LayerSpec(N=N, C=C, K=K, H=H, W=W, R=1, S=1, stride=1, padding=0), 0)
        y = emulate_direct(x, w, 1, 0, "NCHW", cfg)
        assert rel_l2(y, direct_conv_nchw(x, w, 1, 0)) < 1e-12
