"""Tuned parameter tables (``mapping/<gpu>.json``), the run-time choice of task and
mapping parameters, and the search space the tuner explores.

Choice for a layer, in order:
1. ``tuned``: the table for this GPU has the layer's exact shape.
2. ``nearest``: the tuned shape closest in log(C), log(K) and log(tiles) lends its
   parameters (the paper's section 7.4: the best DIG and M follow the channel
   counts, and task sizes follow the GEMM shape).
3. ``heuristic``: ``default_params`` and ``default_mapping_params`` (one wave of
   resident blocks between parent and child, so a parent fetched one wave earlier
   has usually ended when its child is fetched; M = 4 groups share a filter matrix).

``MEGAWINO_MAPPING=path`` replaces the shipped table.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import pathlib
import re

from .mapping import MappingParams
from .resources import mapping_dir
from .spec import LayerSpec
from .task_sizes import DEFAULT_WORKERS, default_params, transform_chunk, transform_split
from .tasks import CHANNEL_ALIGN, GEMM_BLOCK_ROWS, K_ALIGN, LANE_CHANNELS, Layout, TaskParams, round_up
from .winograd import tiles_for

ENV_OVERRIDE = "MEGAWINO_MAPPING"


def gpu_key(device_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; unknown names -> a file-safe slug."""
    match = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", device_name.upper())
    if match:
        return match.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-") or "unknown"


def device_name() -> str:
    """The current CUDA device's name ('' without CuPy or a device)."""
    try:
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    except Exception:   # no CuPy, driver or device
        return ""
    return name.decode() if isinstance(name, bytes) else str(name)


def current_gpu_key(default: str = "h100") -> str:
    """Key of this machine's GPU tables; ``default`` (the H100, our target) without a GPU."""
    name = device_name()
    return gpu_key(name) if name else default


def table_path(key: str) -> pathlib.Path:
    override = os.environ.get(ENV_OVERRIDE)
    return pathlib.Path(override) if override else mapping_dir() / f"{key}.json"


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> dict:
    data = json.loads(pathlib.Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("layers"), dict):
        raise ValueError(f"{path}: a mapping table is a JSON object with a 'layers' object")
    return data


def load_table(key: str) -> dict:
    """The table for GPU ``key`` ({} when none ships); MEGAWINO_MAPPING overrides."""
    path = table_path(key)
    if not path.is_file():
        if os.environ.get(ENV_OVERRIDE):
            raise FileNotFoundError(f"{ENV_OVERRIDE}={path} does not exist")
        return {"layers": {}}
    return _load(str(path), path.stat().st_mtime)


def default_mapping_params(layout: Layout, workers: int = DEFAULT_WORKERS) -> MappingParams:
    return MappingParams(dig=workers, dgo=workers, m=min(4, layout.num_groups))


def entry_params(entry: dict, spec: LayerSpec) -> tuple[TaskParams, MappingParams]:
    params = dict(entry["params"])
    # A borrowed GEMM K width may not fit a layer with fewer output channels.
    k_stride = -(-spec.K // K_ALIGN) * K_ALIGN
    params["gemm_k_per_task"] = min(params["gemm_k_per_task"], k_stride)
    return TaskParams(**params), MappingParams(**entry["mapping"])


def _shape_distance(spec: LayerSpec, entry: dict) -> float:
    shape = entry["spec"]
    other = LayerSpec(**{k: shape[k] for k in ("N", "C", "K", "H", "W")})
    tiles = lambda s: s.N * math.ceil(s.out_h / 4) * math.ceil(s.out_w / 4)  # noqa: E731
    return (abs(math.log(spec.C / other.C)) + abs(math.log(spec.K / other.K))
            + 0.5 * abs(math.log(tiles(spec) / tiles(other))))


def choose(spec: LayerSpec, key: str | None = None, m: int = 4,
           workers: int = DEFAULT_WORKERS) -> tuple[TaskParams, MappingParams, str]:
    """Task and mapping parameters for ``spec`` and where they came from."""
    spec.require_winograd()
    table = load_table(key) if key else {"layers": {}}
    layers = {k: v for k, v in table["layers"].items() if v["params"].get("m", 4) == m}
    lookup = spec.with_(layout="NCHW", name="").shape_string
    if lookup in layers:
        return (*entry_params(layers[lookup], spec), "tuned")
    if layers:
        nearest = min(layers.values(), key=lambda e: _shape_distance(spec, e))
        task_params, mapping_params = entry_params(nearest, spec)
        return task_params, mapping_params, "nearest"
    params = default_params(spec, m)
    return params, default_mapping_params(Layout(spec, params), workers), "heuristic"


def candidate_space(spec: LayerSpec, m: int = 4, workers: int = DEFAULT_WORKERS):
    """(TaskParams, MappingParams) pairs the tuner may try, before simulation ranks them."""
    spec.require_winograd()
    base = default_params(spec, m)
    k_stride = round_up(spec.K, K_ALIGN)
    c_pad = round_up(spec.C, CHANNEL_ALIGN)
    tiles = spec.N * tiles_for(spec.out_h, m) * tiles_for(spec.out_w, m)
    tiles_options = sorted({GEMM_BLOCK_ROWS, 2 * GEMM_BLOCK_ROWS, 4 * GEMM_BLOCK_ROWS,
                            base.tiles_per_group})
    # Up to 256 output channels per GEMM task: wider tasks re-read each V row block fewer
    # times (128 beat 64 in the megakernel, bench/NOTES.md experiment 6).
    gemm_k_options = sorted({min(k_stride, k) for k in (32, 64, 128, 256)})
    per_task_pairs = 4096
    for tiles_per_group, gemm_k in itertools.product(tiles_options, gemm_k_options):
        groups = -(-tiles // tiles_per_group)
        chunk = per_task_pairs // tiles_per_group
        # Transform chunks: default_params' rule for this group size, and one warp's width
        # (more, shorter transform tasks: what the small layers need).
        chunks = sorted({(transform_chunk(c_pad, chunk, groups, workers),
                          transform_chunk(spec.K, chunk, groups, workers)),
                         (min(c_pad, LANE_CHANNELS), min(spec.K, LANE_CHANNELS))})
        whole = [dataclasses.replace(base, tiles_per_group=tiles_per_group, gemm_k_per_task=gemm_k,
                                     input_channels_per_task=input_channels, output_k_per_task=output_k,
                                     input_tiles_per_task=None, output_tiles_per_task=None)
                 for input_channels, output_k in chunks]
        # Transform tiles: whole groups, and default_params' split rule (bench/NOTES.md 32).
        splits = {(tiles_per_group, tiles_per_group)} | {transform_split(spec, p, workers) for p in whole}
        for params_whole, (input_tiles, output_tiles) in itertools.product(whole, sorted(splits)):
            params = dataclasses.replace(params_whole, input_tiles_per_task=input_tiles,
                                         output_tiles_per_task=output_tiles)
            # Distances in fractions and multiples of a wave of resident blocks (4 and 8 waves
            # hold outputs back until most GEMMs are through: resnet50.conv4_x's best mapping
            # with short transform tasks, bench/NOTES.md 37); M from no filter reuse to 8.
            waves = (workers // 4, workers, 2 * workers, 4 * workers, 8 * workers)
            for dig, dgo, group_m in itertools.product(waves, waves, (1, 4, 8)):
                if group_m <= groups:
                    yield params, MappingParams(dig, dgo, group_m)


def write_entry(table: dict, spec: LayerSpec, params: TaskParams, mapping: MappingParams,
                **measured) -> None:
    table.setdefault("layers", {})[spec.with_(layout="NCHW", name="").shape_string] = {
        "name": spec.name,
        "spec": {k: getattr(spec, k) for k in ("N", "C", "K", "H", "W")},
        "params": dataclasses.asdict(params),
        "mapping": dataclasses.asdict(mapping),
        **measured,
    }
