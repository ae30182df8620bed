"""Task types, task parameters and the buffer layout (the graph of one layer:
:mod:`megawino.core.task_graph`).

This module is the single source of truth shared by the CPU executor, the
simulator, the mapping validator and the CUDA megakernel (whose task-type codes,
record fields and alignment constants are generated from here into
``cuda/generated_tasks.cuh`` by :mod:`megawino.gpu.codegen`).

A task is the work of one thread block of the non-fused kernels (seed 002,
section 5.1).  Tiles are split into ``num_groups`` groups of ``tiles_per_group``
tiles; per group there are ``inputs_per_group`` input-transform tasks (channel
chunks x tile parts), ``gemms_per_group`` GEMM tasks (one per transform position and K block)
and ``outputs_per_group`` output-transform tasks (K chunks).  ``num_filter_tasks``
filter-transform tasks are shared by every group.  With ``TaskParams.fused_output`` a group's
GEMM and output tasks are instead ``gemms_per_group`` GEMM_OUTPUT tasks (one per K block): each
multiplies every transform position of the group's tiles by its K block and transforms the
products to y itself, so that M never leaves the SM (the layout then has no M rows).

Dependencies go through counters, as in the megakernel: a task *signals* one
counter when it ends and *waits* on up to two counters.  In the networkx graph
counters are join nodes between parents and children, so each counter's
expected value is its in-degree and the graph stays linear in the task count.
"""
from __future__ import annotations

import dataclasses
import enum

import numpy as np

from .spec import LayerSpec
from .winograd import tiles_for


class TaskType(enum.IntEnum):
    FILTER = 0   # filter transform: w -> U
    INPUT = 1    # input transform: x -> V
    GEMM = 2     # one transform position x one K block: M[p] = V[p] U[p]
    OUTPUT = 3   # output transform: M -> y
    GEMM_OUTPUT = 4  # every transform position x one K block, then its output transform: V -> y


# Fields of one task record (int32 each), in order.  ``need_*`` is the count a
# waited counter must reach per launch; -1 in ``wait_*`` / ``signal`` means none.
TASK_RECORD_FIELDS = ("type", "group", "index", "wait_a", "need_a", "wait_b", "need_b", "signal")
# One record as a NumPy structured dtype: TaskGraph.records stays int32 [num_tasks][8] (the
# bytes the kernels read, as the generated C struct mw::TaskRecord); views of it name the fields.
TASK_RECORD_DTYPE = np.dtype([(name, np.int32) for name in TASK_RECORD_FIELDS])
NO_COUNTER = -1

# Alignment of the buffer strides (the CUDA GEMM reads 16-byte vectors).
CHANNEL_ALIGN = 16       # channels of U and V are padded (with zeros) to a multiple of this (abi's paired U keeps 16-channel groups)
K_ALIGN = 4              # output channels of U and M are padded to a multiple of this
GEMM_BLOCK_ROWS = 64     # tiles_per_group must be a multiple of the GEMM block tile rows
GEMM_TILE_COLS = 64      # columns of one GEMM block tile (the pointwise path's grid is planned in them)
COUNTER_STRIDE = 32      # int32s between counters: each on its own 128-byte line
LANE_CHANNELS = 32       # channels the 32 lanes of a transform warp cover (LANE_CHANNELS in
                         # cuda/params.cuh): a task with
                         # fewer channels leaves lanes idle and is no faster
NCHW_INPUT_PASS_CHANNELS = 16  # channels of one pass of the NCHW input task's warp item (two
                               # passes cover LANE_CHANNELS; cuda/input_transform.cuh asserts it):
                               # a task of this many runs one pass,
                               # a shorter chain where a layer's input tasks are a critical path
TRANSFORM_MIN_TILES = 16  # fewest tiles a transform task may cover: the input lane map gives a
                          # warp 2 tiles x 32 channels, so 16 tiles keep all 8 warps of a
                          # 256-thread block busy on one 32-channel chunk

# Output channels of one GEMM_OUTPUT task (GEMM_OUTPUT_CHANNELS in cuda/gemm_output.cuh: four
# n8 blocks of the products' MMAs, a warp's registers for one position) and the most padded input
# channels (c_stride) it takes: it reads U's block from L2 again for every 16 tiles, which only a
# short reduction keeps cheap.
GEMM_OUTPUT_CHANNELS = 32
GEMM_OUTPUT_MAX_C_STRIDE = 64
# Tiles a GEMM_OUTPUT task multiplies at a time (GEMM_OUTPUT_TILES in cuda/gemm_output.cuh: one m16
# block); its groups are a multiple of it.
GEMM_OUTPUT_TILES = 16

# Size limits (check_size): the kernels hold tile ids, channel indices, task ids, tickets and
# counter offsets in int32, and the task records are int32.
INT32_MAX = 2**31 - 1
# Upper bounds of the TaskParams sizes: a transform task's work items (tiles x channels, a
# 32-bit loop index in cuda/input_transform.cuh and output_transform.cuh) stay below 2^30.
MAX_TILES_PER_GROUP = 2**15
MAX_CHANNELS_PER_TASK = 2**15
# Ticket fetches past the last ticket (one per block of the grid: the int32 ticket head
# counts them too); far above any GPU's resident blocks.
TICKET_MARGIN = 2**20


def round_up(value: int, align: int) -> int:
    return -(-value // align) * align


def channel_stride(channels: int) -> int:
    """Floats of a channel row of U and V (channels padded to CHANNEL_ALIGN): the GEMM's depth."""
    return round_up(channels, CHANNEL_ALIGN)


def gemm_output_fits(spec: LayerSpec) -> bool:
    """Whether GEMM_OUTPUT tasks (TaskParams.fused_output) take ``spec``: C <= GEMM_OUTPUT_MAX_C_STRIDE."""
    return channel_stride(spec.C) <= GEMM_OUTPUT_MAX_C_STRIDE


def _positive_int(name: str, value, limit: int = INT32_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= limit:
        raise ValueError(f"{name} must be an integer in 1..{limit}, got {value!r}")
    return int(value)


# Upper bound of each TaskParams size (TaskParams.__post_init__, the tables' schema).
TASK_PARAM_LIMITS = {
    "tiles_per_group": MAX_TILES_PER_GROUP,
    "input_channels_per_task": MAX_CHANNELS_PER_TASK,
    "gemm_k_per_task": MAX_CHANNELS_PER_TASK,
    "output_k_per_task": MAX_CHANNELS_PER_TASK,
    "filter_pairs_per_task": INT32_MAX,
    "input_tiles_per_task": MAX_TILES_PER_GROUP,
    "output_tiles_per_task": MAX_TILES_PER_GROUP,
    "buffer_groups": INT32_MAX,
}


@dataclasses.dataclass(frozen=True)
class TaskParams:
    """Per-task work sizes.  ``default_params`` derives them from the layer."""

    m: int = 4                          # output tile size: F(m x m, 3 x 3)
    tiles_per_group: int = 128          # t: tiles of one task group (GEMM rows)
    input_channels_per_task: int = 32   # channels one input-transform task covers
    gemm_k_per_task: int = 64           # output channels one GEMM task covers
    output_k_per_task: int = 32         # output channels one output-transform task covers
    filter_pairs_per_task: int = 1024   # (c, k) filter pairs one filter-transform task covers
    # Tiles one input / output transform task covers: a divisor of tiles_per_group (None: the
    # whole group).  Splitting a group's tiles over several transform tasks shortens the first
    # and last phase of small layers, where a handful of long transform tasks kept most blocks
    # idle.
    input_tiles_per_task: int | None = None
    output_tiles_per_task: int | None = None
    # Groups whose V and M rows the buffers hold (None: every group).  With fewer, group g uses
    # slot g mod buffer_groups, a ring that takes a fraction of the memory; its input tasks then
    # wait for the GEMMs, and its GEMMs for the outputs, of the group that held the slot before
    # (build_graph), which only a megakernel ticket order can satisfy.
    buffer_groups: int | None = None
    # GEMM_OUTPUT tasks instead of GEMM and OUTPUT tasks (M stays on the SM): needs
    # gemm_k_per_task == GEMM_OUTPUT_CHANNELS, no ring, and (check_size) C <= GEMM_OUTPUT_MAX_C_STRIDE.
    fused_output: bool = False

    def __post_init__(self):
        if not isinstance(self.fused_output, (bool, np.bool_)):
            raise ValueError(f"TaskParams.fused_output must be True or False, got {self.fused_output!r}")
        object.__setattr__(self, "fused_output", bool(self.fused_output))
        if isinstance(self.m, bool) or self.m not in (2, 4):
            raise ValueError(f"TaskParams.m must be 2 or 4, got {self.m!r}")
        for field in ("tiles_per_group", "input_channels_per_task", "gemm_k_per_task",
                      "output_k_per_task", "filter_pairs_per_task"):
            _positive_int(f"TaskParams.{field}", getattr(self, field), TASK_PARAM_LIMITS[field])
        # Groups of GEMM_OUTPUT tasks need no GEMM tile of GEMM_BLOCK_ROWS rows.
        rows = GEMM_OUTPUT_TILES if self.fused_output else GEMM_BLOCK_ROWS
        if self.tiles_per_group % rows:
            raise ValueError(f"TaskParams.tiles_per_group must be a multiple of {rows}"
                             f"{' (fused_output)' if rows == GEMM_OUTPUT_TILES else ''}, got {self.tiles_per_group}")
        if self.gemm_k_per_task % K_ALIGN:
            raise ValueError(f"TaskParams.gemm_k_per_task must be a multiple of {K_ALIGN}, "
                             f"got {self.gemm_k_per_task}")
        for field in ("input_tiles_per_task", "output_tiles_per_task"):
            value = getattr(self, field)
            if value is None:
                object.__setattr__(self, field, self.tiles_per_group)
                continue
            value = _positive_int(f"TaskParams.{field}", value, TASK_PARAM_LIMITS[field])
            if value % TRANSFORM_MIN_TILES or self.tiles_per_group % value:
                raise ValueError(f"TaskParams.{field} must be a multiple of {TRANSFORM_MIN_TILES} "
                                 f"that divides tiles_per_group ({self.tiles_per_group}), got {value}")
            object.__setattr__(self, field, value)
        if self.buffer_groups is not None:
            object.__setattr__(self, "buffer_groups", _positive_int(
                "TaskParams.buffer_groups", self.buffer_groups, TASK_PARAM_LIMITS["buffer_groups"]))
        if self.fused_output and self.gemm_k_per_task != GEMM_OUTPUT_CHANNELS:
            raise ValueError(f"TaskParams.fused_output needs gemm_k_per_task={GEMM_OUTPUT_CHANNELS} "
                             f"(the output channels of a GEMM_OUTPUT task), got {self.gemm_k_per_task}")
        if self.fused_output and self.buffer_groups is not None:
            raise ValueError("TaskParams.fused_output keeps no M to ring: buffer_groups must be None, "
                             f"got {self.buffer_groups}")

    @property
    def alpha(self) -> int:
        return self.m + 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """Sizes and strides of the Winograd buffers, shared by every executor.

    U[alpha2][c_stride][k_stride], V[alpha2][buffer_tiles][c_stride],
    M[alpha2][buffer_tiles][k_stride].  Padding rows / channels hold zeros: the
    tasks that write a buffer also write its padding, so no buffer relies on
    having been cleared.  Tile t of group g is row t - ring_shift(g) of V and M: the
    buffers hold ``buffer_groups`` groups, group g in slot g mod buffer_groups.
    """

    spec: LayerSpec
    params: TaskParams

    @property
    def alpha(self) -> int:
        return self.params.alpha

    @property
    def alpha2(self) -> int:
        return self.params.alpha ** 2

    @property
    def tiles_h(self) -> int:
        return tiles_for(self.spec.out_h, self.params.m)

    @property
    def tiles_w(self) -> int:
        return tiles_for(self.spec.out_w, self.params.m)

    @property
    def tiles(self) -> int:
        return self.spec.N * self.tiles_h * self.tiles_w

    @property
    def num_groups(self) -> int:
        return -(-self.tiles // self.params.tiles_per_group)

    @property
    def tiles_padded(self) -> int:
        return self.num_groups * self.params.tiles_per_group

    @property
    def buffer_groups(self) -> int:
        """Groups the V and M buffers hold (all of them unless TaskParams.buffer_groups is fewer)."""
        wanted = self.params.buffer_groups
        return self.num_groups if wanted is None else min(wanted, self.num_groups)

    @property
    def ring(self) -> bool:
        """V and M are a ring of fewer slots than groups."""
        return self.buffer_groups < self.num_groups

    @property
    def buffer_tiles(self) -> int:
        """Rows of V and M."""
        return self.buffer_groups * self.params.tiles_per_group

    def ring_shift(self, group: int) -> int:
        """Tile id minus row of V and M for the tiles of ``group``."""
        return group // self.buffer_groups * self.buffer_groups * self.params.tiles_per_group

    @property
    def c_stride(self) -> int:
        return channel_stride(self.spec.C)

    @property
    def k_stride(self) -> int:
        return round_up(self.spec.K, K_ALIGN)

    @property
    def u_shape(self) -> tuple[int, int, int]:
        return (self.alpha2, self.c_stride, self.k_stride)

    @property
    def v_shape(self) -> tuple[int, int, int]:
        return (self.alpha2, self.buffer_tiles, self.c_stride)

    @property
    def m_shape(self) -> tuple[int, int, int]:
        """No rows where GEMM_OUTPUT tasks keep M on the SM."""
        return (self.alpha2, 0 if self.params.fused_output else self.buffer_tiles, self.k_stride)

    # ---- task counts -------------------------------------------------
    @property
    def num_filter_tasks(self) -> int:           # N_F
        return -(-(self.c_stride * self.k_stride) // self.params.filter_pairs_per_task)

    @property
    def input_tile_parts(self) -> int:           # input tasks per channel chunk of a group
        return self.params.tiles_per_group // self.params.input_tiles_per_task

    @property
    def inputs_per_group(self) -> int:           # S_I
        return -(-self.c_stride // self.params.input_channels_per_task) * self.input_tile_parts

    @property
    def k_blocks(self) -> int:
        return -(-self.k_stride // self.params.gemm_k_per_task)

    @property
    def product_type(self) -> TaskType:
        """The type of the tasks that multiply V by U: GEMM, or GEMM_OUTPUT (fused_output)."""
        return TaskType.GEMM_OUTPUT if self.params.fused_output else TaskType.GEMM

    @property
    def gemms_per_group(self) -> int:            # S_G: the product_type tasks of a group
        return self.k_blocks if self.params.fused_output else self.alpha2 * self.k_blocks

    @property
    def output_tile_parts(self) -> int:          # output tasks per K chunk of a group
        return self.params.tiles_per_group // self.params.output_tiles_per_task

    @property
    def outputs_per_group(self) -> int:          # S_O
        if self.params.fused_output:
            return 0
        return -(-self.spec.K // self.params.output_k_per_task) * self.output_tile_parts

    @property
    def num_tasks(self) -> int:
        return self.num_filter_tasks + self.num_groups * (
            self.inputs_per_group + self.gemms_per_group + self.outputs_per_group)

    # ---- slices a task covers (the CPU executor and the kernels agree on these) ----
    def filter_pair_range(self, index: int) -> tuple[int, int]:
        per = self.params.filter_pairs_per_task
        return index * per, min(self.c_stride * self.k_stride, (index + 1) * per)

    def group_tile_range(self, group: int) -> tuple[int, int]:
        t = self.params.tiles_per_group
        return group * t, (group + 1) * t        # tile ids (padding tiles included)

    def _transform_slice(self, group: int, index: int, tiles_per_task: int, per: int,
                         total: int) -> tuple[tuple[int, int], tuple[int, int]]:
        # index = chunk * parts + part (transform_slice in cuda/input_transform.cuh)
        chunk, part = divmod(index, self.params.tiles_per_group // tiles_per_task)
        t0 = group * self.params.tiles_per_group + part * tiles_per_task
        return (t0, t0 + tiles_per_task), (chunk * per, min(total, (chunk + 1) * per))

    def input_slices(self, group: int, index: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(tile range, channel range) of input task ``index`` of ``group`` (padding included)."""
        return self._transform_slice(group, index, self.params.input_tiles_per_task,
                                     self.params.input_channels_per_task, self.c_stride)

    def gemm_position_kblock(self, index: int) -> tuple[int, int]:
        """GEMM task index j -> (transform position p, K block); j = p * k_blocks + kb,
        so the paper's 'jth filter matrix' is U[p][:, K block]."""
        return divmod(index, self.k_blocks)

    def gemm_k_range(self, k_block: int) -> tuple[int, int]:
        per = self.params.gemm_k_per_task
        return k_block * per, min(self.k_stride, (k_block + 1) * per)

    def output_slices(self, group: int, index: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(tile range, output channel range) of output task ``index`` of ``group``."""
        return self._transform_slice(group, index, self.params.output_tiles_per_task,
                                     self.params.output_k_per_task, self.spec.K)

    # ---- counters ----------------------------------------------------
    @property
    def num_counters(self) -> int:
        return 1 + (3 if self.ring else 2) * self.num_groups

    def counter_filters_done(self) -> int:
        return 0

    def counter_inputs_done(self, group: int) -> int:
        return 1 + group

    def counter_products_done(self, group: int) -> int:
        return 1 + self.num_groups + group

    def counter_outputs_done(self, group: int) -> int:
        """Only with a ring: the next user of the group's slot waits for it."""
        return 1 + 2 * self.num_groups + group
