// The FFMA family: warp-level fragments of the multistage mainloop (cuda/gemm_multistage.cuh)
// that multiply with one FFMA chain per output element (MW_GEMM_TF32X3=0, MW_GEMM_BF16X3=0).
#pragma once

#include "gemm_config.cuh"
#include "gemm_multistage.cuh"

namespace mw {

// FFMA fragments of a ROWS x 64 tile: thread (tr, tc) owns rows tr + 16 i and columns
// tc * 4 + [0, 4); a warp is 4 row-threads x 8 column-threads, so each LDS.128 of a warp reads
// 4 distinct A addresses and 8 consecutive B vectors (128 bytes).  A rows are padded to 20
// floats so that the four rows a warp reads at one time hit distinct banks; every tile keeps the
// 128-row stage size.  One __fmaf_rn per k in order (zero-filled k beyond c_stride adds +0).
template <int ROWS>
struct FfmaFragments {
  static constexpr int A_STRIDE = GEMM_BK + 4;
  static constexpr int A_STAGE = GEMM_BM * A_STRIDE;
  static constexpr bool SWIZZLE_B = false;
  // GEMM_STAGES A stages of 128 padded rows (for every ROWS), then GEMM_STAGES B stages (16 x 64).
  struct Stages {
    float A[GEMM_STAGES][A_STAGE];
    float B[GEMM_STAGES][GEMM_BK * GEMM_BN];
  };
  static __device__ __forceinline__ float* a_stage(float* const& smem, int stage) {
    return reinterpret_cast<Stages*>(smem)->A[stage];
  }
  static __device__ __forceinline__ float* b_stage(float* const& smem, int stage) {
    return reinterpret_cast<Stages*>(smem)->B[stage];
  }
  static constexpr int MI = ROWS / 16;
  static constexpr int ACC_ROWS = MI;   // acc[i]: row tr + 16 i, columns tc * 4 + [0, 4)
  using Acc = float[ACC_ROWS][4];

  // %tid.x through thread_index, as Tf32x3Fragments: hoisted out of the megakernel's ticket loop,
  // the tile's tid-derived offsets spill on sm_86 and sm_89 (m=4 NHWC).
  static __device__ __forceinline__ int tid() { return thread_index(); }

  int tr, tc;
  __device__ __forceinline__ FfmaFragments(int lane, int warp)
      : tr((warp >> 1) * 4 + (lane >> 3)), tc((warp & 1) * 8 + (lane & 7)) {}

  __device__ __forceinline__ void multiply(Acc& acc, const float* As, const float* Bs) const {
#pragma unroll
    for (int kk = 0; kk < GEMM_BK; kk += 4) {
      float4 a[MI], b[4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        a[i] = *reinterpret_cast<const float4*>(As + (tr + 16 * i) * A_STRIDE + kk);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        b[j] = *reinterpret_cast<const float4*>(Bs + (kk + j) * GEMM_BN + tc * 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          const float av = j == 0 ? a[i].x : j == 1 ? a[i].y : j == 2 ? a[i].z : a[i].w;
          acc[i][0] = __fmaf_rn(av, b[j].x, acc[i][0]);
          acc[i][1] = __fmaf_rn(av, b[j].y, acc[i][1]);
          acc[i][2] = __fmaf_rn(av, b[j].z, acc[i][2]);
          acc[i][3] = __fmaf_rn(av, b[j].w, acc[i][3]);
        }
      }
    }
  }

  template <bool ROW_BOUND>
  __device__ __forceinline__ void store(const Acc& acc, float* Mp, long long row0, int col0, int col_end,
                                        int k_stride, long long row_end) const {
    if (col0 + tc * 4 < col_end) {
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const long long row = row0 + tr + 16 * i;
        if (ROW_BOUND && row >= row_end) continue;
        float* dst = Mp + row * k_stride + col0 + tc * 4;
        *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      }
    }
  }
};

using FfmaMainloop = MultistageMainloop<FfmaFragments>;

}  // namespace mw
