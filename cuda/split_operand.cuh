// How the transforms store one GEMM operand value (V by the input transform, U by the filter
// transform): a float, or under MW_SPLIT_OPERANDS its split BF16 parts, hi (x rounded to
// nearest-even) and lo (x - hi, rounded): a row of c_stride words holds the hi parts of its
// channels (2 bytes each), then their lo parts.  Mirrors megawino.core.abi.split_bf16.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "gemm_arithmetic.cuh"
#include "ptx.cuh"

namespace mw {

static_assert(CHANNEL_ALIGN % 2 == 0, "operand rows hold whole channel pairs");

// Channel c of the operand row at `row` (c_stride words) holds x; STREAMING stores a float32
// operand with the evict-first hint (the split BF16 parts are stored plainly).
template <bool STREAMING = false>
__device__ __forceinline__ void store_operand(float* row, int c_stride, int c, float x) {
#if MW_SPLIT_OPERANDS
  const unsigned parts = Bf16x3::split(x);
  unsigned short* const halves = reinterpret_cast<unsigned short*>(row);
  st_global_b16(halves + c, static_cast<unsigned short>(parts & 0xFFFFu));
  st_global_b16(halves + c_stride + c, static_cast<unsigned short>(parts >> 16));
#else
  (void)c_stride;
  if constexpr (STREAMING) st_global_streaming(row + c, x);
  else st_global(row + c, x);
#endif
}

// Channels c and c + 1 (c even) of the operand row at `row` hold x0 and x1: whole words.
__device__ __forceinline__ void store_operand_pair(float* row, int c_stride, int c, float x0, float x1) {
#if MW_SPLIT_OPERANDS
  const unsigned p0 = Bf16x3::split(x0), p1 = Bf16x3::split(x1);
  unsigned* const words = reinterpret_cast<unsigned*>(row);
  st_global_u32(words + c / 2, (p0 & 0xFFFFu) | (p1 << 16));
  st_global_u32(words + (c_stride + c) / 2, (p0 >> 16) | (p1 & 0xFFFF0000u));
#else
  *reinterpret_cast<float2*>(row + c) = make_float2(x0, x1);
#endif
}

// Every lane of a warp holds channel c of the operand row at `row`, lanes l and l ^ 1 the
// channels c and c ^ 1 of one row; lanes with `store` store theirs (a pair stores or skips
// together).  Split operands: the even lane writes the pair's hi parts, the odd lane their lo
// parts, one word each, so a warp stores as many words as float32 operands take.
__device__ __forceinline__ void store_operand_warp(float* row, int c_stride, int c, float x, bool store) {
#if MW_SPLIT_OPERANDS
  const unsigned mine = Bf16x3::split(x);
  const unsigned other = __shfl_xor_sync(0xFFFFFFFFu, mine, 1);
  const bool odd = (c & 1) != 0;
  const unsigned word = odd ? (other >> 16) | (mine & 0xFFFF0000u) : (mine & 0xFFFFu) | (other << 16);
  if (store) st_global_u32(reinterpret_cast<unsigned*>(row) + (odd ? (c_stride + c - 1) / 2 : c / 2), word);
#else
  (void)c_stride;
  if (store) st_global(row + c, x);
#endif
}

// Which operand format this build's transforms write, for the host (megawino.gpu.nvrtc.operand_format).
extern "C" __device__ int mw_split_operands = MW_SPLIT_OPERANDS;

}  // namespace mw
