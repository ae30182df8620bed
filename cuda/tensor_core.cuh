// Operand formats of the tensor-core GEMM, shared by the tile (gemm.cuh) and the filter
// transform that writes U pre-split (MW_U_SPLIT).  Mirrors megawino/core/tensor_core.py.
#pragma once

namespace mw {

// x = big + small, both TF32 bit patterns (low 13 mantissa bits zero): big rounds x to nearest
// (ties away, as cvt.rna.tf32.f32, in two integer ops: x is finite), small = x - big (exact in
// fp32) truncated.  big*big + big*small + small*big carry x*y to about 2^-21 relative
// (small*small is dropped).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
}

// Channels of one k tile of the wgmma GEMM: the blocks of a split U row.
constexpr int U_SPLIT_BLOCK = 16;

// The channel a split U row keeps at stored position s: within each block of 16, position
// 4 j + i holds channel 4 i + j, so that one 16-byte chunk is one row of a wgmma core matrix
// (channels j, j + 4, j + 8, j + 12: the k the A fragment pairs with core half j & 1 of k8
// step j >> 1, gemm_tile_wgmma).  Its own inverse.
__device__ __forceinline__ int u_channel_order(int s) { return (s & ~15) | ((s & 3) << 2) | ((s >> 2) & 3); }

}  // namespace mw
