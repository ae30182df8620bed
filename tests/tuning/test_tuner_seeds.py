"""The tuner's seeds, its search space and its budget (megawino.tuning.search, .space, .budget):
CPU only, with the GPU measurements faked."""
import dataclasses

import pytest

from megawino.core.spec import LayerSpec, parse_shape
from megawino.core.tasks import TaskParams
from megawino.gpu import identity
from megawino.schedule.mapping import MappingParams
from megawino.tuning import budget, choice, search, space, table as tuning


def test_seeds_are_every_shipped_tables_entry_for_the_shape():
    spec = LayerSpec(64, 32, 64, 208, 208, name="yolov3.res1")
    seeds = search.seed_configs(spec, fused_output=True)
    labels = [label for label, _ in seeds]
    assert "h100.json" in labels and "h100-bf16x3.json" in labels
    h100 = tuning.read_table(tuning.mapping_dir() / "h100.json")["layers"][spec.shape_string]
    assert dict(seeds)["h100.json"] == choice.entry_params(h100, spec)
    assert dict(seeds)["h100.json"][0].fused_output            # the GEMM_OUTPUT entry is a seed
    # without GEMM_OUTPUT tasks (bf16x3 plans) the entry gives the heuristic's task sizes
    assert not any(p.fused_output for _, (p, _) in search.seed_configs(spec, fused_output=False))
    assert len(set(cfg for _, cfg in seeds)) == len(seeds)


def test_near_shapes_seed_too_and_far_ones_do_not():
    near = LayerSpec(64, 192, 48, 10, 10)        # between densenet161.block3 (14x14) and block4 (7x7)
    labels = [label for label, _ in search.seed_configs(near, fused_output=True)]
    assert labels and all(parse_shape(label.split()[1]).C == 192 for label in labels)
    assert search.seed_configs(LayerSpec(64, 192, 48, 10, 10, padding=0), fused_output=True) == []


def test_space_covers_every_task_size_the_shipped_tables_use():
    groups, widths = space.shipped_task_sizes()
    assert {64, 128, 256} <= groups and 48 in widths
    spec = LayerSpec(64, 192, 48, 28, 28)
    cands = list(space.candidate_space(spec, fused_output=True))
    assert {p.tiles_per_group for p, _ in cands} >= {64, 128, 256}
    assert 48 in {p.gemm_k_per_task for p, _ in cands if not p.fused_output}
    assert any(p.fused_output for p, _ in space.candidate_space(LayerSpec(8, 32, 64, 52, 52), fused_output=True))


def test_ring_form_shrinks_v_and_m_or_is_none():
    spec = LayerSpec(8, 64, 64, 56, 56)
    params = TaskParams(tiles_per_group=64)
    ring = search.ring_form(spec, params, MappingParams(16, 16, 1))
    assert ring is not None and 0 < ring.buffer_groups
    assert search.ring_form(spec, dataclasses.replace(params, fused_output=True, gemm_k_per_task=32), MappingParams(16, 16, 1)) is None


def test_tune_layer_measures_every_seed_and_ships_no_loser(monkeypatch):
    """The simulator ranks nothing useful; a seed is the fastest: it is measured, confirmed and
    shipped.  When the current choice confirms faster than the first pass's winner, it ships."""
    spec = LayerSpec(2, 32, 32, 16, 16)
    default = choice.choose(spec, key=None)[:2]
    seed_a = (TaskParams(tiles_per_group=64), MappingParams(3, 3, 1))
    seed_b = (TaskParams(tiles_per_group=128), MappingParams(5, 5, 2))
    times = {default: 10.0, "sequential": 12.0, seed_a: 8.0, seed_b: 9.0}
    seen = []

    def measure_us(runtime, spec_, params, mapping, xs, w, reps=10):
        key = "sequential" if mapping == "sequential" else (params, mapping)
        seen.append(key)
        return times[key]

    monkeypatch.setattr(search, "rotated_inputs", lambda spec_, rng: ([None] * 3, None))
    monkeypatch.setattr(search, "measure_us", measure_us)

    class Runtime:
        def plan(self, *args, **kwargs):
            raise AssertionError("no simulator pass: the deadline has passed")
    res = search.tune_layer(Runtime(), spec, deadline=0.0, seeds=[("a", seed_a), ("b", seed_b)],
                            confirm_rounds=3)
    assert seen.count(seed_b) == 1 and seen.count(seed_a) == 4       # first pass + 3 confirmations
    assert (res["winner"]["params"], res["winner"]["mapping"]) == seed_a and res["time_us"] == 8.0
    assert "simulator_error" not in res
    times[seed_b] = 7.5      # the current choice (incumbent) confirms faster than the first pass's winner
    times[seed_a] = 8.0
    res = search.tune_layer(Runtime(), spec, deadline=0.0, seeds=[("a", seed_a)], incumbent=seed_b)
    assert (res["winner"]["params"], res["winner"]["mapping"]) == seed_b


def test_schedule_gives_each_layer_its_minimum_or_skips_it_whole():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    spec = LayerSpec(1, 8, 8, 8, 8)
    jobs = [budget.LayerJob(spec, [], None, (m, m / 2)) for m in (10.0, 50.0, 20.0)]
    sched = budget.Schedule(jobs, 40.0, clock)
    first = sched.start(jobs[0])
    assert sched.skipped == [jobs[1]]                 # the largest minimum did not fit with the others
    # its share: its minimum plus its part of the spare 10 s, less its confirmation
    assert first == pytest.approx(10 + 10 * 10 / 30 - 5)
    now[0] = 30.0                                     # it overran its share of 13.3 s
    sched.done(jobs[0])
    assert sched.scale == pytest.approx(30 / (10 + 10 * 10 / 30))
    assert sched.start(jobs[1]) is None
    assert sched.start(jobs[2]) is None and sched.skipped == [jobs[1], jobs[2]]   # 10 s left < 20 x scale


def test_minimum_estimate_grows_with_the_layer_and_its_seeds():
    c = identity.ceilings(identity.DEFAULT_TARGET)
    small, big = LayerSpec(64, 192, 48, 7, 7), LayerSpec(64, 32, 64, 208, 208)
    assert budget.minimum_s(big, 2, c, 10)[0] > budget.minimum_s(small, 2, c, 10)[0]
    assert budget.minimum_s(small, 4, c, 10)[0] > budget.minimum_s(small, 1, c, 10)[0]


def test_tune_skips_layers_that_do_not_fit_and_writes_none_of_them(monkeypatch, tmp_path):
    monkeypatch.setattr(identity, "current_identity", lambda: identity.identity_of("NVIDIA H800", "90", sms=132))
    monkeypatch.setattr(budget, "minimum_s", lambda spec, seeds, ceilings, reps: (spec.N * 1.0, 0.1))
    ran = []

    def fake(runtime, spec, **kw):
        ran.append((spec.name, kw["incumbent"], [label for label, _ in kw["seeds"]]))
        return {"winner": {"params": TaskParams(tiles_per_group=64), "mapping": MappingParams(5, 6, 1)},
                "time_us": 10.0, "default_us": 11.0, "sequential_us": 12.0, "speedup_vs_default": 1.1,
                "speedup_vs_sequential": 1.2, "candidates_measured": 3, "confirm_rounds": 3,
                "sequential_order": False}
    monkeypatch.setattr(search, "tune_layer", fake)
    shipped = LayerSpec(64, 64, 64, 56, 56, name="resnet50.conv2_x")     # minimum 64 s: does not fit
    small = LayerSpec(2, 16, 16, 12, 12, name="small")
    table = search.tune([shipped, small], out_path=tmp_path / "t.json", budget_s=30)
    assert [s.name for s in table["skipped"]] == ["resnet50.conv2_x"]
    assert set(tuning.read_table(tmp_path / "t.json")["layers"]) == {small.shape_string}
    assert ran == [("small", None, [])]
    # with time for both: the H800 (no table of its own) confirms against the H100 table's entry
    ran.clear()
    search.tune([shipped], out_path=tmp_path / "t.json", budget_s=100)
    name, incumbent, labels = ran[0]
    h100 = tuning.read_table(tuning.mapping_dir() / "h100.json")["layers"][shipped.shape_string]
    assert incumbent == choice.entry_params(h100, shipped)
    assert labels[0].startswith("same-architecture fallback: h100.json") and "h100-bf16x3.json" in labels
