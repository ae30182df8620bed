"""CPU tests of which tuned entries lend their parameters to near shapes: the table fields
(``near_check``, ``lends_near``), the runtime rule, the measurement's bookkeeping
(megawino.tuning.near, the GPU timing replaced) and ``megawino tune --check-near``."""
from __future__ import annotations

import copy
import io
import json
import math
import pathlib

import pytest
from rich.console import Console

from megawino import runtime, sweep
from megawino.cli import main
from megawino.core.networks import find_layer
from megawino.core.resources import mapping_dir
from megawino.core.spec import LayerSpec
from megawino.core.task_sizes import default_params
from megawino.gpu import identity
from megawino.schedule.mapping import MappingParams
from megawino.tuning import choice, near, table as tuning
from megawino.core.tasks import Layout, TaskParams

REPO = pathlib.Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "h200" / "near-check.json"
ENTRY = LayerSpec(8, 32, 32, 16, 16)
KEY = ENTRY.shape_string                      # n8c32k32h16w16
HALF, THIRD = "n4c32k32h16w16", "n3c32k32h16w16"
TUNED = (TaskParams(tiles_per_group=64, input_channels_per_task=16, gemm_k_per_task=32, output_k_per_task=16),
         MappingParams(8, 8, 1))


def _table(**fields) -> dict:
    table = {"layers": {}}
    tuning.write_entry(table, ENTRY, *TUNED, time_us=1.0, **fields)
    return table


# ---- the table fields ------------------------------------------------------------------------

BAD_FIELDS = [
    (dict(near_check=[1.1], lends_near=True), r"'near_check' must be a JSON object"),
    (dict(near_check={HALF: 1.1}, lends_near=1), r"'lends_near' must be a JSON boolean, got 1"),
    (dict(near_check={HALF: 1.1}), r"'near_check' without 'lends_near'"),
    (dict(near_check={"resnet": 1.1}, lends_near=True), r"'near_check': shape string 'resnet' is not of the form"),
    (dict(near_check={"n4c64k32h16w16": 1.1}, lends_near=True), r"'n4c64k32h16w16' is not a shape this entry lends to"),
    (dict(near_check={"n4c32k32h16w16p0": 1.1}, lends_near=True), r"'n4c32k32h16w16p0' is not a shape this entry lends to"),
    (dict(near_check={KEY: 1.1}, lends_near=True), rf"'{KEY}' is not a shape this entry lends to"),
    (dict(near_check={HALF: 0}, lends_near=False), rf"'{HALF}' must be a positive finite JSON number"),
    (dict(near_check={HALF: "fast"}, lends_near=False), rf"'{HALF}' must be a positive finite JSON number"),
    (dict(near_check={HALF: True}, lends_near=False), rf"'{HALF}' must be a positive finite JSON number"),
    (dict(near_check={}, lends_near=True), r"'lends_near' is true but 'near_check' measured no near shape"),
    (dict(lends_near=True), r"'lends_near' is true but 'near_check' measured no near shape"),
    (dict(near_check={HALF: 1.2, THIRD: 0.97}, lends_near=True),
     rf"'lends_near' is true but {THIRD} ran slower .* \('near_check' 0.970 < 1\)"),
]


@pytest.mark.parametrize("fields, message", BAD_FIELDS)
def test_malformed_near_fields_are_a_one_line_error(fields, message, tmp_path, monkeypatch):
    table = _table()
    table["layers"][KEY].update(fields)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    with pytest.raises(ValueError) as info:
        choice.choose(ENTRY, "h100")
    text = str(info.value)
    assert "\n" not in text and text.startswith(f"{path}: layer '{KEY}': ")
    import re
    assert re.search(message, text), text


@pytest.mark.parametrize("fields", [{}, dict(lends_near=False), dict(near_check={HALF: 1.2}, lends_near=False),
                                    dict(near_check={HALF: 1.0, THIRD: 1.3}, lends_near=True)])
def test_well_formed_near_fields_are_accepted(fields):
    assert tuning.validate_table(_table(**fields), "t.json")


# ---- the runtime rule --------------------------------------------------------------------------

@pytest.mark.parametrize("fields, kind", [({}, "heuristic"), (dict(lends_near=False), "heuristic"),
                                          (dict(near_check={HALF: 1.3}, lends_near=False), "heuristic"),
                                          (dict(near_check={HALF: 1.3}, lends_near=True), "nearest")])
def test_only_an_entry_that_lends_lends(fields, kind, tmp_path, monkeypatch):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_table(**fields)))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    params, mapping, source = choice.choose(LayerSpec(5, 32, 32, 16, 16), "h100")
    assert source.kind == kind
    if kind == "nearest":
        assert (params, mapping, source.shape) == (*TUNED, KEY)


def test_a_farther_lending_entry_does_not_stand_in_for_the_nearest(tmp_path, monkeypatch):
    """The nearest shape decides: its entry lends or the heuristic runs; a farther entry that
    lends was never measured on the shape."""
    table = _table()
    far = LayerSpec(16, 32, 32, 16, 16)
    tuning.write_entry(table, far, *TUNED, time_us=1.0, near_check={"n8c32k32h16w16": 1.1}, lends_near=True)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    borrower = LayerSpec(6, 32, 32, 16, 16)
    assert choice.nearest_shape(borrower, table["layers"]) == KEY
    assert choice.choose(borrower, "h100")[2].kind == "heuristic"
    assert choice.choose(LayerSpec(14, 32, 32, 16, 16), "h100")[2].shape == far.shape_string


def test_retuning_an_entry_clears_its_measurement():
    """A re-tuned entry has new parameters: tune writes it without near_check or lends_near."""
    table = _table(near_check={HALF: 1.3}, lends_near=True)
    tuning.write_entry(table, ENTRY, *TUNED, time_us=0.9)
    assert not {"near_check", "lends_near"} & set(table["layers"][KEY])


# ---- the measurement's bookkeeping -----------------------------------------------------------

def _row(shape, ratio, equal=True, entry=KEY):
    return {"layer": "", "batch": 0, "shape": shape, "entry": entry, "heuristic_over_nearest": ratio,
            "bitwise_equal": equal}


@pytest.mark.parametrize("rows, lends", [
    ([_row(HALF, 1.1), _row(THIRD, 1.0)], True),
    ([_row(HALF, 1.1), _row(THIRD, 0.99)], False),
    ([_row(HALF, 1.1), _row(THIRD, 1.2, equal=False)], False),
    ([_row(HALF, 1.1), dict(_row(THIRD, None), error="too many tiles")], False),
    ([_row(HALF, 0.99996)], False),               # stored as 1.0, but it lost
])
def test_apply_rows_lends_only_where_every_shape_won(rows, lends):
    table = _table(near_check={"n2c32k32h16w16": 0.5}, lends_near=False)
    assert near.apply_rows(table, rows + [{"layer": "x", "batch": 1, "source": "tuned"}], "rows") == {KEY: lends}
    entry = table["layers"][KEY]
    assert entry["lends_near"] is lends
    # the rows replace the entry's measurement; a shape that could not plan has no ratio
    assert set(entry["near_check"]) == {r["shape"] for r in rows if "error" not in r}
    assert all(math.isclose(entry["near_check"][r["shape"]], r["heuristic_over_nearest"], abs_tol=1e-4)
               for r in rows if "error" not in r)
    tuning.validate_table(table, "t.json")


@pytest.mark.parametrize("rows, message", [
    ([_row(HALF, 1.1, entry="n8c16k16h16w16")], r"rows: row 0: the table has no entry 'n8c16k16h16w16'"),
    ([_row("n4c32k64h16w16", 1.1)], r"row 0: n4c32k64h16w16 is not near entry " + KEY),
    ([_row(HALF, 1.1), _row(HALF, 1.2)], rf"row 1: {HALF} measured twice"),
    ([_row(HALF, -1.0)], r"row 0: 'heuristic_over_nearest' must be a positive number"),
    ([_row(HALF, 1.1, equal="yes")], r"row 0: 'bitwise_equal' must be true or false"),
    ([dict(_row(HALF, 1.1), shape=None, layer="nonet.x")], r"row 0: no shape from 'shape' or 'layer'"),
    ([dict(entry=KEY, layer="resnet50.conv2_x")], r"row 0: no shape from 'shape' or 'layer' and 'batch'"),
    (["row"], r"row 0: expected a JSON object, got str"),
])
def test_apply_rows_refuses_rows_it_cannot_place(rows, message):
    with pytest.raises(ValueError, match=message):
        near.apply_rows(_table(), rows, "rows")


def test_a_row_names_its_shape_or_a_layer_at_a_batch():
    table = {"layers": {}}
    entry = find_layer("resnet50.conv2_x", 64)
    tuning.write_entry(table, entry, *TUNED, time_us=1.0)
    near.apply_rows(table, [{"layer": "resnet50.conv2_x", "batch": 32, "entry": "n64c64k64h56w56",
                             "heuristic_over_nearest": 1.2, "bitwise_equal": True}], "rows")
    assert table["layers"]["n64c64k64h56w56"]["near_check"] == {"n32c64k64h56w56": 1.2}


def test_borrowers_are_the_layer_at_half_and_a_third_of_its_batch():
    assert [s.N for s in near.borrower_specs(find_layer("resnet50.conv2_x", 64))] == [32, 20]
    assert [s.N for s in near.borrower_specs(LayerSpec(2, 8, 8, 8, 8))] == [1]
    assert near.borrower_specs(LayerSpec(1, 8, 8, 8, 8)) == []
    for n in range(2, 300):        # every one is near its batch-n layer
        spec = LayerSpec(n, 8, 8, 8, 8)
        assert all(choice.is_near(b, spec.shape_string) for b in near.borrower_specs(spec))


# ---- the shipped tables ------------------------------------------------------------------------

def test_the_shipped_h200_flags_are_the_committed_measurement():
    """h200.json's near_check and lends_near are what bench/results/h200/near-check.json gives
    (applying it again changes nothing); an entry lends exactly where every shape borrowing from
    it ran at least as fast as with the heuristic, and h100.json, never checked, lends nothing."""
    shipped = tuning.read_table(mapping_dir() / "h200.json")
    again = copy.deepcopy(shipped)
    lends = near.apply_file(again, RESULTS)
    assert again == shipped
    rows = json.loads(RESULTS.read_text())["rows"]
    for entry, lent in lends.items():
        ratios = [r["heuristic_over_nearest"] for r in rows if r.get("entry") == entry]
        assert lent == (min(ratios) >= 1.0)
    assert sum(lends.values()) == 8 and len(lends) == 17
    assert not any(choice.lends(e) for e in tuning.read_table(mapping_dir() / "h100.json")["layers"].values())
    with pytest.raises(ValueError, match="measured on h200, but the table is h100's"):
        near.apply_file(tuning.read_table(mapping_dir() / "h100.json"), RESULTS)


def test_on_the_measured_shapes_the_shipped_tables_never_lend_a_loser():
    """Every suite layer at batch 32 and 20 (the measurement's rows) takes on an H200 either the
    heuristic or the entry it was measured with, which won there; on an H100 the heuristic."""
    h200, h100 = identity.identity_for_key("h200"), identity.identity_for_key("h100")
    rows = json.loads(RESULTS.read_text())["rows"]
    borrowed = []
    for row in rows:
        spec = find_layer(row["layer"], row["batch"])
        source = choice.choose_for_gpu(spec, h200, "3xtf32")[2]
        assert source.kind in ("nearest", "heuristic")
        if source.kind == "nearest":
            assert source.shape == row["entry"] and row["heuristic_over_nearest"] >= 1.0
            borrowed.append(row["heuristic_over_nearest"])
        assert choice.choose_for_gpu(spec, h100, "3xtf32")[2].kind == "heuristic"
    assert len(borrowed) == 19


# ---- the measurement, GPU timing replaced --------------------------------------------------

@pytest.fixture
def checker(monkeypatch, tmp_path):
    """A GPU (an H100) whose shipped table holds ENTRY, with measure_pair timing the lent
    parameters at ``checker.times[shape]`` (nearest_us, heuristic_us, bitwise_equal)."""
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "h100.json").write_text(json.dumps(_table()))
    monkeypatch.setattr(tuning, "mapping_dir", lambda: shipped)
    monkeypatch.setattr(runtime, "gpu_available", lambda: True)
    monkeypatch.setattr(identity, "current_identity",
                        lambda: identity.identity_of("NVIDIA H100 80GB HBM3", "90", sms=132))

    class Checker:
        times = {HALF: (10.0, 11.0, True), THIRD: (8.0, 8.5, True)}
        measured: list = []
        shipped_path = shipped / "h100.json"

    def measure_pair(plans, spec, configs, reps, rounds):
        assert configs["nearest"] == (TUNED[0], TUNED[1]) and configs["nearest"] != configs["heuristic"]
        Checker.measured.append(spec.shape_string)
        lent, heuristic, equal = Checker.times[spec.shape_string]
        return {"nearest_us": lent, "heuristic_us": heuristic, "bitwise_equal": equal}
    monkeypatch.setattr(near, "measure_pair", measure_pair)
    return Checker


@pytest.mark.parametrize("times, lends", [({}, True), ({THIRD: (9.0, 8.5, True)}, False),
                                          ({HALF: (10.0, 11.0, False)}, False)])
def test_check_near_writes_the_flags_into_the_user_table(checker, times, lends):
    checker.times = dict(checker.times, **times)
    before = checker.shipped_path.read_bytes()
    seen = []
    table = near.check_near([ENTRY.with_(name="layer")], on_row=seen.append)
    assert checker.measured == [HALF, THIRD] and [r["shape"] for r in seen] == [HALF, THIRD]
    assert seen[0]["layer"] == "layer" and seen[0]["batch"] == 4
    path = tuning.user_table_path("h100")
    assert table["path"] == str(path) and table["checked"] == [KEY]
    written = tuning.read_table(path)["layers"][KEY]
    assert written["lends_near"] is lends and set(written["near_check"]) == {HALF, THIRD}
    assert written["near_check"][HALF] == round(checker.times[HALF][1] / checker.times[HALF][0], 4)
    assert written["params"] == json.loads(before)["layers"][KEY]["params"]
    assert checker.shipped_path.read_bytes() == before
    assert [p.name for p in path.parent.iterdir()] == ["h100.json"]       # no temporary file left
    # plans now borrow the entry on the user's GPU only where it lends
    kind = choice.choose_for_gpu(LayerSpec(5, 32, 32, 16, 16), identity.current_identity(), "3xtf32")[2].kind
    assert kind == ("nearest" if lends else "heuristic")


def test_check_near_times_nothing_where_the_lent_parameters_are_the_heuristics(checker, tmp_path):
    borrower = ENTRY.with_(N=3)
    params = default_params(borrower)
    table = {"layers": {}}
    tuning.write_entry(table, ENTRY, params, tuning.default_mapping_params(Layout(borrower, params)), time_us=1.0)
    checker.shipped_path.write_text(json.dumps(table))
    out = tmp_path / "out.json"
    # batch 5 at 3 and 2: batch 3 borrows from the batch-8 entry, batch 2 is too far from it
    result = near.check_near([ENTRY.with_(N=5)], out_path=out)
    assert checker.measured == [] and [(r["shape"], r["heuristic_over_nearest"]) for r in result["rows"]] == \
        [("n3c32k32h16w16", 1.0)]
    assert tuning.read_table(out)["layers"][KEY]["lends_near"] is True


def test_check_near_refuses_without_a_gpu_or_a_borrower(checker, monkeypatch):
    with pytest.raises(ValueError, match="no shape of the target at batch N/2 or N/3.2 borrows from the h100 table"):
        near.check_near([LayerSpec(8, 16, 16, 16, 16)])
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    with pytest.raises(ValueError, match="--check-near measures on the GPU"):
        near.check_near([ENTRY])
    assert not tuning.user_table_path("h100").exists()


def _cli(argv):
    out = Console(width=120, record=True, file=io.StringIO(), color_system=None)
    err = Console(width=120, record=True, file=io.StringIO(), color_system=None)
    return main(argv, console=out, err_console=err), out.export_text(), err.export_text()


def test_tune_check_near_command(checker, monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "gpu_status", lambda: (runtime, ""))
    out_path = tmp_path / "checked.json"
    code, out, err = _cli(["tune", KEY, "--check-near", "--reps", "2", "--out", str(out_path)])
    assert code == 0, err
    assert f"{HALF} <- {KEY}: heuristic 11.0 us, lent 10.0 us, ×1.100" in err
    assert "1 of 1 entries lend" in out and f"wrote {out_path}" in out
    assert tuning.read_table(out_path)["layers"][KEY]["lends_near"] is True


@pytest.mark.parametrize("argv, message", [
    (["--budget", "5"], "--check-near times the table's entries as they are; --budget and --top are for tuning"),
    (["--top", "2"], "--budget and --top are for tuning"),
    ([], "--check-near measures on the GPU: no GPU found"),
])
def test_tune_check_near_refusals(argv, message, monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "gpu_status", lambda: (None, "no GPU found"))
    monkeypatch.setattr(near, "check_near", lambda *a, **k: pytest.fail("the work started"))
    code, _, err = _cli(["tune", "resnet50.conv2_x", "--check-near", "--out", str(tmp_path / "t.json")] + argv)
    assert code == 2 and message in " ".join(err.split())
    assert not (tmp_path / "t.json").exists()
