// The mma.sync family: warp-level fragments of the multistage mainloop (cuda/gemm_multistage.cuh)
// on m16n8k8 TF32 or m16n8k16 BF16 tensor-core MMAs, for the 3xTF32 and BF16x3 arithmetics
// (cuda/gemm_arithmetic.cuh).  Every GPU from sm_80 on runs it; sm_90a runs the wgmma family's
// tiles instead where they exist (the pointwise kernels of the BF16x3 build stay here).
#pragma once

#include "gemm_arithmetic.cuh"
#include "gemm_config.cuh"
#include "gemm_multistage.cuh"

namespace mw {

// 3xTF32 fragments of a ROWS x 64 tile: warps own 32 x 32 (ROWS 128: 4 x 2 warps) or 32 x 16
// (ROWS 64: 2 x 4 warps) blocks of m16n8k8 MMAs.  Each operand is split into two TF32 parts and
// big*big + big*small + small*big of every 16-term k tile is summed on the tensor cores from
// zero, then added to the fp32 accumulator with one round-to-nearest FADD, so the tensor core's
// own accumulation (not round-to-nearest) spans 16 terms only.  A rows are unpadded (16 floats:
// a quarter-warp's 128-bit reads cover 32 banks) and B chunks swizzled.
template <int ROWS>
struct Tf32x3Fragments {
  static constexpr int A_STRIDE = GEMM_BK;
  static constexpr int A_STAGE = ROWS * A_STRIDE;
  static constexpr bool SWIZZLE_B = true;
  // GEMM_STAGES A stages of ROWS rows, then GEMM_STAGES B stages (16 x 64).
  static __device__ __forceinline__ float* a_stage(float* const& smem, int stage) { return smem + stage * A_STAGE; }
  static __device__ __forceinline__ float* b_stage(float* const& smem, int stage) {
    return smem + GEMM_STAGES * A_STAGE + stage * (GEMM_BK * GEMM_BN);
  }
  static constexpr int MT = 2;   // m16 blocks per warp
  static constexpr int WARPS_M = ROWS / (16 * MT);
  static constexpr int WARPS_N = BLOCK_THREADS / 32 / WARPS_M;
  static constexpr int NT = GEMM_BN / 8 / WARPS_N;   // n8 blocks per warp
  static constexpr int ACC_ROWS = MT * NT;           // acc[mt * NT + nt]: the C fragment of block (mt, nt)
  static_assert(WARPS_M * WARPS_N * 32 == BLOCK_THREADS && NT * 8 * WARPS_N == GEMM_BN, "warp grid covers the tile");
  static_assert(GEMM_BK == 16, "a thread's A fragment is one float4 per row and k tile");
  using Acc = float[ACC_ROWS][4];

  // %tid.x through thread_index, so that the tile's tid-derived offsets are not hoisted out of
  // the megakernel's ticket loop.
  static __device__ __forceinline__ int tid() { return thread_index(); }

  int g, t4, warp_row, warp_col;
  __device__ __forceinline__ Tf32x3Fragments(int lane, int warp)
      : g(lane >> 2), t4(lane & 3), warp_row((warp % WARPS_M) * (16 * MT)), warp_col((warp / WARPS_M) * (8 * NT)) {}

  // acc += As @ Bs of one k tile.
  __device__ __forceinline__ void multiply(Acc& acc, const float* As, const float* Bs) const {
    // Thread (g, t4) holds k 4 t4 .. 4 t4 + 3 of rows g and g + 8 (one float4 each): MMA q takes
    // k 4 t4 + 2 q as its column t4 and k 4 t4 + 2 q + 1 as its column t4 + 4, B rows likewise.
    // Per k8 the products of a row block are issued product by product, so NT independent MMAs
    // separate two that accumulate into the same registers.
    float part[MT * NT][4];
    float4 a_vec[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        a_vec[mt][h] = *reinterpret_cast<const float4*>(As + (warp_row + 16 * mt + 8 * h + g) * A_STRIDE + 4 * t4);
    // The small products of both k8 steps, then the big ones (cuda/gemm_arithmetic.cuh), one
    // m16 row block at a time: its A parts and both steps' B big parts fit the registers, and
    // B is split again for each row block rather than kept.
    auto b_row = [&](int q, int nt) {
      const int n = warp_col + 8 * nt + g;
      // Rows 4 t4 + 2 q and 4 t4 + 2 q + 1 share row 4 t4's swizzle.
      return Bs + (4 * t4 + 2 * q) * GEMM_BN + ((swizzled_b_chunk(4 * t4, n >> 2) << 2) | (n & 3));
    };
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      unsigned a_big[2][1][4], b_big[2][NT][2];
#pragma unroll
      for (int q = 0; q < GEMM_BK / 8; ++q) {
        unsigned a_small[1][4], b_small[NT][2];
        Tf32x3::split_a_step(a_vec[mt][0], a_vec[mt][1], q, a_big[q][0], a_small[0]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float* bp = b_row(q, nt);
          Tf32x3::split(bp[0], b_big[q][nt][0], b_small[nt][0]);
          Tf32x3::split(bp[GEMM_BN], b_big[q][nt][1], b_small[nt][1]);
        }
        float (&row_part)[NT][4] = *reinterpret_cast<float (*)[NT][4]>(&part[mt * NT]);
        if (q == 0) small_products<true>(row_part, a_big[q], a_small, b_big[q], b_small, mma_tf32, mma_tf32_zero);
        else small_products<false>(row_part, a_big[q], a_small, b_big[q], b_small, mma_tf32, mma_tf32_zero);
      }
#pragma unroll
      for (int q = 0; q < GEMM_BK / 8; ++q)
        big_products(*reinterpret_cast<float (*)[NT][4]>(&part[mt * NT]), a_big[q], b_big[q], mma_tf32);
    }
    add_partial_sums(acc, part);
  }

  // Rows >= row_end are not stored where ROW_BOUND (the pointwise kernel's last row tile).
  template <bool ROW_BOUND>
  __device__ __forceinline__ void store(const Acc& acc, float* Mp, long long row0, int col0, int col_end,
                                        int k_stride, long long row_end) const {
    // C fragment: rows g and g + 8, columns 2 t4 and 2 t4 + 1 of each (mt, nt) block.  col_end
    // is a multiple of K_ALIGN (4), so a column pair is wholly inside or wholly outside.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = col0 + warp_col + 8 * nt + 2 * t4;
        const long long row = row0 + warp_row + 16 * mt + g;
        if (col < col_end) {
          const float* a = acc[mt * NT + nt];
          float* dst = Mp + row * k_stride + col;
          if (!ROW_BOUND || row < row_end) *reinterpret_cast<float2*>(dst) = make_float2(a[0], a[1]);
          if (!ROW_BOUND || row + 8 < row_end)
            *reinterpret_cast<float2*>(dst + 8 * k_stride) = make_float2(a[2], a[3]);
        }
      }
  }
};

// BF16x3 fragments of a ROWS x 64 tile (the TF32-grade arithmetic): the warp grid, the shared
// memory stages and the loads of Tf32x3Fragments, one m16n8k16 BF16 MMA per k tile and product.
// Each operand is split into BF16 hi (rounded to nearest) and lo (the remainder, rounded), and
// lo*hi + hi*lo + hi*hi of every 16-term k tile is summed on the tensor cores from zero, then added
// to the fp32 accumulator with one round-to-nearest FADD; the dropped lo*lo and the roundings
// leave about 2^-16 relative per product.  The thread's float4 of k 4 t4 .. 4 t4 + 3 is the MMA's
// k pair (2 t4, 2 t4 + 1) (its first two values) and pair (2 t4 + 8, 2 t4 + 9) (its last two); B
// rows likewise.
template <int ROWS>
struct Bf16x3Fragments : Tf32x3Fragments<ROWS> {
  using Base = Tf32x3Fragments<ROWS>;
  using Base::MT;
  using Base::NT;
  using typename Base::Acc;
  __device__ __forceinline__ Bf16x3Fragments(int lane, int warp) : Base(lane, warp) {}

  __device__ __forceinline__ void multiply(Acc& acc, const float* As, const float* Bs) const {
    const int g = this->g, t4 = this->t4;
    unsigned a_hi[MT][4], a_lo[MT][4], b_hi[NT][2], b_lo[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float* row = As + (this->warp_row + 16 * mt + g) * Base::A_STRIDE + 4 * t4;
      const float4 r0 = *reinterpret_cast<const float4*>(row);
      const float4 r8 = *reinterpret_cast<const float4*>(row + 8 * Base::A_STRIDE);
      Bf16x3::split_pair(r0.x, r0.y, a_hi[mt][0], a_lo[mt][0]);
      Bf16x3::split_pair(r8.x, r8.y, a_hi[mt][1], a_lo[mt][1]);
      Bf16x3::split_pair(r0.z, r0.w, a_hi[mt][2], a_lo[mt][2]);
      Bf16x3::split_pair(r8.z, r8.w, a_hi[mt][3], a_lo[mt][3]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = this->warp_col + 8 * nt + g;
      // Rows 4 t4 .. 4 t4 + 3 share row 4 t4's swizzle.
      const float* bp = Bs + 4 * t4 * GEMM_BN + ((swizzled_b_chunk(4 * t4, n >> 2) << 2) | (n & 3));
      Bf16x3::split_pair(bp[0], bp[GEMM_BN], b_hi[nt][0], b_lo[nt][0]);
      Bf16x3::split_pair(bp[2 * GEMM_BN], bp[3 * GEMM_BN], b_hi[nt][1], b_lo[nt][1]);
    }
    float part[MT * NT][4];
    split_products<true>(part, a_hi, a_lo, b_hi, b_lo, mma_bf16, mma_bf16_zero);
    add_partial_sums(acc, part);
  }
};

using MmaSyncTf32x3Mainloop = MultistageMainloop<Tf32x3Fragments>;
using MmaSyncBf16x3Mainloop = MultistageMainloop<Bf16x3Fragments>;

}  // namespace mw
