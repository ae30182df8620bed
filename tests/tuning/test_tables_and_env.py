"""Tables and the environment refuse what the runtime cannot use, in one line naming the file or
the variable: rings smaller than the entry's order allows, bools as numbers, NaN and infinities,
huge integers, deep nesting; out-of-range cache sizes and watchdog limits. Graph invariants are
exceptions, not asserts."""
from __future__ import annotations

import ast
import copy
import io
import json
import pathlib

import numpy as np
import pytest
from rich.console import Console

from megawino import runtime
from megawino.cli import main
from megawino.core import json_files
from megawino.core.task_graph import TaskGraph
from megawino.core.task_sizes import build_graph, default_params
from megawino.core.spec import LayerSpec
from megawino.gpu import call_checks, weights
from megawino.schedule.mapping import build_interleaved, ring_buffer_groups
from megawino.tuning import table as tuning

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = json.loads((REPO / "mapping" / "h100.json").read_text())
KEY = "n64c64k64h56w56"


def _table(change=None) -> dict:
    data = {"layers": {KEY: copy.deepcopy(SHIPPED["layers"][KEY])}}
    if change:
        change(data["layers"][KEY])
    return data


def _fewest_ring() -> int:
    spec, params, mapping = tuning.entry_objects(KEY, _table()["layers"][KEY])
    whole = build_graph(spec, params)
    return ring_buffer_groups(whole, build_interleaved(whole, mapping).order)


# ---- tables ------------------------------------------------------------------

def test_ring_smaller_than_the_order_allows_refused():
    fewest = _fewest_ring()
    assert 1 < fewest
    for groups in (1, fewest - 1):
        with pytest.raises(ValueError, match=rf"x.json: layer '{KEY}': params.buffer_groups={groups} "
                                             rf"is a smaller ring .*at least {fewest} of"):
            tuning.validate_table(_table(lambda e: e["params"].update(buffer_groups=groups)), "x.json")
    for groups in (fewest, fewest + 3):            # the rings the order allows pass
        tuning.validate_table(_table(lambda e: e["params"].update(buffer_groups=groups)), "x.json")


def test_mapping_command_refuses_a_table_with_a_ring_too_small(tmp_path, monkeypatch, capsys):
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(_table(lambda e: e["params"].update(buffer_groups=1))))
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    tuning._load.cache_clear()
    code = main(["mapping", KEY], console=Console(file=io.StringIO(), width=100))
    err = capsys.readouterr().err
    assert code == 2 and "buffer_groups=1" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("field", ["time_us", "candidates_measured", "N"])
def test_a_bool_is_not_a_number(field):
    """True == 1 in Python: without the rule, "N": true would pass as the batch of 1 the key says,
    and true as a time or a count."""
    if field == "N":
        data = _table(lambda e: e.update(spec={**e["spec"], "N": True}))
        data["layers"]["n1c64k64h56w56"] = data["layers"].pop(KEY)
    else:
        data = _table(lambda e: e.update({field: True}))
    with pytest.raises(ValueError, match=rf"'{field}' must be a JSON (number|integer), got True"):
        tuning.validate_table(data, "x.json")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_refused(value):
    with pytest.raises(ValueError, match="'time_us' must be a finite JSON number"):
        tuning.validate_table(_table(lambda e: e.update(time_us=value)), "x.json")


def test_huge_integers_refused():
    with pytest.raises(ValueError, match="'candidates_measured' must be a JSON integer within int32"):
        tuning.validate_table(_table(lambda e: e.update(candidates_measured=10 ** 12)), "x.json")


@pytest.mark.parametrize("text, words", [
    ('{"layers": {}, "updated": NaN}', "NaN is not a number"),
    ('{"layers": {}, "updated": -Infinity}', "-Infinity is not a number"),
    ('{"layers": {}, "updated": 1e999}', "overflows a float"),
    ('{"layers": {}, "updated": 1' + "0" * 40 + "}", "41 digits"),
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    ('{"layers": ', "Expecting value"),
])
def test_table_files_refused_in_one_line(tmp_path, text, words):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        tuning.read_table(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: not a JSON mapping table") and words in message
    assert "\n" not in message


def test_deep_nesting_through_the_command_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    monkeypatch.setenv(tuning.ENV_OVERRIDE, str(path))
    tuning._load.cache_clear()
    code = main(["mapping", KEY], console=Console(file=io.StringIO(), width=100))
    err = capsys.readouterr().err
    assert code == 2 and "nested too deeply" in err and "Traceback" not in err


def test_other_json_readers_share_the_rule(tmp_path):
    from megawino.core.suite import load_suite
    from megawino.direct.model import _load_mapping_cached
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    for read in (lambda: load_suite(path), lambda: _load_mapping_cached(str(path), 0.0)):
        with pytest.raises(ValueError, match="nested too deeply"):
            read()
    assert json_files.loads('{"a": [1, 2.5]}', "s", "t") == {"a": [1, 2.5]}


# ---- environment -------------------------------------------------------------

@pytest.mark.parametrize("raw", ["99999999999999999999", "0", "-3", "1.5", "many", "nan"])
def test_plan_cache_size_out_of_range(monkeypatch, raw):
    monkeypatch.setenv(runtime.ENV_PLAN_CACHE, raw)
    with pytest.raises(ValueError, match=rf"MEGAWINO_PLAN_CACHE must be a whole number from 1 to "
                                         rf"{runtime.PLAN_CACHE_MAX}, got '{raw}'"):
        runtime._plan_cache_limit()


def test_weight_cache_size_out_of_range(monkeypatch):
    monkeypatch.setenv(weights.ENV_LIMIT, "9" * 30)
    with pytest.raises(ValueError, match="MEGAWINO_WEIGHT_CACHE_MB must be a whole number from 0 to"):
        weights.limit_bytes()


@pytest.mark.parametrize("raw", ["1e10", "1e-300", "0", "1e-4", "1e7", "inf", "nan", "-2"])
def test_watchdog_seconds_out_of_range(monkeypatch, raw):
    """1e10 s overflows the kernel's int64 nanoseconds; 1e-300 s is 0 ns."""
    monkeypatch.setenv(call_checks.ENV_WATCHDOG, raw)
    with pytest.raises(ValueError, match=rf"MEGAWINO_WATCHDOG_S must be a number from 0.001 to 1e\+06, "
                                         rf"got '{raw}'"):
        call_checks.default_timeout_s()


@pytest.mark.parametrize("raw, seconds", [("0.001", 1e-3), ("2", 2.0), (" 60 ", 60.0), ("1e6", 1e6)])
def test_watchdog_seconds_in_range(monkeypatch, raw, seconds):
    monkeypatch.setenv(call_checks.ENV_WATCHDOG, raw)
    assert call_checks.default_timeout_s() == seconds
    assert int(round(seconds * 1e9)) < np.iinfo(np.int64).max and int(round(seconds * 1e9)) > 0


@pytest.mark.parametrize("value", [1e10, 1e-300, 0, True, float("nan"), "2"])
def test_timeout_argument_has_the_same_range(value):
    with pytest.raises(ValueError, match="timeout_s must be a number from 0.001 to 1e\\+06 seconds"):
        call_checks.check_timeout_s(value)
    assert call_checks.check_timeout_s(np.float32(0.5)) == 0.5


# ---- invariants --------------------------------------------------------------

def test_build_graph_invariant_is_an_exception(monkeypatch):
    spec = LayerSpec(1, 8, 8, 8, 8)
    real = TaskGraph.__dict__["counter_need"].func
    monkeypatch.setattr(TaskGraph, "counter_need", property(lambda self: real(self) + 1))
    with pytest.raises(RuntimeError, match="build_graph: the need_a written into the records differ"):
        build_graph(spec, default_params(spec, 4))


def test_no_bare_assert_in_the_package():
    """Checks the package relies on must hold under python -O: no assert statements."""
    found = []
    for path in sorted((REPO / "megawino").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assert):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found
