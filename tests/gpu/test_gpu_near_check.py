"""GPU test of ``megawino tune --check-near`` (megawino.tuning.near) on one small layer."""
from __future__ import annotations

import json

import pytest

from megawino.core.spec import LayerSpec
from megawino.core.tasks import TaskParams
from megawino.schedule.mapping import MappingParams
from megawino.tuning import choice, near, table as tuning

pytestmark = pytest.mark.gpu

ENTRY = LayerSpec(8, 32, 40, 14, 14)
BORROWERS = ["n4c32k40h14w14", "n3c32k40h14w14"]


def test_check_near_times_a_small_entry_and_writes_its_flags(tmp_path, monkeypatch):
    """The entry's parameters lent to its layer at batch 4 and 3 plan, run with outputs bitwise
    equal to the heuristic's, are timed, and set lends_near exactly where no ratio is below 1;
    the command writes the same fields."""
    table = {"layers": {}}
    tuning.write_entry(table, ENTRY, TaskParams(tiles_per_group=64, input_channels_per_task=16, gemm_k_per_task=32,
                                                output_k_per_task=16), MappingParams(4, 4, 1), time_us=1.0)
    source = tmp_path / "table.json"
    source.write_text(json.dumps(table))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(source))
    out = tmp_path / "checked.json"
    rows = near.check_near([ENTRY], out_path=out, reps=3)["rows"]
    assert [r["shape"] for r in rows] == BORROWERS
    for row in rows:
        assert "error" not in row and not row.get("same_parameters"), row
        assert row["bitwise_equal"] is True, f"the lent parameters changed the output's bits: {row}"
        assert row["nearest_us"] > 0 and row["heuristic_us"] > 0
        assert row["heuristic_over_nearest"] == pytest.approx(row["heuristic_us"] / row["nearest_us"])
    written = tuning.read_table(out)["layers"][ENTRY.shape_string]
    assert written["lends_near"] is all(r["heuristic_over_nearest"] >= 1.0 for r in rows)
    assert set(written["near_check"]) == set(BORROWERS)
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(out))
    kind = choice.choose(LayerSpec(4, 32, 40, 14, 14), "any")[2].kind
    assert kind == ("nearest" if written["lends_near"] else "heuristic")

    from megawino.cli import main
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(source))
    assert main(["tune", ENTRY.shape_string, "--check-near", "--reps", "2", "--out", str(tmp_path / "cli.json")]) == 0
    assert set(tuning.read_table(tmp_path / "cli.json")["layers"][ENTRY.shape_string]["near_check"]) == set(BORROWERS)
