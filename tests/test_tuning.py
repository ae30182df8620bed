import json

import pytest

from megawino import tuning
from megawino.mapping import MappingParams
from megawino.spec import LayerSpec
from megawino.tasks import Layout, TaskParams, build_graph
from megawino.mapping import build_interleaved


def test_gpu_key():
    assert tuning.gpu_key("NVIDIA H100 80GB HBM3") == "h100"
    assert tuning.gpu_key("NVIDIA H200") == "h200"
    assert tuning.gpu_key("weird device!") == "weird-device"


def test_heuristic_without_table(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "mapping_dir", lambda: tmp_path)
    spec = LayerSpec(64, 64, 64, 56, 56)
    params, mp, source = tuning.choose(spec, "h100")
    assert source == "heuristic"
    assert mp.dig == tuning.DEFAULT_WORKERS and mp.m == 4
    build_interleaved(build_graph(spec, params), mp)   # valid


def test_tuned_and_nearest_and_override(tmp_path, monkeypatch):
    spec = LayerSpec(64, 64, 64, 56, 56)
    table = {"layers": {}}
    tuned = TaskParams(tiles_per_group=128, input_channels_per_task=16, gemm_k_per_task=64,
                       output_k_per_task=16)
    tuning.write_entry(table, spec, tuned, MappingParams(32, 96, 2), time_us=123.0)
    path = tmp_path / "x.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    params, mp, source = tuning.choose(spec, "h100")
    assert (params, mp, source) == (tuned, MappingParams(32, 96, 2), "tuned")
    # a layout change or a name does not change the shape key
    assert tuning.choose(spec.with_(layout="NHWC", name="a"), "h100")[2] == "tuned"
    # another shape borrows the nearest entry; the GEMM width is clamped to its K
    params, mp, source = tuning.choose(LayerSpec(8, 64, 24, 30, 30), "h100")
    assert source == "nearest" and params.gemm_k_per_task == 24 and mp.m == 2
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError):
        tuning.choose(spec, "h100")


def test_candidate_space_is_valid():
    spec = LayerSpec(2, 48, 40, 20, 20)
    seen = 0
    for params, mp in tuning.candidate_space(spec, workers=16):
        assert mp.m <= Layout(spec, params).num_groups
        seen += 1
    assert seen > 4


def test_rank_by_simulation_orders_candidates():
    from megawino.simulator import CostModel
    from megawino.tune import rank_by_simulation
    spec = LayerSpec(4, 32, 32, 24, 24)
    ranked = rank_by_simulation(spec, CostModel(), workers=16, top=4)
    times = [r["predicted_us"] for r in ranked]
    assert times == sorted(times) and times[0] > 0
    # every task-size option is among the candidates (the GEMM's efficiency per size is measured)
    assert {r["params"] for r in ranked} == {p for p, _ in tuning.candidate_space(spec, workers=16)}
    # and M = 1 with the best task size is always measured (the output tail of few-group layers)
    assert any(r["mapping"].m == 1 for r in ranked)


def test_summary_of_a_table():
    from megawino.tune import summary
    table = {"layers": {"a": {"speedup_vs_sequential": 1.2, "speedup_vs_default": 1.1,
                              "simulator_error": 0.1},
                        "b": {"speedup_vs_sequential": 0.9, "speedup_vs_default": 1.0,
                              "simulator_error": 0.2},
                        "c": {"speedup_vs_sequential": 1.0, "speedup_vs_default": 1.0,
                              "simulator_error": 0.1, "sequential_order": True}}}
    s = summary(table)
    assert s["beat_sequential"] == 1 and s["sequential_is_best"] == 1 and s["layers"] == 3
    assert abs(s["geomean_speedup_vs_default"] - 1.1 ** (1 / 3)) < 1e-9


def test_confirm_alternates_and_takes_medians():
    from megawino.tune import confirm
    calls = []
    noise = {"winner": iter([90.0, 101.0, 100.0]), "default": iter([103.0, 102.0, 104.0])}

    def measure(name):
        calls.append(name)
        return next(noise[name])

    got = confirm(measure, ["winner", "default"], rounds=3)
    assert calls == ["winner", "default"] * 3            # alternating passes
    assert got == {"winner": 100.0, "default": 103.0}     # medians: the lucky 90 does not count
    with pytest.raises(ValueError, match="rounds"):
        confirm(measure, ["winner"], rounds=0)
