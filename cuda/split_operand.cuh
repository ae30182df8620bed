// How the transforms store one GEMM operand value (V by the input transform, U by the filter
// transform): a float, or under MW_SPLIT_OPERANDS its split BF16 parts, hi (x rounded to
// nearest-even) and lo (x - hi, rounded), in chunks of SPLIT_CHUNK_CHANNELS channels: the chunk's
// hi parts (16 bytes), then its lo parts (16 bytes).  Mirrors megawino.core.abi.split_bf16.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

// Channel c of an operand row that starts at `row` (c_stride words) holds x.
__device__ __forceinline__ void store_operand(float* row, int c, float x) {
#if MW_SPLIT_OPERANDS
  const unsigned short hi = bf16_rn(x);
  const unsigned short lo = bf16_rn(x - bf16_value(hi));
  unsigned short* const h =
      reinterpret_cast<unsigned short*>(row) + 2 * SPLIT_CHUNK_CHANNELS * (c / SPLIT_CHUNK_CHANNELS) + c % SPLIT_CHUNK_CHANNELS;
  st_global_b16(h, hi);
  st_global_b16(h + SPLIT_CHUNK_CHANNELS, lo);
#else
  st_global(row + c, x);
#endif
}

// Which operand format this build's transforms write, for the host (megawino.gpu.nvrtc.operand_format).
extern "C" __device__ int mw_split_operands = MW_SPLIT_OPERANDS;

}  // namespace mw
