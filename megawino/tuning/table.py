"""Tuned parameter tables (``mapping/<gpu>.json``): their schema, reading, validation and
writing.  Which entry a plan uses is :mod:`megawino.tuning.choice`; the tuner's search space is
:mod:`megawino.tuning.space`; which GPU this is, :mod:`megawino.gpu.identity`.

Tables, in order: ``MEGAWINO_MAPPING=path`` alone when set; else the user's tuned table
(``<cache>/<gpu>.json``, :mod:`megawino.core.user_files`; written by ``megawino tune``) whose
entries take precedence over the shipped read-only table (``mapping/<gpu>.json``).

Every table is checked against the schema on load (:func:`validate_table`): known keys only,
``spec`` / ``params`` / ``mapping`` in every entry, TaskParams and MappingParams within their
bounds (``megawino.core.tasks.TASK_PARAM_LIMITS``, int32 ticket distances), the layer's sizes
within the kernels' int32 limits, and the optional near-shape measurement (:func:`check_near_fields`:
``near_check``, heuristic time / lent time per near shape, and ``lends_near``, true only where
every one of them is at least 1); a bad entry is a ValueError naming the file and the entry.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib

from ..core import json_files, user_files
from ..schedule.mapping import MappingParams, build_interleaved, ring_buffer_groups
from ..core.resources import mapping_dir
from ..core.spec import LayerSpec, parse_shape
from ..core.task_sizes import DEFAULT_WORKERS, build_graph, check_size
from ..core.tasks import Layout, TaskParams

ENV_OVERRIDE = "MEGAWINO_MAPPING"

# The table schema: top-level keys and entry keys with their JSON types (float: any number).
TABLE_FIELDS = {"layers": dict, "gpu": str, "key": str, "updated": str, "method": str}
ENTRY_REQUIRED = ("spec", "params", "mapping")
ENTRY_FIELDS = {
    "spec": dict, "params": dict, "mapping": dict, "name": str, "sequential_order": bool,
    "candidates_measured": int, "confirm_rounds": int, "time_us": float, "default_us": float,
    "sequential_us": float, "speedup_vs_default": float, "speedup_vs_sequential": float,
    "trace_makespan_us": float, "simulated_makespan_us": float, "simulator_error": float,
    "near_check": dict, "lends_near": bool,
}
SPEC_FIELDS = ("N", "C", "K", "H", "W")
# A table entry's "mapping" keys are the paper's names (DIG, DGO, M as "m"); MappingParams spells
# M out as groups_per_column (m is the Winograd tile size in code).
MAPPING_KEYS = {"dig": "dig", "dgo": "dgo", "m": "groups_per_column"}
MAPPING_FIELDS = tuple(MAPPING_KEYS)
PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(TaskParams))
# Tables written before TaskParams had buffer_groups (no ring) or fused_output (GEMM and output
# tasks) stay valid.
PARAM_REQUIRED = tuple(name for name in PARAM_FIELDS if name not in ("buffer_groups", "fused_output"))


# GEMM arithmetics whose GEMM tasks run at speeds of their own get a table of their own,
# "<gpu>-<gemm_math>"; the others use the GPU's table, which is tuned for the default arithmetic.
OWN_TABLE_GEMM_MATHS = ("bf16x3",)


def table_key(gpu: str, gemm_math: str) -> str:
    """The table key of GPU key ``gpu`` for plans of ``gemm_math``."""
    return f"{gpu}-{gemm_math}" if gemm_math in OWN_TABLE_GEMM_MATHS else gpu


def shipped_table_path(key: str) -> pathlib.Path:
    """The read-only table shipped in the package for GPU ``key``."""
    return mapping_dir() / f"{key}.json"


def user_table_path(key: str) -> pathlib.Path:
    """The user's tuned table for GPU ``key`` (where ``megawino tune`` writes by default)."""
    return user_files.user_table_path(f"{key}.json")


# JSON names of the Python types the schemas use (float: any number).
JSON_TYPE_NAMES = {dict: "object", list: "array", str: "string", float: "number", int: "integer",
                   bool: "boolean"}


# Integers in a table are sizes, counts and ticket distances the kernels hold in int32.
JSON_INT_MAX = 2**31 - 1


def json_value_ok(value, json_type) -> bool:
    """Whether ``value`` (parsed JSON) is of schema type ``json_type``; a bool is no number."""
    if json_type in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if json_type is float else json_type)


def check_object(obj, fields: dict, required, what: str, nullable=()) -> None:
    """ValueError (starting with ``what``) unless ``obj`` is a JSON object with only the keys of
    ``fields``, every key of ``required``, and each value of its type (``fields[key]``; None:
    checked elsewhere), or null for the keys in ``nullable``."""
    if not isinstance(obj, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise ValueError(f"{what}: unknown key {unknown[0]!r} (known: {', '.join(fields)})")
    missing = [k for k in required if k not in obj]
    if missing:
        raise ValueError(f"{what}: missing {missing[0]!r}")
    for key, value in obj.items():
        json_type = fields[key]
        if json_type is None or (value is None and key in nullable):
            continue
        if not json_value_ok(value, json_type):
            raise ValueError(f"{what}: {key!r} must be a JSON {JSON_TYPE_NAMES[json_type]}, got {value!r:.40}")
        # and one the runtime can use: a finite number, an integer within int32
        if not (math.isfinite(value) if json_type is float else json_type is not int or abs(value) <= JSON_INT_MAX):
            raise ValueError(f"{what}: {key!r} must be a {'finite ' if json_type is float else ''}JSON "
                             f"{JSON_TYPE_NAMES[json_type]}{' within int32' if json_type is int else ''}, "
                             f"got {value!r:.40}")


def mapping_from_entry(obj: dict) -> MappingParams:
    """The MappingParams of a table entry's ``mapping`` object (keys checked by the caller)."""
    return MappingParams(**{MAPPING_KEYS[key]: value for key, value in obj.items()})


def mapping_to_entry(mapping: MappingParams) -> dict:
    return {key: getattr(mapping, field) for key, field in MAPPING_KEYS.items()}


def entry_objects(key: str, entry) -> tuple[LayerSpec, TaskParams, MappingParams]:
    """The layer, task and mapping parameters of table entry ``key``, or a ValueError (one line,
    naming the entry) when the entry does not follow the schema."""
    where = f"layer {key!r}"
    check_object(entry, ENTRY_FIELDS, ENTRY_REQUIRED, where)
    check_object(entry["spec"], dict.fromkeys(SPEC_FIELDS, int), SPEC_FIELDS, f"{where}: 'spec'")
    check_object(entry["mapping"], dict.fromkeys(MAPPING_FIELDS), MAPPING_FIELDS, f"{where}: 'mapping'")
    check_object(entry["params"], dict.fromkeys(PARAM_FIELDS), PARAM_REQUIRED, f"{where}: 'params'")
    try:
        spec = parse_shape(key)
        shape = {k: getattr(spec, k) for k in SPEC_FIELDS}
        if shape != entry["spec"]:
            raise ValueError(f"'spec' {entry['spec']} is not the key's shape {shape}")
        params = TaskParams(**entry["params"])
        mapping = mapping_from_entry(entry["mapping"])
        check_size(spec, params)
        check_ring(spec, params, mapping)
        check_near_fields(spec, entry)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return spec, params, mapping


def check_ring(spec: LayerSpec, params: TaskParams, mapping: MappingParams) -> None:
    """ValueError unless ``params.buffer_groups`` (when set) holds at least the ring the entry's
    own ticket order allows (:func:`megawino.schedule.mapping.ring_buffer_groups`): a smaller ring
    would make a child wait for a slot its own parent still holds."""
    if params.buffer_groups is None:
        return
    whole = build_graph(spec, dataclasses.replace(params, buffer_groups=None))
    fewest = ring_buffer_groups(whole, build_interleaved(whole, mapping).order)
    if params.buffer_groups < fewest:
        raise ValueError(f"params.buffer_groups={params.buffer_groups} is a smaller ring than the entry's "
                         f"ticket order allows (at least {fewest} of {whole.layout.num_groups} groups)")


def lending_class(spec: LayerSpec) -> tuple:
    """What a table entry and a shape it lends its parameters to share: C, K, the filter, stride
    and padding (the GEMM's shape per tile and the transforms' work); only the tile count differs."""
    return spec.C, spec.K, spec.R, spec.S, spec.stride, spec.padding


def check_near_fields(spec: LayerSpec, entry: dict) -> None:
    """ValueError unless the entry's ``near_check`` maps shape strings of its lending class (not
    its own shape) to positive heuristic / lent time ratios, and ``lends_near`` is true only with
    a measured near shape and none below 1 (it may be false with all at least 1: outputs that
    differed from the heuristic's, or a veto)."""
    measured = entry.get("near_check")
    if measured is not None and "lends_near" not in entry:
        raise ValueError("'near_check' without 'lends_near'")
    for shape, ratio in (measured or {}).items():
        try:
            other = parse_shape(shape)
        except ValueError as err:
            raise ValueError(f"'near_check': {err}") from None
        if other == spec or lending_class(other) != lending_class(spec):
            raise ValueError(f"'near_check': {shape!r} is not a shape this entry lends to (the same C, K, "
                             f"filter, stride and padding, another tile count)")
        if not json_value_ok(ratio, float) or not (math.isfinite(ratio) and ratio > 0):
            raise ValueError(f"'near_check': {shape!r} must be a positive finite JSON number "
                             f"(heuristic time / lent time), got {ratio!r:.40}")
    if entry.get("lends_near"):
        if not measured:
            raise ValueError("'lends_near' is true but 'near_check' measured no near shape")
        worst = min(measured, key=measured.get)
        if measured[worst] < 1.0:
            raise ValueError(f"'lends_near' is true but {worst} ran slower with the entry's parameters "
                             f"than with the heuristic's ('near_check' {measured[worst]:.3f} < 1)")


def validate_table(data, source) -> dict:
    """``data`` if it follows the mapping-table schema, else a one-line ValueError that
    names ``source`` (the file) and the offending entry."""
    try:
        check_object(data, TABLE_FIELDS, ("layers",), "table")
        for key, entry in data["layers"].items():
            entry_objects(key, entry)
    except ValueError as err:
        raise ValueError(f"{source}: {err}") from None
    return data


def read_table(path) -> dict:
    """The validated table at ``path`` (JSON errors and schema errors name the file)."""
    path = pathlib.Path(path)
    return validate_table(json_files.read_json(path, "JSON mapping table"), path)


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict:
    return read_table(path)


def _load_file(path: pathlib.Path) -> dict:
    return _load(str(path), path.stat().st_mtime)


def load_table(key: str) -> dict:
    """The layers to choose from for GPU ``key``: MEGAWINO_MAPPING's table when set, else the
    shipped table's entries updated with the user's tuned table's ({} without either)."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        path = pathlib.Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{ENV_OVERRIDE}={path} does not exist")
        return _load_file(path)
    layers: dict = {}
    for path in (shipped_table_path(key), user_table_path(key)):
        if path.is_file():
            layers.update(_load_file(path)["layers"])
    return {"layers": layers}


def table_for_update(path) -> dict:
    """The table a tuner updates at ``path``: empty when there is no file, the validated table
    when it is one; anything else there (another file, a broken table) is a ValueError, so a
    tuner never overwrites it."""
    path = pathlib.Path(path)
    if not path.exists():
        return {"layers": {}}
    if not path.is_file():
        raise ValueError(f"{path} is not a file: the tuner writes a table there")
    try:
        return read_table(path)
    except ValueError as err:
        raise ValueError(f"not overwriting {path}: it is not a megawino mapping table "
                         f"({str(err).removeprefix(f'{path}: ')}); pass another --out") from None


def write_table(path, table: dict) -> pathlib.Path:
    """Validate ``table`` and write it to ``path`` atomically."""
    validate_table(table, path)
    return user_files.write_text_atomically(path, json.dumps(table, indent=1) + "\n")


def default_mapping_params(layout: Layout, workers: int = DEFAULT_WORKERS) -> MappingParams:
    return MappingParams(dig=workers, dgo=workers, groups_per_column=min(4, layout.num_groups))


def write_entry(table: dict, spec: LayerSpec, params: TaskParams, mapping: MappingParams,
                **measured) -> None:
    unknown = sorted(set(measured) - set(ENTRY_FIELDS))
    if unknown:
        raise ValueError(f"table entries have no field {unknown[0]!r} (tuning.ENTRY_FIELDS)")
    table.setdefault("layers", {})[spec.with_(layout="NCHW", name="").shape_string] = {
        "name": spec.name,
        "spec": {k: getattr(spec, k) for k in ("N", "C", "K", "H", "W")},
        "params": dataclasses.asdict(params),
        "mapping": mapping_to_entry(mapping),
        **measured,
    }
