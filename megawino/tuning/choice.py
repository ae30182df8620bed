"""The run-time choice of a Winograd layer's task and mapping parameters, and where they came
from (:class:`ParamsSource`).

Choice for a layer, in order:
1. ``tuned``: a table of this GPU (its own arithmetic's, then its default table) has the
   layer's exact shape.
2. ``architecture``: the table of another GPU of the same architecture family
   (:func:`megawino.gpu.identity.family_fallbacks`: sm_90 -> the H200's, the H100's, nearest in
   memory bandwidth first) has the exact shape.
3. ``nearest``: a tuned shape *near* the layer lends its parameters (:func:`is_near`: the same
   C, K and padding, the tile count within :data:`NEAR_TILES_RATIO`; in the shipped tables every
   pair of entries that near has the same group size and GEMM_OUTPUT choice, while the pairs
   farther apart disagree in a third of the cases), and only where the nearest entry was
   measured not to lose to the heuristic on the shapes that borrow it (:func:`lends`:
   ``lends_near`` true, set by ``megawino tune --check-near``, :mod:`megawino.tuning.near`):
   an entry's group size and mapping suit its own tile count, and which entries carry over to
   other batches is not told by the distance, so an entry nobody checked lends nothing.  The nearest
   shape of the first table with a near shape (this GPU's tables, then its family's, as in 1
   and 2) decides; a farther entry, or another table's, does not stand in for one that does not
   lend: it was not measured on that shape.
4. ``heuristic``: ``default_params`` and ``default_mapping_params``.

Tables, in order: ``MEGAWINO_MAPPING=path`` alone when set; else for each key the user's tuned
table (``<cache>/<key>.json``) whose entries take precedence over the shipped table's.
"""
from __future__ import annotations

import dataclasses
import math
import os
import pathlib

from ..core.spec import LayerSpec, parse_shape
from ..core.task_sizes import DEFAULT_WORKERS, default_params
from ..core.tasks import K_ALIGN, Layout, TaskParams, gemm_output_fits, round_up
from ..core.winograd import tiles_for
from ..gpu import identity as gpu_identity
from ..schedule.mapping import MappingParams
from . import table as tables

SOURCE_KINDS = ("given", "tuned", "architecture", "nearest", "heuristic")
KIND_TEXT = {"given": "given by the caller", "tuned": "tuned for this GPU",
             "architecture": "same-architecture fallback", "nearest": "nearest tuned shape",
             "heuristic": "heuristic (no tuned entry)"}
# Tile counts (N x tiles per image) within this ratio, at the same C, K and padding, are near.
NEAR_TILES_RATIO = 3.5


@dataclasses.dataclass(frozen=True)
class ParamsSource:
    """Where a plan's parameters came from: ``kind`` (one of SOURCE_KINDS), the table file
    (``table``: a path, None for the heuristic) and the entry's shape key (``shape``)."""

    kind: str
    table: str | None = None
    shape: str | None = None

    def __post_init__(self):
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"kind must be one of {SOURCE_KINDS}, got {self.kind!r}")

    def describe(self) -> str:
        if self.table is None:
            return KIND_TEXT[self.kind]
        entry = f", entry {self.shape}" if self.kind == "nearest" else ""
        return f"{KIND_TEXT[self.kind]}: {pathlib.Path(self.table).name}{entry}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "table": self.table, "shape": self.shape}

    def __str__(self) -> str:
        return self.describe()


HEURISTIC = ParamsSource("heuristic")
GIVEN = ParamsSource("given")


def table_layers(key: str) -> dict:
    """Shape key -> (entry, path of the file it is from) of table ``key``: MEGAWINO_MAPPING's
    table when set, else the shipped table's entries updated with the user's tuned table's."""
    override = os.environ.get(tables.ENV_OVERRIDE)
    paths = [pathlib.Path(override)] if override else [tables.shipped_table_path(key), tables.user_table_path(key)]
    if override and not paths[0].is_file():
        raise FileNotFoundError(f"{tables.ENV_OVERRIDE}={paths[0]} does not exist")
    layers: dict = {}
    for path in paths:
        if path.is_file():
            layers.update({shape: (entry, str(path)) for shape, entry in tables._load_file(path)["layers"].items()})
    return layers


def shipped_gpu_keys() -> list[str]:
    """GPU keys with a shipped default-arithmetic table (``mapping/<key>.json``)."""
    own = tuple(f"-{math}" for math in tables.OWN_TABLE_GEMM_MATHS)
    return sorted(p.stem for p in tables.mapping_dir().glob("*.json")
                  if not p.stem.startswith("direct_") and not p.stem.endswith(own))


def table_chain(gpu, gemm_math: str) -> list[tuple[str, str]]:
    """(table key, kind) in the order plans of ``gemm_math`` on ``gpu`` (a GpuIdentity or a key)
    read them: the tables of ``gemm_math``'s own arithmetic first (its GEMM tasks run at their own
    speed), the GPU's own ("tuned") before its family's ("architecture"); then the default
    arithmetic's tables in the same order."""
    identity = gpu_identity.identity_for_key(gpu) if isinstance(gpu, str) else gpu
    gpus = [(identity.key, "tuned")] + [(k, "architecture") for k in
                                        gpu_identity.family_fallbacks(identity, shipped_gpu_keys())]
    chain = [(tables.table_key(key, gemm_math), kind) for key, kind in gpus]
    chain += [(key, kind) for key, kind in gpus if (key, kind) not in chain]
    return chain


def entry_params(entry: dict, spec: LayerSpec, fused_output: bool = True) -> tuple[TaskParams, MappingParams]:
    """The entry's parameters for ``spec`` (its own shape's or a borrowed one's); a GEMM_OUTPUT
    entry gives the heuristic's task sizes (with the entry's mapping) where ``fused_output`` is off
    (plans of another GEMM arithmetic) or the layer's C is too wide for GEMM_OUTPUT tasks."""
    params = dict(entry["params"])
    if params.get("fused_output") and not (fused_output and gemm_output_fits(spec)):
        return default_params(spec, params["m"]), tables.mapping_from_entry(entry["mapping"])
    if not params.get("fused_output"):
        # A borrowed GEMM K width may not fit a layer with fewer output channels.
        params["gemm_k_per_task"] = min(params["gemm_k_per_task"], round_up(spec.K, K_ALIGN))
    return TaskParams(**params), tables.mapping_from_entry(entry["mapping"])


def lent_params(entry: dict, spec: LayerSpec, fused_output: bool = True) -> tuple[TaskParams, MappingParams]:
    """The parameters ``entry`` lends to the near shape ``spec``: :func:`entry_params` without the
    ring (its slots are counted for the entry's own shape and order)."""
    task_params, mapping_params = entry_params(entry, spec, fused_output)
    return dataclasses.replace(task_params, buffer_groups=None), mapping_params


def lends(entry: dict) -> bool:
    """Whether ``entry`` lends its parameters to near shapes: only where ``megawino tune
    --check-near`` measured them not slower than the heuristic's on every near shape it timed."""
    return entry.get("lends_near") is True


def tile_count(spec: LayerSpec, m: int = 4) -> int:
    return spec.N * tiles_for(spec.out_h, m) * tiles_for(spec.out_w, m)


def is_near(spec: LayerSpec, shape: str) -> bool:
    """Whether tuned shape ``shape`` is near ``spec``: the same C, K, filter, stride and padding
    (:func:`megawino.tuning.table.lending_class`), the tile count within NEAR_TILES_RATIO either
    way (the group size follows it).  Its entry lends ``spec`` its parameters only if it
    :func:`lends`."""
    other = parse_shape(shape)
    if tables.lending_class(other) != tables.lending_class(spec):
        return False
    ratio = tile_count(spec) / tile_count(other)
    return 1 / NEAR_TILES_RATIO <= ratio <= NEAR_TILES_RATIO


def nearest_shape(spec: LayerSpec, shapes) -> str | None:
    """The shape of ``shapes`` (tuned shape strings) nearest ``spec``: :func:`is_near`, the
    closest tile count (the first of a tie); None if none is near."""
    near = [s for s in shapes if is_near(spec, s)]
    if not near:
        return None
    return min(near, key=lambda s: abs(math.log(tile_count(spec) / tile_count(parse_shape(s)))))


def choose(spec: LayerSpec, key: str | None = None, m: int = 4, workers: int = DEFAULT_WORKERS,
           fallback: str | None = None, fused_output: bool = True,
           architecture=()) -> tuple[TaskParams, MappingParams, ParamsSource]:
    """Task and mapping parameters for ``spec`` and their :class:`ParamsSource`: the exact
    shape in table ``key``, then ``fallback`` (the same GPU's default table), then the tables of
    ``architecture`` (keys of GPUs of the same family); else the nearest shape
    (:func:`nearest_shape`) of the first of those tables that has one, if its entry
    :func:`lends`; else the heuristic.  GEMM_OUTPUT entries only with ``fused_output`` (entry_params); ``key`` None:
    the heuristic."""
    chain = [(k, "tuned") for k in dict.fromkeys(x for x in (key, fallback) if x)] if key else []
    chain += [(k, "architecture") for k in architecture if key and k not in (key, fallback)]
    return choose_in(spec, chain, m, workers, fused_output)


def choose_for_gpu(spec: LayerSpec, gpu, gemm_math: str, m: int = 4, workers: int = DEFAULT_WORKERS,
                   fused_output: bool = True) -> tuple[TaskParams, MappingParams, ParamsSource]:
    """:func:`choose` over :func:`table_chain` of ``gpu`` (GpuIdentity or key) and ``gemm_math``."""
    return choose_in(spec, table_chain(gpu, gemm_math), m, workers, fused_output)


def choose_in(spec: LayerSpec, chain, m: int = 4, workers: int = DEFAULT_WORKERS,
              fused_output: bool = True) -> tuple[TaskParams, MappingParams, ParamsSource]:
    """:func:`choose` over ``chain``, (table key, kind) pairs in the order they are read."""
    spec.require_winograd()
    lookup = spec.with_(layout="NCHW", name="").shape_string
    layers = []
    for key, kind in chain:
        found = {s: v for s, v in table_layers(key).items() if v[0]["params"]["m"] == m}
        layers.append((kind, found))
        if lookup in found:
            entry, path = found[lookup]
            return (*entry_params(entry, spec, fused_output), ParamsSource(kind, path, lookup))
    # The first table with a near shape decides: its nearest entry lends, or nobody does (a
    # later table's entry was never measured on this shape against this one's).
    nearest = next(((shape, found[shape]) for _, found in layers
                    if (shape := nearest_shape(spec, found)) is not None), None)
    if nearest is not None and lends(nearest[1][0]):
        shape, (entry, path) = nearest
        return (*lent_params(entry, spec, fused_output), ParamsSource("nearest", path, shape))
    params = default_params(spec, m)
    return params, tables.default_mapping_params(Layout(spec, params), workers), HEURISTIC


def tables_in_use(gpu, gemm_math: str) -> str:
    """In words, the tables plans of ``gemm_math`` on ``gpu`` (a GpuIdentity) read and what a GPU
    without any gets (for ``megawino info``)."""
    override = os.environ.get(tables.ENV_OVERRIDE)
    if override:
        return f"{tables.ENV_OVERRIDE}={override} (every layer's entry, else the heuristic)"
    found = []
    for key, kind in table_chain(gpu, gemm_math):
        for path in (tables.shipped_table_path(key), tables.user_table_path(key)):
            if path.is_file():
                layers = len(tables._load_file(path)["layers"])
                found.append((kind, f"{path} ({KIND_TEXT[kind]}, {layers} layers)"))
    tune = "megawino tune suite" + (f" --gemm-math {gemm_math}" if gemm_math in tables.OWN_TABLE_GEMM_MATHS else "")
    if not found:
        return (f"none: megawino has not been measured on this GPU ({gpu.key}, "
                f"{gpu.family or 'unknown architecture'}); every layer takes the heuristic. "
                f"Tune it: {tune}")
    text = "; then ".join(t for _, t in found)
    if all(kind == "architecture" for kind, _ in found):
        text += f". No table of this GPU's own ({gpu.key}): tune one with {tune}"
    return text
