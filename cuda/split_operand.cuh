// How the transforms store one GEMM operand value (V by the input transform, U by the filter
// transform): a float, or under MW_SPLIT_OPERANDS its split BF16 parts, hi (x rounded to
// nearest-even) and lo (x - hi, rounded): a row of c_stride words holds the hi parts of its
// channels (2 bytes each), then their lo parts.  Mirrors megawino.core.abi.split_bf16.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

// Channel c of the operand row at `row` (c_stride words) holds x.
__device__ __forceinline__ void store_operand(float* row, int c_stride, int c, float x) {
#if MW_SPLIT_OPERANDS
  const unsigned short hi = bf16_rn(x);
  const unsigned short lo = bf16_rn(x - bf16_value(hi));
  unsigned short* const halves = reinterpret_cast<unsigned short*>(row);
  st_global_b16(halves + c, hi);
  st_global_b16(halves + c_stride + c, lo);
#else
  (void)c_stride;
  st_global(row + c, x);
#endif
}

// Which operand format this build's transforms write, for the host (megawino.gpu.nvrtc.operand_format).
extern "C" __device__ int mw_split_operands = MW_SPLIT_OPERANDS;

}  // namespace mw
