import dataclasses
import json
import os

import pytest

from megawino.tuning import table as tuning
from megawino.tuning import space as tuning_space
from megawino.tuning import choice as tuning_choice
from megawino.core import resources, user_files
from megawino.schedule.mapping import MappingParams
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import build_graph
from megawino.core.tasks import Layout, TaskParams
from megawino.schedule.mapping import build_interleaved


def test_heuristic_without_table(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "mapping_dir", lambda: tmp_path)
    spec = LayerSpec(64, 64, 64, 56, 56)
    params, mp, source = tuning_choice.choose(spec, "h100")
    assert source.kind == "heuristic" and source.table is None
    assert mp.dig == tuning.DEFAULT_WORKERS and mp.groups_per_column == 4
    build_interleaved(build_graph(spec, params), mp)   # valid


def test_tuned_and_nearest_and_override(tmp_path, monkeypatch):
    spec = LayerSpec(64, 64, 64, 56, 56)
    table = {"layers": {}}
    tuned = TaskParams(tiles_per_group=128, input_channels_per_task=16, gemm_k_per_task=64,
                       output_k_per_task=16)
    tuning.write_entry(table, spec, tuned, MappingParams(32, 96, 2), time_us=123.0)
    # the table keeps the paper's names: M is "m" in the file, groups_per_column in Python
    assert table["layers"][spec.shape_string]["mapping"] == {"dig": 32, "dgo": 96, "m": 2}
    path = tmp_path / "x.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    params, mp, source = tuning_choice.choose(spec, "h100")
    assert (params, mp, source.kind, source.table) == (tuned, MappingParams(32, 96, 2), "tuned", str(path))
    # a layout change or a name does not change the shape key
    assert tuning_choice.choose(spec.with_(layout="NHWC", name="a"), "h100")[2].kind == "tuned"
    # a near shape (same C, K and padding, a tile count within NEAR_TILES_RATIO) borrows nothing
    # from an entry nobody measured there ...
    near = LayerSpec(64, 64, 64, 40, 40)
    assert tuning_choice.choose(near, "h100")[2].kind == "heuristic"
    # ... and the entry's parameters once it was measured not to lose on its near shapes
    table["layers"][spec.shape_string].update(near_check={"n32c64k64h56w56": 1.02}, lends_near=True)
    path.write_text(json.dumps(table))
    params, mp, source = tuning_choice.choose(near, "h100")
    assert (source.kind, source.shape) == ("nearest", spec.shape_string) and mp.groups_per_column == 2
    # other channel counts, paddings or a tile count too far off are not near: the heuristic
    for far in (LayerSpec(8, 64, 24, 30, 30), LayerSpec(64, 64, 64, 56, 56, padding=0), LayerSpec(8, 64, 64, 28, 28)):
        assert tuning_choice.choose(far, "h100")[2].kind == "heuristic"
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError):
        tuning_choice.choose(spec, "h100")


def test_candidate_space_is_valid():
    spec = LayerSpec(2, 48, 40, 20, 20)
    seen = 0
    for params, mp in tuning_space.candidate_space(spec, workers=16):
        assert mp.groups_per_column <= Layout(spec, params).num_groups
        seen += 1
    assert seen > 4


@pytest.mark.parametrize("fused_output", [False, True])
def test_candidates_include_one_pass_nchw_input_tasks(fused_output):
    """Input tasks of NCHW_INPUT_PASS_CHANNELS channels (one pass of the NCHW input map) are
    offered beside the warp-wide ones, for GEMM + OUTPUT and GEMM_OUTPUT graphs."""
    from megawino.core.tasks import LANE_CHANNELS, NCHW_INPUT_PASS_CHANNELS
    spec = LayerSpec(2, 64, 40, 20, 20)
    chunks = {p.input_channels_per_task for p, _ in tuning_space.candidate_space(spec, workers=16, fused_output=fused_output)
              if p.fused_output == fused_output}
    assert {NCHW_INPUT_PASS_CHANNELS, LANE_CHANNELS} <= chunks


def test_rank_by_simulation_orders_candidates():
    from megawino.schedule.simulator import CostModel
    from megawino.tuning.search import rank_by_simulation
    spec = LayerSpec(4, 32, 32, 24, 24)
    ranked = rank_by_simulation(spec, CostModel(), workers=16, top=4)
    times = [r["predicted_us"] for r in ranked]
    assert times == sorted(times) and times[0] > 0
    # every task-size option is among the candidates (the GEMM's efficiency per size is measured)
    assert {r["params"] for r in ranked} == {p for p, _ in tuning_space.candidate_space(spec, workers=16)}
    # and M = 1 with the best task size is always measured (the output tail of few-group layers)
    assert any(r["mapping"].groups_per_column == 1 for r in ranked)


def test_summary_of_a_table():
    from megawino.tuning.search import summary
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
    from megawino.tuning.search import confirm
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


def test_confirmation_configs_names_each_config_once():
    from megawino.tuning.search import confirmation_configs
    default, seq = (TaskParams(), MappingParams(5, 6, 1)), (TaskParams(), "sequential")
    winner, incumbent = (TaskParams(tiles_per_group=64), MappingParams(5, 6, 1)), (TaskParams(), MappingParams(7, 8, 2))
    assert list(confirmation_configs(default, seq, winner, incumbent)) == ["default", "sequential", "winner", "incumbent"]
    assert list(confirmation_configs(default, seq, None, incumbent)) == ["default", "sequential", "incumbent"]
    assert list(confirmation_configs(default, seq, winner, winner)) == ["default", "sequential", "winner"]
    assert list(confirmation_configs(default, seq, default, None)) == ["default", "sequential"]


def test_retune_keeps_the_tables_entry_when_the_confirmation_finds_it_faster(monkeypatch):
    """The simulator's first pick measured lucky once (first pass), the table's entry is faster
    in the alternating confirmation: the entry ships, with the confirmed times."""
    from megawino.tuning import search
    spec = LayerSpec(2, 32, 32, 16, 16)
    default_params, default_mapping, _ = tuning_choice.choose(spec, key=None)
    candidate = {"params": TaskParams(tiles_per_group=64), "mapping": MappingParams(3, 4, 1), "predicted_us": 5.0}
    incumbent = (TaskParams(tiles_per_group=128), MappingParams(9, 9, 2))
    first_pass = {"candidate": [9.0], "default": [11.0], "sequential": [12.0]}
    confirmation = {"candidate": 10.5, "default": 11.0, "sequential": 12.0, "incumbent": 10.0}
    seen = []

    def name_of(params, mapping):
        if mapping == "sequential":
            return "sequential"
        if (params, mapping) == (default_params, default_mapping):
            return "default"
        return "candidate" if params == candidate["params"] else "incumbent"

    def measure_us(runtime, spec_, params, mapping, xs, w, reps=10):
        name = name_of(params, mapping)
        seen.append(name)
        return first_pass[name].pop(0) if first_pass.get(name) else confirmation[name]

    class Traced:
        graph, order, workers, blocks_per_sm = None, None, 16, 2
        def __call__(self, x, w): pass
        def trace(self): return []

    class Runtime:
        def plan(self, *args, **kwargs): return Traced()

    monkeypatch.setattr(search, "rotated_inputs", lambda spec_, rng: ([None] * 3, None))
    monkeypatch.setattr(search, "calibrate_on_traces", lambda *a, **k: (None, None, 1.0))
    monkeypatch.setattr(search, "simulate", lambda *a, **k: type("R", (), {"makespan": 1.0})())
    monkeypatch.setattr(search, "rank_by_simulation", lambda *a, **k: [candidate])
    monkeypatch.setattr(search, "measure_us", measure_us)
    res = search.tune_layer(Runtime(), spec, confirm_rounds=3, incumbent=incumbent)
    assert seen.count("incumbent") == 3 and seen.count("candidate") == 4     # first pass + 3 rounds
    assert (res["winner"]["params"], res["winner"]["mapping"]) == incumbent
    assert res["time_us"] == 10.0 and res["default_us"] == 11.0
    # without a table entry the candidate ships
    first_pass.update(candidate=[9.0], default=[11.0], sequential=[12.0])
    res = search.tune_layer(Runtime(), spec, confirm_rounds=3)
    assert res["winner"]["params"] == candidate["params"] and res["time_us"] == 10.5


def test_tune_passes_each_layers_table_entry_as_incumbent(fake_tuner, monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(fake_tuner, "tune_layer", lambda runtime, spec, **kw: seen.update({spec.name: kw["incumbent"]})
                        or _fake_tune_layer(runtime, spec))
    shipped = tuning.read_table(resources.mapping_dir() / "h100.json")["layers"]["n64c64k64h56w56"]
    tabled = LayerSpec(64, 64, 64, 56, 56, name="tabled")
    fake_tuner.tune([tabled, LayerSpec(2, 16, 16, 12, 12, name="new")], out_path=tmp_path / "t.json", budget_s=60)
    assert seen["new"] is None
    assert seen["tabled"] == tuning_choice.entry_params(shipped, tabled)

# ---- table schema ---------------------------------------------------------------------

def test_table_mapping_keys_name_every_mapping_parameter_once():
    fields = [f.name for f in dataclasses.fields(MappingParams)]
    assert sorted(tuning.MAPPING_KEYS.values()) == sorted(fields)
    assert len(set(tuning.MAPPING_KEYS)) == len(fields)
    shipped = json.loads((resources.mapping_dir() / "h100.json").read_text())["layers"]
    for entry in shipped.values():
        mapping = tuning.mapping_from_entry(entry["mapping"])
        assert tuning.mapping_to_entry(mapping) == entry["mapping"]
        assert mapping.groups_per_column == entry["mapping"]["m"]


def _entry(**changes):
    spec = LayerSpec(64, 64, 64, 56, 56)
    table = {"layers": {}}
    tuning.write_entry(table, spec, TaskParams(tiles_per_group=128, input_channels_per_task=16,
                                               gemm_k_per_task=64, output_k_per_task=16),
                       MappingParams(32, 96, 2), time_us=123.0)
    key, entry = next(iter(table["layers"].items()))
    for path, value in changes.items():
        *parents, last = path.split(".")
        target = entry
        for part in parents:
            target = target[part]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return key, entry


_DELETE = object()
_KEY = "n64c64k64h56w56"

BAD_TABLES = [
    ({"layers": {"x": 1}}, r"layer 'x': expected a JSON object, got int"),
    ({"layers": {_KEY: _entry(spec=_DELETE)[1]}}, rf"layer '{_KEY}': missing 'spec'"),
    ({"layers": {_KEY: _entry(params=_DELETE)[1]}}, rf"layer '{_KEY}': missing 'params'"),
    ({"layers": {_KEY: _entry(mapping=_DELETE)[1]}}, rf"layer '{_KEY}': missing 'mapping'"),
    ({"layers": {_KEY: _entry(**{"params.tile_size": 4})[1]}},
     rf"layer '{_KEY}': 'params': unknown key 'tile_size'"),
    ({"layers": {_KEY: _entry(**{"params.gemm_k_per_task": _DELETE})[1]}},
     rf"layer '{_KEY}': 'params': missing 'gemm_k_per_task'"),
    ({"layers": {_KEY: _entry(**{"params.tiles_per_group": 2**36})[1]}},
     rf"layer '{_KEY}': TaskParams.tiles_per_group must be an integer in 1..32768, got 68719476736"),
    ({"layers": {_KEY: _entry(**{"params.tiles_per_group": "128"})[1]}},
     rf"layer '{_KEY}': TaskParams.tiles_per_group must be an integer"),
    ({"layers": {_KEY: _entry(**{"mapping.dig": 2**40})[1]}},
     rf"layer '{_KEY}': mapping parameter DIG must be an integer in 0..2147483647"),
    ({"layers": {_KEY: _entry(**{"mapping.m": True})[1]}}, rf"layer '{_KEY}': mapping parameter groups_per_column \(the paper's M\)"),
    ({"layers": {_KEY: _entry(**{"mapping.speed": 1})[1]}}, rf"layer '{_KEY}': 'mapping': unknown key 'speed'"),
    ({"layers": {_KEY: _entry(**{"spec.N": 32})[1]}}, rf"layer '{_KEY}': 'spec' .* is not the key's shape"),
    ({"layers": {_KEY: _entry(**{"spec.N": 64.0})[1]}}, rf"layer '{_KEY}': 'spec': 'N' must be a JSON integer, got 64.0"),
    ({"layers": {_KEY: _entry(time_us="fast")[1]}}, rf"layer '{_KEY}': 'time_us' must be a JSON number, got 'fast'"),
    ({"layers": {_KEY: _entry(colour="red")[1]}}, rf"layer '{_KEY}': unknown key 'colour'"),
    ({"layers": {"resnet": _entry()[1]}}, r"layer 'resnet': shape string 'resnet' is not of the form"),
    ({"layers": {"n1000000000c64k64h56w56": _entry(**{"spec.N": 1000000000})[1]}},
     r"layer 'n1000000000c64k64h56w56': layer N1000000000 .* too large for the kernels' int32"),
    ({"layers": []}, r"table: 'layers' must be a JSON object, got \[\]"),
    ({"entries": {}}, r"table: unknown key 'entries'"),
    ({"gpu": "h100"}, r"table: missing 'layers'"),
    ([1, 2], r"table: expected a JSON object, got list"),
]


@pytest.mark.parametrize("table, message", BAD_TABLES)
def test_bad_table_is_a_one_line_error_naming_file_and_entry(table, message, tmp_path, monkeypatch):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    with pytest.raises(ValueError) as info:
        tuning_choice.choose(LayerSpec(64, 64, 64, 56, 56), "h100")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: ")
    import re
    assert re.search(message, text), text


def test_table_that_is_not_json_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "broken.json"
    path.write_text('{"layers": {"n1c8k8h8w8": {"spec": ')     # a truncated table
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    with pytest.raises(ValueError, match=rf"^{path}: not a JSON mapping table"):
        tuning_choice.choose(LayerSpec(64, 64, 64, 56, 56), "h100")


def test_shipped_tables_follow_the_schema():
    from megawino import direct
    from megawino.core.resources import mapping_dir
    shipped = sorted(mapping_dir().glob("*.json"))
    winograd = [p for p in shipped if not p.name.startswith("direct_")]
    assert winograd and all(tuning.read_table(p)["layers"] for p in winograd)
    tables = [p for p in shipped if p.name.startswith("direct_") and "ptxas" not in p.name]
    for path in tables:
        assert direct.config.parse_direct_table(json.loads(path.read_text()), path)
    assert tables


def test_write_entry_refuses_fields_outside_the_schema():
    with pytest.raises(ValueError, match="no field 'colour'"):
        tuning.write_entry({"layers": {}}, LayerSpec(1, 8, 8, 8, 8), TaskParams(), MappingParams(),
                           colour="red")


# ---- where tables are read and written -----------------------------------------------------

def test_cache_dir_follows_env_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv(user_files.CACHE_ENV, str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_files.cache_dir() == tmp_path / "own"
    monkeypatch.delenv(user_files.CACHE_ENV)
    assert user_files.cache_dir() == tmp_path / "xdg" / "megawino"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")       # invalid per the XDG spec: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_files.cache_dir() == tmp_path / "home" / ".cache" / "megawino"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert user_files.cache_dir() == tmp_path / "home" / ".cache" / "megawino"
    assert tuning.user_table_path("h100") == tmp_path / "home" / ".cache" / "megawino" / "h100.json"


def _one_entry_table(spec, params, mapping, lends=False):
    """A table of one entry; ``lends``: measured not to lose at half its batch, so it lends."""
    table = {"layers": {}}
    near = {spec.with_(N=max(1, spec.N // 2), name="").shape_string: 1.05} if lends else {}
    tuning.write_entry(table, spec, params, mapping, time_us=1.0,
                       **(dict(near_check=near, lends_near=True) if lends else {}))
    return table


def test_lookup_order_override_then_user_then_shipped(tmp_path, monkeypatch):
    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    monkeypatch.setattr(tuning, "mapping_dir", lambda: shipped_dir)
    a, b = LayerSpec(64, 64, 64, 56, 56), LayerSpec(8, 32, 64, 28, 28)
    p_ship, p_user, p_env = (TaskParams(tiles_per_group=t) for t in (64, 128, 192))
    ship = _one_entry_table(a, p_ship, MappingParams(1, 1, 1))
    tuning.write_entry(ship, b, p_ship, MappingParams(2, 2, 1))
    (shipped_dir / "h100.json").write_text(json.dumps(ship))
    assert tuning_choice.choose(a, "h100")[:2] == (p_ship, MappingParams(1, 1, 1))
    # the user's tuned entry for a wins; b still comes from the shipped table
    tuning.write_table(tuning.user_table_path("h100"), _one_entry_table(a, p_user, MappingParams(3, 3, 1)))
    assert tuning_choice.choose(a, "h100")[:2] == (p_user, MappingParams(3, 3, 1))
    assert tuning_choice.choose(b, "h100")[:2] == (p_ship, MappingParams(2, 2, 1))
    # MEGAWINO_MAPPING replaces both
    env = tmp_path / "env.json"
    env.write_text(json.dumps(_one_entry_table(a, p_env, MappingParams(4, 4, 1))))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(env))
    assert tuning_choice.choose(a, "h100")[:2] == (p_env, MappingParams(4, 4, 1))
    assert tuning_choice.choose(a, "h100")[2].as_dict() == {"kind": "tuned", "table": str(env), "shape": a.shape_string}
    assert tuning_choice.choose(b, "h100")[2].kind == "heuristic"     # b is not near a
    # a broken user table is an error naming it, not a silent fallback
    monkeypatch.delenv(tuning.ENV_OVERRIDE)
    tuning.user_table_path("h100").write_text('{"layers": {"x": 1}}')
    with pytest.raises(ValueError, match=rf"^{tuning.user_table_path('h100')}: layer 'x'"):
        tuning_choice.choose(a, "h100")


def test_bf16x3_plans_read_their_own_table_then_the_gpus(tmp_path, monkeypatch):
    """gemm_math="bf16x3" has a table of its own (<gpu>-bf16x3): its entry for the shape first,
    then the GPU's entry for the shape, then its nearest entry; 3xTF32 and FFMA share the GPU's."""
    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    monkeypatch.setattr(tuning, "mapping_dir", lambda: shipped_dir)
    assert [tuning.table_key("h100", g) for g in ("3xtf32", "ffma", "bf16x3")] == ["h100", "h100", "h100-bf16x3"]
    a, b, c = LayerSpec(64, 64, 64, 56, 56), LayerSpec(8, 32, 64, 28, 28), LayerSpec(64, 64, 64, 40, 40)
    p_gpu, p_bf16 = TaskParams(tiles_per_group=64), TaskParams(tiles_per_group=128)
    gpu = _one_entry_table(a, p_gpu, MappingParams(1, 1, 1))
    tuning.write_entry(gpu, b, p_gpu, MappingParams(2, 2, 1))
    (shipped_dir / "h100.json").write_text(json.dumps(gpu))
    (shipped_dir / "h100-bf16x3.json").write_text(json.dumps(_one_entry_table(a, p_bf16, MappingParams(3, 3, 1),
                                                                              lends=True)))
    params, mapping, source = tuning_choice.choose(a, "h100-bf16x3", fallback="h100")
    assert (params, mapping, source.kind, source.table) == (p_bf16, MappingParams(3, 3, 1), "tuned",
                                                            str(shipped_dir / "h100-bf16x3.json"))
    params, mapping, source = tuning_choice.choose(b, "h100-bf16x3", fallback="h100")
    assert (params, mapping, source.kind, source.table) == (p_gpu, MappingParams(2, 2, 1), "tuned",
                                                            str(shipped_dir / "h100.json"))
    mapping, source = tuning_choice.choose(c, "h100-bf16x3", fallback="h100")[1:]
    assert (mapping, source.kind) == (MappingParams(3, 3, 1), "nearest")
    # A ring's slot count is for its own shape's order: a borrowed entry drops it.
    # (4 slots: the fewest this order allows; the schema refuses fewer)
    ringed = _one_entry_table(a, TaskParams(tiles_per_group=64, buffer_groups=4), MappingParams(4, 4, 1), lends=True)
    (shipped_dir / "h100-bf16x3.json").write_text(json.dumps(ringed))
    assert tuning_choice.choose(a, "h100-bf16x3")[0].buffer_groups == 4
    assert tuning_choice.choose(c, "h100-bf16x3")[0].buffer_groups is None
    assert tuning_choice.choose(a, "h100", fallback="h100")[2].kind == "tuned"
    # The first table with a near shape decides: its nearest entry does not lend, so the GPU
    # table's lending entry for the same shape does not stand in for it.
    (shipped_dir / "h100-bf16x3.json").write_text(json.dumps(_one_entry_table(a, p_bf16, MappingParams(3, 3, 1))))
    (shipped_dir / "h100.json").write_text(json.dumps(_one_entry_table(a, p_gpu, MappingParams(1, 1, 1), lends=True)))
    assert tuning_choice.choose(c, "h100", fallback="h100")[2].kind == "nearest"
    assert tuning_choice.choose(c, "h100-bf16x3", fallback="h100")[2].kind == "heuristic"


def test_tune_gemm_math_writes_its_own_table(fake_tuner, monkeypatch):
    seen = []
    monkeypatch.setattr(fake_tuner, "tune_layer", lambda runtime, spec, **kw: seen.append(kw["gemm_math"])
                        or _fake_tune_layer(runtime, spec))
    table = fake_tuner.tune([LayerSpec(2, 16, 16, 12, 12)], budget_s=60, gemm_math="bf16x3")
    assert seen == ["bf16x3"] and table["key"] == "h100-bf16x3"
    assert table["path"] == str(tuning.user_table_path("h100-bf16x3"))
    assert LayerSpec(2, 16, 16, 12, 12).shape_string in tuning.read_table(table["path"])["layers"]


def _fake_tune_layer(runtime, spec, **kw):
    params = TaskParams(tiles_per_group=64)
    return {"winner": {"params": params, "mapping": MappingParams(5, 6, 1)}, "time_us": 10.0,
            "default_us": 11.0, "sequential_us": 12.0, "speedup_vs_default": 1.1,
            "speedup_vs_sequential": 1.2, "candidates_measured": 3, "confirm_rounds": 3,
            "sequential_order": False, "trace_makespan_us": 9.0, "simulated_makespan_us": 9.5,
            "simulator_error": 0.05}


@pytest.fixture
def fake_tuner(monkeypatch):
    from megawino.tuning import search as tune
    monkeypatch.setattr(tune, "tune_layer", _fake_tune_layer)
    from megawino.gpu import identity
    monkeypatch.setattr(identity, "current_identity",
                        lambda: identity.identity_of("NVIDIA H100 80GB HBM3", "90", sms=132))
    return tune


def test_tune_writes_the_user_table_not_the_shipped_one(fake_tuner, monkeypatch, tmp_path):
    from megawino.core.resources import mapping_dir
    shipped = (mapping_dir() / "h100.json").read_bytes()
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(tmp_path / "elsewhere.json"))   # never the target
    specs = [LayerSpec(2, 16, 16, 12, 12), LayerSpec(1, 8, 24, 9, 9)]
    table = fake_tuner.tune(specs, budget_s=60)
    path = tuning.user_table_path("h100")
    assert table["path"] == str(path) and path.parent == user_files.cache_dir()
    assert (mapping_dir() / "h100.json").read_bytes() == shipped
    assert not (tmp_path / "elsewhere.json").exists()
    written = tuning.read_table(path)
    assert set(written["layers"]) == {s.shape_string for s in specs}
    assert [p.name for p in path.parent.iterdir()] == ["h100.json"]      # no temporary file left
    # a second run updates the table it wrote
    fake_tuner.tune([LayerSpec(1, 8, 8, 8, 8)], budget_s=60)
    assert len(tuning.read_table(path)["layers"]) == 3


@pytest.mark.parametrize("content", ["not json at all", '{"layers": {"x": 1}}', '{"gpu": 1}', ""])
def test_tune_never_overwrites_a_file_that_is_not_a_table(content, fake_tuner, tmp_path):
    path = tmp_path / "precious.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"not overwriting {path}: it is not a megawino mapping table"):
        fake_tuner.tune([LayerSpec(2, 16, 16, 12, 12)], out_path=path, budget_s=60)
    assert path.read_text() == content


def test_tune_replaces_the_table_atomically(fake_tuner, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    fake_tuner.tune([LayerSpec(2, 16, 16, 12, 12)], out_path=path, budget_s=60)
    before = path.read_text()

    def crash(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        fake_tuner.tune([LayerSpec(1, 8, 8, 8, 8)], out_path=path, budget_s=60)
    assert path.read_text() == before                       # the old table, whole
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # and no temporary file


# ---- direct tables and tuner -----------------------------------------------------------

_DKEY = "n64c64k64h56w56r1s1p0"


def _direct_table(entry=None, **top):
    entry = {"config": "bm64bn64bk8tm4tn4mb1", "us": 1.0} if entry is None else entry
    return {"gpu": "h100", "entries": {_DKEY: entry}, **top}


BAD_DIRECT_TABLES = [
    (_direct_table(entry=1), rf"entry '{_DKEY}': expected a JSON object, got int"),
    (_direct_table(entry={"us": 1.0}), rf"entry '{_DKEY}': missing 'config'"),
    (_direct_table(entry={"config": "bm64"}), rf"entry '{_DKEY}': not a direct config key: 'bm64'"),
    (_direct_table(entry={"config": "bm4096bn64bk8tm4tn4mb1"}),
     rf"entry '{_DKEY}': config 'bm4096bn64bk8tm4tn4mb1': BM = 4096 is outside 1..128"),
    (_direct_table(entry={"config": "bm64bn64bk8tm4tn4mb1", "speed": 2}), rf"entry '{_DKEY}': unknown key 'speed'"),
    (_direct_table(entry={"config": "bm64bn64bk8tm4tn4mb1", "us": "1"}), rf"entry '{_DKEY}': 'us' must be"),
    (_direct_table(entry={"config": "bm64bn64bk8tm4tn4mb1", "measured": [{"us": 1.0}]}),
     rf"entry '{_DKEY}': 'measured'\[0\]: missing 'config'"),
    ({"entries": {"conv1": {"config": "bm64bn64bk8tm4tn4mb1"}}}, r"entry 'conv1': shape string 'conv1'"),
    (_direct_table(extra=1), r"table: unknown key 'extra'"),
    ({"gpu": "h100"}, r"table: missing 'entries'"),
]


@pytest.mark.parametrize("table, message", BAD_DIRECT_TABLES)
def test_bad_direct_table_names_file_and_entry(table, message, tmp_path, monkeypatch):
    import re
    from megawino import direct
    (tmp_path / "direct_h100.json").write_text(json.dumps(table))
    monkeypatch.setattr(direct.model, "mapping_dir", lambda: tmp_path)
    spec = LayerSpec(64, 64, 64, 56, 56, 1, 1, padding=0)
    with pytest.raises(ValueError) as info:
        direct.heuristic_config(spec)
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{tmp_path / 'direct_h100.json'}: "), text
    assert re.search(message, text), text


def test_direct_user_table_takes_precedence(tmp_path, monkeypatch):
    from megawino import direct
    from megawino.direct import DirectConfig
    spec = LayerSpec(64, 64, 64, 56, 56, 1, 1, padding=0)
    shipped, user = DirectConfig(64, 64, 8, 4, 4, 1), DirectConfig(32, 64, 8, 4, 4, 1)
    (tmp_path / "direct_h100.json").write_text(json.dumps(_direct_table({"config": shipped.key})))
    monkeypatch.setattr(direct.model, "mapping_dir", lambda: tmp_path)
    assert direct.heuristic_config(spec) == shipped
    user_files.write_text_atomically(user_files.user_table_path("direct_h100.json"),
                                     json.dumps(_direct_table({"config": user.key})))
    assert direct.heuristic_config(spec) == user


def _fake_direct_measure(spec, cfg):
    return 100.0 + cfg.BM / 128


def test_direct_tuner_writes_the_user_table(tmp_path, monkeypatch):
    from megawino import direct
    from megawino.tuning.direct import tune_layers
    shipped_dir = direct.model.mapping_dir()
    before = {p.name: p.read_bytes() for p in shipped_dir.glob("direct_*.json")}
    spec = LayerSpec(8, 64, 64, 28, 28, 1, 1, padding=0)
    table = tune_layers([spec], top=2, budget_s=60, gpu="h100", measure=_fake_direct_measure,
                        progress=False)
    path = user_files.user_table_path("direct_h100.json")
    assert table["path"] == str(path)
    assert direct.config.parse_direct_table(json.loads(path.read_text()), path)
    assert {p.name: p.read_bytes() for p in shipped_dir.glob("direct_*.json")} == before
    assert [p.name for p in path.parent.iterdir()] == ["direct_h100.json"]


@pytest.mark.parametrize("content", ["#!/bin/sh\necho hi\n", '{"entries": {"x": 1}}', ""])
def test_direct_tuner_never_overwrites_a_file_that_is_not_a_table(content, tmp_path):
    from megawino.tuning.direct import tune_layers
    path = tmp_path / "keep.json"
    path.write_text(content)
    calls = []
    with pytest.raises(ValueError, match=rf"not overwriting {path}: it is not a megawino direct table"):
        tune_layers([LayerSpec(8, 64, 64, 28, 28, 1, 1, padding=0)], top=2, out=path,
                    measure=lambda s, c: calls.append(c) or 1.0, progress=False)
    assert path.read_text() == content and not calls       # refused before anything was measured


def test_tune_refuses_a_directory_as_its_table(fake_tuner, tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path} is not a file"):
        fake_tuner.tune([LayerSpec(2, 16, 16, 12, 12)], out_path=tmp_path, budget_s=60)
