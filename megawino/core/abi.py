"""The binary interface between the host and the kernels, defined once here and
generated into ``cuda/generated_tasks.cuh`` by :mod:`megawino.gpu.codegen`.

* ``PARAM_FIELDS``: the runtime parameter struct ``mw::Params`` (every field a
  64-bit integer, pointers included), filled by the runtime as an int64 array.
* ``STATE_WORDS`` / ``STATUS_FIELDS``: the scheduler's state words, each on its
  own 128-byte line (see cuda/scheduler.cuh for what they mean).
* ``TRACE_FIELDS`` / ``TRACE_DTYPE``: one row of the megakernel's trace (``mw::TraceRow``).
* The task record is :data:`megawino.core.tasks.TASK_RECORD_DTYPE` (``mw::TaskRecord``).
* ``DIRECT_KERNEL_ARGS``: the direct kernel's arguments in order (``mw_direct_conv`` in
  ``cuda/generated_direct.cuh``; :func:`megawino.direct.kernel.launch` passes them so).
"""
from __future__ import annotations

import numpy as np

from .tasks import COUNTER_STRIDE, TASK_RECORD_DTYPE

# Operand formats of U and V (``mw::Params::U`` / ``V``): "float32" as PARAM_FIELDS describes
# them; "float32_u_paired" (the non-fused module's 3xTF32 build on warpgroup MMAs, MW_U_PAIRED in
# cuda/params.cuh) keeps U transposed, [alpha2][k_stride][c_stride], each 16 channels of a row in
# the order the GEMM's A fragments pair them (PAIRED_CHANNELS), so that every 16 bytes of a row
# are one core-matrix row of the tensor cores' B operand; "split_bf16" (the BF16x3 build on
# warpgroup MMAs, MW_SPLIT_OPERANDS) keeps V rows as split_bf16 words and U transposed, its rows
# likewise, so that both GEMM operands are K-major BF16 the tensor cores read from shared memory.
# "float32_u_transposed" (plans with GEMM_OUTPUT tasks, Params::u_transposed) keeps U as
# [alpha2][k_stride][c_stride] in channel order, so that a GEMM_OUTPUT task's B fragment of four
# consecutive channels is one 16-byte load.
OPERAND_FORMATS = ("float32", "float32_u_paired", "float32_u_transposed", "split_bf16")
# Stored position i of each 16 channels of a "float32_u_paired" U row holds channel
# PAIRED_CHANNELS[i] of them: position 8 q + l is the k8 step q's logical k l, which the A
# fragment (cuda/gemm_arithmetic.cuh Tf32x3::split_a_step) gives channel 4 (l % 4) + 2 q + l // 4.
PAIRED_CHANNELS = tuple(4 * (i % 4) + 2 * (i // 8) + (i // 4) % 2 for i in range(16))
_PAIRED_POSITIONS = [PAIRED_CHANNELS.index(c) for c in range(16)]   # the stored position of each channel


def filter_matrices(u, operand_format: str):
    """U (a NumPy or CuPy array, ``Layout.u_shape``) as [alpha2][c_stride][k_stride] float32
    matrices: a view of "float32" or "float32_u_transposed" U, a copy of "float32_u_paired" U in
    channel order (ValueError
    for "split_bf16": see unsplit_bf16)."""
    if operand_format == "float32":
        return u
    if operand_format == "float32_u_transposed":
        return u.transpose(0, 2, 1)
    if operand_format != "float32_u_paired":
        raise ValueError(f"no float32 filter matrices in operand format {operand_format!r}")
    alpha2, c_stride, k_stride = u.shape
    rows = u.reshape(alpha2, k_stride, c_stride // 16, 16)
    return rows[..., _PAIRED_POSITIONS].reshape(alpha2, k_stride, c_stride).transpose(0, 2, 1)


def bf16_round(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to nearest-even BF16, as uint16 bits (finite inputs)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def bf16_value(bits: np.ndarray) -> np.ndarray:
    """The float32 values of BF16 ``bits`` (uint16)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def split_bf16(rows: np.ndarray) -> np.ndarray:
    """Operand rows (float32 [..., channels]) in the split BF16 format, as uint32 words of the same
    shape: each x = hi + lo with hi its nearest-even BF16 and lo that of x - hi (exact in float32);
    a row is the hi parts of its channels (2 bytes each), then their lo parts."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    hi = bf16_round(rows)
    lo = bf16_round(rows - bf16_value(hi))
    return np.ascontiguousarray(np.concatenate([hi, lo], axis=-1)).view(np.uint32)


def unsplit_bf16(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) float32 [..., channels] of split BF16 ``words`` (uint32 or float32 [..., channels])."""
    halves = np.ascontiguousarray(words).view(np.uint16)
    c = halves.shape[-1] // 2
    return bf16_value(halves[..., :c]), bf16_value(halves[..., c:])


PARAM_FIELDS = (
    # device buffers (addresses)
    ("U", "float [alpha2][c_stride][k_stride]"),
    ("V", "float [alpha2][buffer_tiles][c_stride]"),
    ("Mbuf", "float [alpha2][buffer_tiles][k_stride]"),
    ("records", "int32 [num_tasks][REC_FIELDS]"),
    ("mapping", "int32 [num_tasks]: ticket -> task id"),
    ("ticket_records", "int32 [num_tasks][REC_FIELDS]: records[mapping], the megakernel's by ticket"),
    ("counters", "uint32 [num_counters * COUNTER_STRIDE]"),
    ("state", "int32 [STATE_WORDS]"),
    ("trace", "TraceRow [num_tasks] or 0"),
    # layer (megawino.core.spec.LayerSpec)
    ("N", ""), ("C", ""), ("K", ""), ("H", ""), ("W", ""), ("pad", ""),
    ("out_h", ""), ("out_w", ""),
    # layout and task sizes (megawino.core.tasks.Layout, TaskParams)
    ("tiles_h", ""), ("tiles_w", ""), ("tiles", ""), ("tiles_per_group", ""),
    ("buffer_groups", "groups whose rows V and M hold (a ring when fewer than all)"),
    ("buffer_tiles", "rows of V and M"), ("c_stride", ""), ("k_stride", ""),
    ("input_channels_per_task", ""), ("gemm_k_per_task", ""), ("k_blocks", ""),
    ("output_k_per_task", ""), ("filter_pairs_per_task", ""),
    ("input_tiles_per_task", ""), ("output_tiles_per_task", ""),
    ("num_tasks", ""), ("num_counters", ""),
    ("timeout_ns", "watchdog limit of one wait"),
    ("u_transposed", "1: the filter tasks write U as [alpha2][k_stride][c_stride] in channel order "
                     "(operand format float32_u_transposed: TaskParams.fused_output)"),
)

# The direct kernel's arguments: scalars (CuPy passes no structs), each a field of
# mw_direct::Params of the same name (cuda/direct_conv.cuh).
DIRECT_KERNEL_ARGS = (
    ("x", "const float* __restrict__"), ("wt", "const float* __restrict__"),
    ("table", "const int2* __restrict__"), ("y", "float* __restrict__"),
    *((name, "int") for name in ("C", "H", "W", "K", "R", "S", "OH", "OW", "M", "stride_h", "stride_w",
                                 "pad_h", "pad_w", "ktiles", "ldw", "vec_x")),
)


def direct_kernel_lines() -> list[str]:
    """``mw_direct_conv``: the direct kernel's entry point, its arguments DIRECT_KERNEL_ARGS
    copied into one mw_direct::Params (the tile sizes are cuda/direct.cu's MW_DIRECT_* defines)."""
    params = ", ".join(f"{c_type} {name}" for name, c_type in DIRECT_KERNEL_ARGS)
    return ['extern "C" __global__ void __launch_bounds__(MwDirectTile::THREADS, MW_DIRECT_MINBLOCKS)',
            f"mw_direct_conv({params}) {{",
            "  mw_direct::Params p;",
            "  " + " ".join(f"p.{name} = {name};" for name, _ in DIRECT_KERNEL_ARGS),
            "  mw_direct::conv_block<MW_DIRECT_BM, MW_DIRECT_BN, MW_DIRECT_BK, MW_DIRECT_TM, MW_DIRECT_TN,",
            "                        MW_DIRECT_NHWC != 0>(p);",
            "}", ""]


# Scheduler state: one word per 128-byte line, in this order.
STATE_LINES = ("HEAD", "EXIT", "ABORT", "BREAK", "STATUS")
# FLAG and the details describe the first timeout of the launch in flight; the last block to
# leave adds FLAG to FIRED (launches that fired, never reset) and clears FLAG, so a copy of this
# line taken after each launch tells the host which launch fired and why.
STATUS_FIELDS = ("FLAG", "TICKET", "TASK", "COUNTER", "VALUE", "NEED", "FIRED")


# One trace row per ticket (int64 each): the SM that ran it and three %globaltimer times (ns):
# ticket fetched, parents done (work starts), work done.
TRACE_FIELDS = ("sm", "fetch", "start", "end")
TRACE_DTYPE = np.dtype([(name, np.int64) for name in TRACE_FIELDS])


def state_offset(name: str) -> int:
    """Word offset of a state line (``HEAD`` ... ``STATUS``)."""
    return STATE_LINES.index(name) * COUNTER_STRIDE


STATE_WORDS = len(STATE_LINES) * COUNTER_STRIDE
if len(STATUS_FIELDS) > COUNTER_STRIDE:
    raise RuntimeError(f"the status line's {len(STATUS_FIELDS)} fields do not fit its {COUNTER_STRIDE} words")


def struct_lines(name: str, dtype: np.dtype, c_type: str, prefix: str, doc: str) -> list[str]:
    """A 16-byte-aligned C struct with the fields of ``dtype`` (all ``c_type``), the field
    indices as ``<prefix>_<FIELD>`` constants, and a static_assert on its size (the offsets:
    :func:`offset_asserts`)."""
    lines = [f"// {doc}", f"struct alignas(16) {name} {{ {c_type} {', '.join(dtype.names)}; }};"]
    indices = ", ".join(f"{prefix}_{field.upper()} = {i}" for i, field in enumerate(dtype.names))
    lines += [f"constexpr int {indices}, {prefix}_FIELDS = {len(dtype.names)};",
              f'static_assert(sizeof({name}) == {dtype.itemsize}, "{name}: the size of the NumPy dtype");']
    return lines + [""]


def offset_asserts(structs) -> list[str]:
    """static_asserts on the field offsets of ``(name, dtype)`` structs; NVRTC has no offsetof,
    so nvcc (the CPU build test) checks them."""
    lines = ["#ifndef __CUDACC_RTC__"]
    for name, dtype in structs:
        offsets = " && ".join(f"__builtin_offsetof({name}, {field}) == {dtype.fields[field][1]}"
                              for field in dtype.names)
        lines.append(f'static_assert({offsets}, "{name}: the field offsets of the NumPy dtype");')
    return lines + ["#endif", ""]


def header_lines() -> list[str]:
    lines = struct_lines("TaskRecord", TASK_RECORD_DTYPE, "int", "REC",
                         "One task record (megawino/core/tasks.py TASK_RECORD_DTYPE); -1 in wait_* / signal: "
                         "none.")
    lines += struct_lines("TraceRow", TRACE_DTYPE, "long long", "TRACE",
                          "One megakernel trace row per ticket (megawino/core/abi.py TRACE_DTYPE): SM id, "
                          "times in ns.")
    lines += offset_asserts((("TaskRecord", TASK_RECORD_DTYPE), ("TraceRow", TRACE_DTYPE)))
    lines += ["// Runtime parameters of one plan (megawino/core/abi.py PARAM_FIELDS).", "struct Params {"]
    for name, doc in PARAM_FIELDS:
        lines.append(f"  long long {name};" + (f"  // {doc}" if doc else ""))
    lines += ["};", "", "// Scheduler state words (megawino/core/abi.py STATE_LINES), one per 128-byte line."]
    lines.append("constexpr int " + ", ".join(f"STATE_{name} = {state_offset(name)}" for name in STATE_LINES)
                 + f", STATE_WORDS = {STATE_WORDS};")
    lines += ["constexpr int " + ", ".join(f"STATUS_{name} = {i}" for i, name in enumerate(STATUS_FIELDS)) + ";", ""]
    return lines
