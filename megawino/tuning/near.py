"""Which tuned entries lend their parameters to near shapes (``megawino tune --check-near``).

A shape the tables lack borrows the parameters of its nearest tuned shape
(:func:`megawino.tuning.choice.nearest_shape`) only where that entry's ``lends_near`` is true:
measured on the GPU not to run slower than the heuristic on the shapes that borrow from it.

* :func:`check_near` takes the target's layers at batch N/2 and N/3.2 (:func:`borrower_specs`:
  tile counts 1/2 and 1/3.2 of the tuned batch's), finds the entry of this GPU's table each one
  borrows from (its nearest shape, whether or not it lends today), and times the entry's lent
  parameters against the heuristic's on it: both plans' outputs compared bit for bit on one
  input (poisoned first), then ``rounds`` alternating passes whose medians decide, as in the
  tuner's confirmation (:func:`megawino.tuning.search.confirm`).
* :func:`apply_rows` writes such measurements into a table: ``near_check`` (borrowing shape ->
  heuristic time / lent time) and ``lends_near`` (at least one shape measured, every ratio at
  least 1, every output bitwise equal to the heuristic's).  The command and a measurement file
  (``python -m megawino.tuning.near RESULTS TABLE``) both go through it.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import math
import pathlib

import numpy as np

from . import choice, search, table as tuning
from ..core import json_files, user_files
from ..core.spec import LayerSpec, parse_shape
from ..gpu import identity as gpu_identity
from ..gpu.nvrtc import DEFAULT_GEMM_MATH, gemm_output_tasks_allowed

# The borrowers timed: each layer at batch N / 2 and N / 3.2 (rounded up), the tile counts a
# batch-64 table lends to at batches 32 and 20.
BORROWER_BATCH_DIVISORS = (2.0, 3.2)


def borrower_specs(spec: LayerSpec) -> list[LayerSpec]:
    """``spec`` at the smaller batches :func:`check_near` times (:data:`BORROWER_BATCH_DIVISORS`),
    largest first; none for a batch of 1."""
    batches = sorted({math.ceil(spec.N / d) for d in BORROWER_BATCH_DIVISORS} - {spec.N}, reverse=True)
    return [spec.with_(N=n) for n in batches]


def measure_pair(plans, spec: LayerSpec, configs: dict, reps: int, rounds: int) -> dict:
    """GPU times (us, medians of ``rounds`` alternating passes) of the plans of ``spec`` with
    ``configs["nearest"]`` and ``configs["heuristic"]`` ((TaskParams, MappingParams) each), and
    whether their outputs are bitwise equal; ``plans`` makes the plans (the runtime of one GEMM
    arithmetic)."""
    import cupy
    from ..gpu.timing import rotated_inputs, time_cuda_stats
    xs, w = rotated_inputs(spec, np.random.default_rng(0))
    made = {name: plans.plan(spec, params=p, mapping=mp) for name, (p, mp) in configs.items()}
    outs = {}
    for name, plan in made.items():
        # NaN-poisoned: an element a plan never writes cannot compare equal
        outs[name] = cupy.full(spec.output_shape, cupy.nan, dtype=cupy.float32)
        plan(xs[0], w, out=outs[name])
    equal = bool((outs["nearest"] == outs["heuristic"]).all())

    def measure(name):
        plan, out = made[name], outs[name]
        return time_cuda_stats(lambda x: plan(x, w, out=out, check=False), xs, warmup=3, reps=reps,
                               check=plan.check)["median_us"]
    times = search.confirm(measure, list(made), rounds)
    del made, outs, xs, w
    cupy.get_default_memory_pool().free_all_blocks()     # the next shape may be the largest
    return {"nearest_us": times["nearest"], "heuristic_us": times["heuristic"], "bitwise_equal": equal}


def check_entry(plans, entry_shape: str, entry: dict, borrowers, fused_output: bool, reps: int = 10,
                rounds: int = 3, on_row=None) -> list[dict]:
    """One row per shape of ``borrowers`` (LayerSpecs whose nearest tuned shape is
    ``entry_shape``): the entry's lent parameters (:func:`megawino.tuning.choice.lent_params`)
    against the heuristic's (:func:`measure_pair`; a ratio of 1 untimed where they are the same
    parameters, an ``error`` where the lent ones cannot plan the shape)."""
    rows = []
    for borrower in borrowers:
        lent = choice.lent_params(entry, borrower, fused_output)
        heuristic = choice.choose_in(borrower, [], m=entry["params"]["m"], fused_output=fused_output)[:2]
        row = {"layer": borrower.name, "batch": borrower.N,
               "shape": borrower.with_(layout="NCHW", name="").shape_string, "entry": entry_shape}
        if lent == heuristic:
            row.update(same_parameters=True, bitwise_equal=True, heuristic_over_nearest=1.0)
        else:
            try:
                row.update(measure_pair(plans, borrower, {"nearest": lent, "heuristic": heuristic}, reps, rounds))
                row["heuristic_over_nearest"] = row["heuristic_us"] / row["nearest_us"]
            except (ValueError, MemoryError) as err:      # lent parameters this shape cannot take
                row["error"] = " ".join(str(err).split()) or type(err).__name__
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


def borrowed_entries(specs, layers: dict) -> dict:
    """Entry shape of ``layers`` -> the :func:`borrower_specs` of ``specs`` (each shape once) that
    borrow from it: those without an entry of their own whose nearest tuned shape it is."""
    borrowed: dict = {}
    seen = set(layers)
    for spec in specs:
        for borrower in borrower_specs(spec):
            shape = borrower.with_(layout="NCHW", name="").shape_string
            if shape in seen:
                continue
            seen.add(shape)
            entry = choice.nearest_shape(borrower, layers)
            if entry is not None:
                borrowed.setdefault(entry, []).append(borrower)
    return borrowed


def _row_fields(row, where: str) -> tuple[str, str, float | None, bool]:
    """(entry shape, borrowing shape, heuristic / lent ratio or None, lends) of a result row; the
    borrowing shape is the row's ``shape``, else its ``layer`` (a network layer name) at ``batch``."""
    from ..core.networks import find_layer
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    entry = row["entry"]
    if not isinstance(entry, str):
        raise ValueError(f"{where}: 'entry' must be a shape string, got {entry!r:.40}")
    try:
        if "shape" in row:
            shape = parse_shape(str(row["shape"])).shape_string
        else:
            shape = find_layer(row.get("layer"), row.get("batch")).with_(name="").shape_string
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: no shape from 'shape' or 'layer' and 'batch' ({err})") from None
    if "error" in row:
        return entry, shape, None, False
    ratio, equal = row.get("heuristic_over_nearest"), row.get("bitwise_equal")
    if not tuning.json_value_ok(ratio, float) or not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"{where}: 'heuristic_over_nearest' must be a positive number, got {ratio!r:.40}")
    if not isinstance(equal, bool):
        raise ValueError(f"{where}: 'bitwise_equal' must be true or false, got {equal!r:.40}")
    return entry, shape, float(ratio), ratio >= 1.0 and equal


def apply_rows(table: dict, rows, source) -> dict:
    """Set ``near_check`` and ``lends_near`` of every entry of ``table`` that ``rows`` measured
    (rows without ``entry``, layers that borrowed nothing, are skipped), replacing what it held:
    the rows measure its parameters as they are now.  Returns entry shape -> lends_near; a row
    naming an entry the table lacks, a shape not near it, or one shape twice is a ValueError."""
    measured: dict = {}
    for i, row in enumerate(rows):
        if isinstance(row, dict) and "entry" not in row:
            continue
        where = f"{source}: row {i}"
        entry, shape, ratio, lends = _row_fields(row, where)
        if entry not in table["layers"]:
            raise ValueError(f"{where}: the table has no entry {entry!r}")
        if not choice.is_near(parse_shape(shape), entry):
            raise ValueError(f"{where}: {shape} is not near entry {entry} (choice.is_near)")
        if shape in measured.setdefault(entry, {}):
            raise ValueError(f"{where}: {shape} measured twice for entry {entry}")
        measured[entry][shape] = (ratio, lends)
    for entry, shapes in measured.items():
        layer = table["layers"][entry]
        # rounded for the file; lends_near comes from the unrounded ratios
        layer["near_check"] = {s: round(r, 4) for s, (r, _) in shapes.items() if r is not None}
        layer["lends_near"] = all(lends for _, lends in shapes.values())
    return {entry: table["layers"][entry]["lends_near"] for entry in measured}


def apply_file(table: dict, path) -> dict:
    """:func:`apply_rows` of a measurement file (``{"gpu": key, "rows": [...]}``, e.g.
    ``bench/results/h200/near-check.json``); one measured on another GPU than the table's is a
    ValueError."""
    data = json_files.read_json(path, "near-check result")
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{path}: not a near-check result (no 'rows' list)")
    if data.get("gpu") and table.get("key") and data["gpu"] != table["key"]:
        raise ValueError(f"{path}: measured on {data['gpu']}, but the table is {table['key']}'s")
    return apply_rows(table, data["rows"], path)


def check_near(specs, out_path=None, gemm_math: str | None = None, reps: int = 10, rounds: int = 3,
               m: int = 4, on_start=None, on_row=None) -> dict:
    """Time every entry of this GPU's table (plans of ``gemm_math``,
    :func:`megawino.tuning.choice.table_layers`) that :func:`borrower_specs` of ``specs`` borrow
    from (:func:`borrowed_entries`, :func:`check_entry`) and write it with its ``near_check`` and
    ``lends_near`` into the table at ``out_path`` (default: the user's tuned table, as
    ``megawino tune``), atomically as each is done.  Returns that table plus ``path``, ``rows``
    and ``checked`` (the entries measured)."""
    from .. import runtime
    if not runtime.gpu_available():
        raise ValueError("--check-near measures on the GPU: no GPU found")
    gemm_math = gemm_math or DEFAULT_GEMM_MATH
    gpu = gpu_identity.current_identity()
    key = tuning.table_key(gpu.key, gemm_math)
    path = pathlib.Path(out_path) if out_path else tuning.user_table_path(key)
    table = tuning.table_for_update(path)
    user_files.check_writable(path)
    layers = {s: v for s, v in choice.table_layers(key).items() if v[0]["params"]["m"] == m}
    borrowed = borrowed_entries(specs, layers)
    if not borrowed:
        raise ValueError(f"no shape of the target at batch N/2 or N/3.2 borrows from the {key} table "
                         f"({len(layers)} entries): nothing to check")
    table.update(gpu=gpu.name, key=key,
                 updated=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    plans = search._GemmMathRuntime(runtime, gemm_math)
    rows = []
    for i, (shape, borrowers) in enumerate(borrowed.items()):
        entry = copy.deepcopy(layers[shape][0])
        if on_start:
            on_start(i, len(borrowed), shape, entry)
        entry_rows = check_entry(plans, shape, entry, borrowers, gemm_output_tasks_allowed(gemm_math),
                                 reps, rounds, on_row)
        table["layers"][shape] = entry
        apply_rows(table, entry_rows, "the measurement")
        tuning.write_table(path, table)
        rows += entry_rows
    return dict(table, path=str(path), rows=rows, checked=list(borrowed))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megawino.tuning.near", description=(
        "Set near_check and lends_near in a tuned table from a near-check result file."))
    parser.add_argument("results", help="the result file ({'gpu': key, 'rows': [...]})")
    parser.add_argument("table", help="the mapping table to update")
    parser.add_argument("--out", default=None, help="write the table here (default: TABLE itself)")
    args = parser.parse_args(argv)
    table = tuning.read_table(args.table)
    lends = apply_file(table, args.results)
    tuning.write_table(args.out or args.table, table)
    for entry, lent in lends.items():
        ratios = ", ".join(f"{s} {r:.3f}" for s, r in table["layers"][entry]["near_check"].items())
        print(f"{entry}: {'lends' if lent else 'does not lend'} ({ratios})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
