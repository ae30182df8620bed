// The wgmma family for BF16x3 (sm_90a: MW_SPLIT_OPERANDS), on operands the transforms have
// already split into BF16 parts (cuda/split_operand.cuh).
#pragma once

#include "gemm_arithmetic.cuh"
#include "gemm_config.cuh"
#include "gemm_wgmma.cuh"

#if MW_SPLIT_OPERANDS
namespace mw {

// BF16x3 on warpgroup MMAs from split operands (sm_90a): V rows and U^T rows (megawino.core.abi
// split_bf16) arrive through the cp.async ring already split, so the tensor cores read all four
// parts from shared memory and no thread touches an operand.  A tile is ROWS (128 or 64) x COLS
// (128 or 64): the block's two warpgroups own its 64-row halves, or the 64-column halves of a
// 64-row tile; each multiplies 64 columns at a time (m64n64k16; m64n32k16 on a 64 x 64 tile).
// The wider tile copies a task's V rows once per 128 columns instead of once per 64.  Per
// 16-k sub-tile the tensor cores add lo*hi, hi*lo and hi*hi straight into the fp32 accumulator
// (no partial sums: the same bits for every tile shape, mapping and kernel, but not those of the
// mma.sync BF16x3 tile, Bf16x3Fragments, which the other GPUs and the pointwise kernels run).
namespace split_tile {
constexpr int SUBTILES = WGMMA_BK / GEMM_BK;
constexpr int PIECE_CHANNELS = 8;                        // channels of one 16-byte BF16 copy
constexpr int PIECES = WGMMA_BK / PIECE_CHANNELS;        // of a row's part per stage
// A part (hi or lo) keeps row r's stage (WGMMA_BK BF16, 64 bytes) at r * ROW_BYTES, its piece c
// at c ^ ((r / 2) % 4) (wgmma's 64-byte swizzle, so that the tensor cores read a row group's
// pieces from distinct banks).
constexpr unsigned ROW_BYTES = WGMMA_BK * 2;
constexpr unsigned ROW_BLOCK_BYTES = 8 * ROW_BYTES;     // one 8-row group
constexpr unsigned SUBTILE_BYTES = GEMM_BK * 2;         // k offset of sub-tile 1 in a row
constexpr unsigned A_PART_BYTES = GEMM_BM * ROW_BYTES;
__host__ __device__ constexpr unsigned b_part_bytes(int cols) { return cols * ROW_BYTES; }
__host__ __device__ constexpr unsigned stage_bytes(int cols) { return 2 * (A_PART_BYTES + b_part_bytes(cols)); }
// The ring holds SPLIT_STAGES stages of a 64-column tile, or as many of a 128-column one.
constexpr unsigned RING_BYTES = SPLIT_STAGES * stage_bytes(GEMM_BN);
static_assert(RING_BYTES == SPLIT_STAGES * SPLIT_STAGE_FLOATS * 4 && PIECES == 4 &&
              CHANNEL_ALIGN % PIECE_CHANNELS == 0 && RING_BYTES / stage_bytes(2 * GEMM_BN) >= 2,
              "stage layout");
}  // namespace split_tile

template <int ROWS, int COLS>
__device__ __forceinline__ void gemm_tile_wgmma_bf16x3(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                                       long long row0, int col0, int col_end, int c_stride,
                                                       int k_stride) {
  using namespace split_tile;
  constexpr int WARPGROUPS = BLOCK_THREADS / 128;
  constexpr int WARPGROUPS_M = ROWS / 64;
  constexpr int WG_N = COLS / (WARPGROUPS / WARPGROUPS_M);   // columns of a warpgroup
  constexpr int MMA_N = WG_N < 64 ? WG_N : 64;               // columns of one MMA
  constexpr int WARPS = BLOCK_THREADS / 32;
  constexpr int A_UNITS = ROWS / 8 * 2 / WARPS;     // (8-row group, part) units of A per warp and stage
  constexpr int B_UNITS = COLS / 8 * 2 / WARPS;
  constexpr unsigned B_PART_BYTES = b_part_bytes(COLS);
  constexpr unsigned STAGE_BYTES = stage_bytes(COLS);
  constexpr int STAGES = RING_BYTES / STAGE_BYTES;
  static_assert(A_UNITS * WARPS == ROWS / 4 && B_UNITS * WARPS == COLS / 4 && (MMA_N == 64 || MMA_N == 32),
                "tile shape");
  const int tid = thread_index();
  const int lane = tid & 31, warp = tid >> 5;
  const unsigned smem = (smem_addr(sm.floats) + 511u) & ~511u;

  // Copies: unit u = warp + WARPS i is part u % 2 of rows 8 (u / 2) .. + 7, lane l its row l / 4,
  // piece l % 4 (a quarter warp reads two rows' 64 contiguous bytes: whole sectors).  WARPS is
  // even, so a thread's units share the part and step by WARPS / 2 row groups.  A row's hi
  // parts are its first c_stride BF16, its lo parts the next c_stride.
  const int part = warp & 1, piece = lane & 3;
  const int unit_row = 8 * (warp >> 1) + (lane >> 2);   // row of unit i = 0
  constexpr int UNIT_ROWS = 8 * WARPS / 2;               // rows between a thread's units
  const unsigned dst = unit_row * ROW_BYTES + ((piece ^ ((unit_row >> 1) & 3)) << 4);
  const int src_word = part * (c_stride / 2) + 4 * piece;   // 4 words = one piece of BF16
  const float* a_src = Vp + (row0 + unit_row) * c_stride + src_word;
  const float* b_src = Up + static_cast<long long>(col0 + unit_row) * c_stride + src_word;
  const long long unit_step = static_cast<long long>(UNIT_ROWS) * c_stride;
  const int b_rows_left = col_end - col0 - unit_row;   // of this thread's B unit 0
  const unsigned a_dst = smem + part * A_PART_BYTES + dst;
  const unsigned b_dst = smem + 2 * A_PART_BYTES + part * B_PART_BYTES + dst;
  int k_left = c_stride;   // k from the next copied tile on
  auto load_stage = [&](int, int stage) {
    const bool k_ok = k_left > PIECE_CHANNELS * piece;
    const float* a = a_src;   // stepped, not indexed: fewer live 64-bit addresses
#pragma unroll
    for (int i = 0; i < A_UNITS; ++i, a += unit_step)
      cp_async_cg16_shared(a_dst + stage * STAGE_BYTES + i * UNIT_ROWS * ROW_BYTES, k_ok ? a : Vp, k_ok);
    const float* b = b_src;
#pragma unroll
    for (int i = 0; i < B_UNITS; ++i, b += unit_step) {
      const bool ok = k_ok && i * UNIT_ROWS < b_rows_left;
      cp_async_cg16_shared(b_dst + stage * STAGE_BYTES + i * UNIT_ROWS * ROW_BYTES, ok ? b : Up, ok);
    }
    a_src += WGMMA_BK / 2;   // words: WGMMA_BK BF16
    b_src += WGMMA_BK / 2;
    k_left -= WGMMA_BK;
  };

  // The warpgroup's operands: A rows 64 (wg % WARPGROUPS_M) .., B rows (columns) WG_N (wg / WARPGROUPS_M) ..
  const int wg = warp >> 2;
  const unsigned a_base = smem + (wg % WARPGROUPS_M) * 8 * ROW_BLOCK_BYTES;
  const unsigned b_base = smem + 2 * A_PART_BYTES + (wg / WARPGROUPS_M) * (WG_N / 8) * ROW_BLOCK_BYTES;
  auto desc = [](unsigned address) { return wgmma_desc_swizzle64(address, ROW_BLOCK_BYTES); };
  // One MMA of the A and B parts at these shared-memory addresses.
  auto mma = [&](float (&d)[MMA_N / 2], unsigned a, unsigned b, int accumulate) {
    if constexpr (MMA_N == 64) wgmma_bf16_m64n64k16(d, desc(a), desc(b), accumulate);
    else wgmma_bf16_m64n32k16(d, desc(a), desc(b), accumulate);
  };
  float acc[WG_N / 2];
#pragma unroll
  for (int i = 0; i < WG_N / 2; ++i) acc[i] = 0.0f;
  const int k_tiles = (c_stride + WGMMA_BK - 1) / WGMMA_BK;
  int k_rest = c_stride;   // k from this stage on
  // The tensor cores read the copied stages without a proxy fence (cp.async lands in shared
  // memory for them as for loads; a fence here would also wait for the copies still in flight).
  cp_async_pipeline<STAGES>(k_tiles, load_stage, [](int) {}, [&](int stage) {
    wgmma_fence();
#pragma unroll 1   // unrolled, the NHWC megakernel spills under the 128-register cap
    for (int sub = 0; sub < SUBTILES; ++sub) {
      // A sub-tile wholly past c_stride adds nothing (and adding its +0 products could flip a -0).
      if (k_rest <= sub * GEMM_BK) break;
      const unsigned a_hi = a_base + stage * STAGE_BYTES + sub * SUBTILE_BYTES, a_lo = a_hi + A_PART_BYTES;
#pragma unroll
      for (int n0 = 0; n0 < WG_N; n0 += MMA_N) {
        const unsigned b_hi = b_base + (n0 / 8) * ROW_BLOCK_BYTES + stage * STAGE_BYTES + sub * SUBTILE_BYTES;
        const unsigned b_lo = b_hi + B_PART_BYTES;
        float (&d)[MMA_N / 2] = *reinterpret_cast<float(*)[MMA_N / 2]>(acc + n0 / 2);
        split_products(mma, d, a_hi, a_lo, b_hi, b_lo, 1);
      }
    }
    wgmma_commit();
    wgmma_wait_all();   // before the barrier after which the next copy overwrites this stage
    fence_operands(acc);
    k_rest -= WGMMA_BK;
  });
  const int g = lane >> 2, t4 = lane & 3;
  const int warp_row = (wg % WARPGROUPS_M) * 64 + 16 * (warp & 3);
  const int warp_col = (wg / WARPGROUPS_M) * WG_N;
  store_wgmma_acc<WG_N, false>(acc, Mp, row0 + warp_row + g, col0 + warp_col + 2 * t4, col_end, k_stride, 0);
}

struct WgmmaSplitBf16x3Mainloop {
  template <int ROWS, int COLS>
  static __device__ __forceinline__ void tile(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                              long long row0, int col0, int col_end, int c_stride, int k_stride) {
    gemm_tile_wgmma_bf16x3<ROWS, COLS>(sm, Vp, Up, Mp, row0, col0, col_end, c_stride, k_stride);
  }
};

}  // namespace mw
#endif  // MW_SPLIT_OPERANDS
