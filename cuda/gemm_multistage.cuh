// The multistage mainloop of the mma.sync and FFMA families: every thread copies fixed 16-byte
// chunks of each k tile into the cp.async ring, GEMM_STAGES - 1 k tiles ahead of the one being
// multiplied, and the family's warp-level Fragments (cuda/gemm_mma_sync.cuh, cuda/gemm_ffma.cuh)
// multiply each stage into registers and store the tile.  A Fragments type says where its stages
// are (a_stage, b_stage: A rows of A_STRIDE floats, B rows of 64 with the chunks at
// swizzled_b_chunk when SWIZZLE_B), its accumulator (Acc, ACC_ROWS rows of 4) and tid().
#pragma once

#include "gemm_config.cuh"

namespace mw {

// Where a swizzled stage keeps 16-byte chunk `chunk` of B row k: the chunks are XOR-swizzled by
// (k >> 2) & 3, so that a warp's fragment reads (rows 4 t4 + 2 q, t4 = 0..3) hit 32 distinct
// banks without padding.
__device__ __forceinline__ int swizzled_b_chunk(int k, int chunk) { return chunk ^ (2 * ((k >> 2) & 3)); }

template <template <int> class Fragments>
struct MultistageMainloop {
  // One ROWS x 64 output tile: rows [row0, row0 + ROWS) of Vp / Mp, columns [col0, col0 + 64) of
  // Up / Mp, columns >= col_end predicated off (and rows >= row_end where ROW_BOUND: the
  // pointwise kernel's operands are the user's tensors, which have no padding rows); k beyond
  // c_stride and columns >= col_end are zero-filled.
  template <int ROWS, bool ROW_BOUND = false>
  static __device__ __forceinline__ void tile(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                              long long row0, int col0, int col_end, int c_stride, int k_stride,
                                              long long row_end = 0) {
    using F = Fragments<ROWS>;
    constexpr int B_STAGE = GEMM_BK * GEMM_BN;
    static_assert(GEMM_STAGES * (F::A_STAGE + B_STAGE) <= static_cast<int>(sizeof(GemmSmem) / sizeof(float)),
                  "stages fit");
    float* const smem = sm.floats;
    auto a_stage = [&](int stage) { return F::a_stage(smem, stage); };
    auto b_stage = [&](int stage) { return F::b_stage(smem, stage); };
    constexpr int A_CHUNKS = ROWS * (GEMM_BK / 4);              // 16-byte chunks per stage
    constexpr int A_PER_THREAD = A_CHUNKS / BLOCK_THREADS;      // 2 or 1
    static_assert(A_CHUNKS % BLOCK_THREADS == 0, "A chunks");
    const int tid = F::tid();
    const int lane = tid & 31, warp = tid >> 5;

    int a_row[A_PER_THREAD], a_ch[A_PER_THREAD];
#pragma unroll
    for (int r = 0; r < A_PER_THREAD; ++r) {
      const int id = tid + r * BLOCK_THREADS;
      a_row[r] = id >> 2;
      a_ch[r] = (id & 3) * 4;
    }
    const int b_k = tid >> 4;            // 0..15
    const int b_col = (tid & 15) * 4;    // 0..60
    const bool b_col_ok = col0 + b_col < col_end;
    const int b_dst_col = F::SWIZZLE_B ? swizzled_b_chunk(b_k, b_col >> 2) << 2 : b_col;
    const float* a_src[A_PER_THREAD];
#pragma unroll
    for (int r = 0; r < A_PER_THREAD; ++r) a_src[r] = Vp + (row0 + a_row[r]) * c_stride + a_ch[r];
    const float* b_src = Up + static_cast<long long>(b_k) * k_stride + col0 + b_col;
    const int k_tiles = (c_stride + GEMM_BK - 1) / GEMM_BK;
    const F frag(lane, warp);
    typename F::Acc acc;
#pragma unroll
    for (int i = 0; i < F::ACC_ROWS; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    auto load_stage = [&](int kt, int stage) {
      const int kbase = kt * GEMM_BK;
#pragma unroll
      for (int r = 0; r < A_PER_THREAD; ++r) {
        const bool ok = kbase + a_ch[r] < c_stride && (!ROW_BOUND || row0 + a_row[r] < row_end);
        cp_async_cg16(&a_stage(stage)[a_row[r] * F::A_STRIDE + a_ch[r]], ok ? a_src[r] + kbase : Vp, ok);
      }
      const bool ok = b_col_ok && kbase + b_k < c_stride;
      cp_async_cg16(&b_stage(stage)[b_k * GEMM_BN + b_dst_col],
                    ok ? b_src + static_cast<long long>(kbase) * k_stride : Up, ok);
    };

    cp_async_pipeline<GEMM_STAGES>(k_tiles, load_stage, [](int) {},
                                   [&](int stage) { frag.multiply(acc, a_stage(stage), b_stage(stage)); });
    frag.template store<ROW_BOUND>(acc, Mp, row0, col0, col_end, k_stride, row_end);
  }

};

}  // namespace mw
