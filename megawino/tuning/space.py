"""The search space the tuner explores (:func:`candidate_space`): task sizes and mapping
parameters around the heuristic's, every group size and GEMM task width the shipped tables use
(:func:`shipped_task_sizes`), and GEMM_OUTPUT graphs where the arithmetic and the layer allow
them.  The tuner adds the shipped tables' own entries and the ring-buffer form of its best
candidate (megawino.tuning.search)."""
from __future__ import annotations

import dataclasses
import functools
import itertools

from ..core.spec import LayerSpec
from ..core.task_sizes import DEFAULT_WORKERS, default_params, transform_chunk, transform_split
from ..core.tasks import (CHANNEL_ALIGN, GEMM_BLOCK_ROWS, GEMM_OUTPUT_CHANNELS, GEMM_OUTPUT_TILES, K_ALIGN,
                          LANE_CHANNELS, NCHW_INPUT_PASS_CHANNELS, Layout, TaskParams, channel_stride,
                          gemm_output_fits, round_up)
from ..core.winograd import tiles_for
from ..schedule.mapping import MappingParams
from . import table as tables


@functools.lru_cache(maxsize=1)
def shipped_task_sizes() -> tuple[frozenset, frozenset]:
    """(group sizes, GEMM task widths) that the entries of every shipped Winograd table use."""
    groups, widths = set(), set()
    for path in tables.mapping_dir().glob("*.json"):
        if path.stem.startswith("direct_"):
            continue
        for entry in tables.read_table(path)["layers"].values():
            groups.add(int(entry["params"]["tiles_per_group"]))
            widths.add(int(entry["params"]["gemm_k_per_task"]))
    return frozenset(groups), frozenset(widths)


# (tile, channel) pairs of a transform task the candidates' channel chunks start from.
TRANSFORM_PAIRS_PER_TASK = 4096


def mapping_waves(workers: int) -> tuple[int, ...]:
    """The candidates' DIG and DGO: fractions and multiples of a wave of resident blocks (4 and 8
    waves hold outputs back until most GEMMs are through, which suits layers with short transform
    tasks); their groups_per_column runs from no filter reuse to 8."""
    return (workers // 4, workers, 2 * workers, 4 * workers, 8 * workers)


def candidate_space(spec: LayerSpec, m: int = 4, workers: int = DEFAULT_WORKERS, fused_output: bool = False):
    """(TaskParams, MappingParams) pairs the tuner may try, before simulation ranks them; with
    ``fused_output`` (3xTF32 plans) also GEMM_OUTPUT graphs where the layer's C allows them."""
    spec.require_winograd()
    base = default_params(spec, m)
    if fused_output and gemm_output_fits(spec):
        yield from fused_candidates(spec, base, workers)
    k_stride = round_up(spec.K, K_ALIGN)
    c_pad = round_up(spec.C, CHANNEL_ALIGN)
    tiles = spec.N * tiles_for(spec.out_h, m) * tiles_for(spec.out_w, m)
    shipped_groups, shipped_widths = shipped_task_sizes()
    tiles_options = sorted({GEMM_BLOCK_ROWS, 2 * GEMM_BLOCK_ROWS, 4 * GEMM_BLOCK_ROWS, base.tiles_per_group}
                           | {g for g in shipped_groups if g % GEMM_BLOCK_ROWS == 0})
    # Up to 256 output channels per GEMM task: wider tasks re-read each V row block fewer times.
    gemm_k_options = sorted({min(k_stride, k) for k in (32, 64, 128, 256)}
                            | {k for k in shipped_widths if k % K_ALIGN == 0 and k <= k_stride})
    for tiles_per_group, gemm_k in itertools.product(tiles_options, gemm_k_options):
        groups = -(-tiles // tiles_per_group)
        chunk = TRANSFORM_PAIRS_PER_TASK // tiles_per_group
        # Transform chunks: default_params' rule for this group size, one warp's width (more,
        # shorter transform tasks: what the small layers need), and input tasks of one NCHW pass.
        chunks = sorted({(transform_chunk(c_pad, chunk, groups, workers),
                          transform_chunk(spec.K, chunk, groups, workers)),
                         (min(c_pad, LANE_CHANNELS), min(spec.K, LANE_CHANNELS)),
                         (min(c_pad, NCHW_INPUT_PASS_CHANNELS), min(spec.K, LANE_CHANNELS))})
        whole = [dataclasses.replace(base, tiles_per_group=tiles_per_group, gemm_k_per_task=gemm_k,
                                     input_channels_per_task=input_channels, output_k_per_task=output_k,
                                     input_tiles_per_task=None, output_tiles_per_task=None)
                 for input_channels, output_k in chunks]
        # Transform tiles: whole groups, and default_params' split rule for small layers.
        splits = {(tiles_per_group, tiles_per_group)} | {transform_split(spec, p, workers) for p in whole}
        for params_whole, (input_tiles, output_tiles) in itertools.product(whole, sorted(splits)):
            params = dataclasses.replace(params_whole, input_tiles_per_task=input_tiles,
                                         output_tiles_per_task=output_tiles)
            waves = mapping_waves(workers)
            for dig, dgo, per_column in itertools.product(waves, waves, (1, 4, 8)):
                if per_column <= groups:
                    yield params, MappingParams(dig, dgo, per_column)


def fused_candidates(spec: LayerSpec, base: TaskParams, workers: int):
    """GEMM_OUTPUT graphs: candidate_space's group sizes, input chunks and input tile splits, and
    its mapping distances for the inputs (the GEMM_OUTPUT tasks have no children: DGO is moot)."""
    tiles = Layout(spec, base).tiles
    c_pad = channel_stride(spec.C)
    waves = mapping_waves(workers)
    # Groups down to one step of the task (GEMM_OUTPUT_TILES): small layers need many tasks.
    for tiles_per_group in sorted({GEMM_OUTPUT_TILES, 2 * GEMM_OUTPUT_TILES, GEMM_BLOCK_ROWS, 2 * GEMM_BLOCK_ROWS,
                                   4 * GEMM_BLOCK_ROWS, base.tiles_per_group}):
        groups = -(-tiles // tiles_per_group)
        fused = dataclasses.replace(base, tiles_per_group=tiles_per_group, gemm_k_per_task=GEMM_OUTPUT_CHANNELS,
                                    fused_output=True, input_tiles_per_task=None, output_tiles_per_task=None)
        chunk = TRANSFORM_PAIRS_PER_TASK // tiles_per_group
        for input_channels in sorted({transform_chunk(c_pad, chunk, groups, workers), min(c_pad, LANE_CHANNELS),
                                      min(c_pad, NCHW_INPUT_PASS_CHANNELS)}):
            params = dataclasses.replace(fused, input_channels_per_task=input_channels)
            for input_tiles in sorted({tiles_per_group, transform_split(spec, params, workers)[0]}):
                for dig, per_column in itertools.product(waves, (1, 4, 8)):
                    if per_column <= groups:
                        yield (dataclasses.replace(params, input_tiles_per_task=input_tiles),
                               MappingParams(dig, workers, per_column))
