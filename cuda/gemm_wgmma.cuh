// The wgmma family (sm_90a: MW_GEMM_WGMMA) for 3xTF32: warpgroup MMAs whose B operand the tensor
// cores read from shared memory.  The BF16x3 build's wgmma tile, on operands the transforms have
// already split, is cuda/gemm_wgmma_split.cuh.
#pragma once

#include "gemm_arithmetic.cuh"
#include "gemm_config.cuh"

#if MW_GEMM_WGMMA
namespace mw {

// The C fragments of a warpgroup MMA's WG_N columns (n8 block nb: rows g and g + 8, columns
// 8 nb + 2 t4 and 8 nb + 2 t4 + 1) to Mp; columns >= col_end (and rows >= row_end where
// ROW_BOUND) are not stored.
template <int WG_N, bool ROW_BOUND>
__device__ __forceinline__ void store_wgmma_acc(const float (&acc)[WG_N / 2], float* Mp, long long row, int col,
                                                int col_end, int k_stride, long long row_end) {
#pragma unroll
  for (int nb = 0; nb < WG_N / 8; ++nb, col += 8) {
    if (col < col_end) {
      float* dst = Mp + row * k_stride + col;
      if (!ROW_BOUND || row < row_end) *reinterpret_cast<float2*>(dst) = make_float2(acc[4 * nb], acc[4 * nb + 1]);
      if (!ROW_BOUND || row + 8 < row_end)
        *reinterpret_cast<float2*>(dst + 8 * k_stride) = make_float2(acc[4 * nb + 2], acc[4 * nb + 3]);
    }
  }
}

// The end of a sub-tile's MMAs into part (issued from zero): wait for them, then acc += part with
// one round-to-nearest FADD per element (the 16-term partial sums every GEMM tile adds).
template <int N>
__device__ __forceinline__ void add_wgmma_part(float (&acc)[N], float (&part)[N]) {
  wgmma_commit();
  wgmma_wait_all();
  fence_operands(part);
  add_partial_sums(acc, part);
}

}  // namespace mw
#endif  // MW_GEMM_WGMMA

#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
namespace mw {

// 3xTF32 on warpgroup MMAs (sm_90a).  The block's two warpgroups own 64-row halves of a 128 x 64
// tile (m64n64k8) or 32-column halves of a 64 x 64 tile (m64n32k8).  A (V rows) comes through
// the cp.async ring and goes into registers, read and split as in Tf32x3Fragments; the tensor
// cores read B from shared memory as the big and small parts of wgmma's unswizzled K-major core
// matrices, split once per block and stage, or (U in the paired format, MW_U_PAIRED) of B rows
// in the 128-byte swizzle, which each thread splits in place from its own copies.  Products and their order per element are those of
// Tf32x3Fragments: each 16-term sub-tile is summed from zero on the tensor cores, then added to
// the fp32 accumulator with one round-to-nearest FADD (which makes the results bitwise those of
// the mma.sync build).
namespace wgmma_tile {
constexpr int SUBTILES = WGMMA_BK / GEMM_BK;
constexpr int A_STAGE = GEMM_BM * WGMMA_BK;
constexpr int B_STAGE = WGMMA_BK * GEMM_BN;
constexpr int SPLIT_STEP = GEMM_BN * 8;        // floats of one k8 step of one part
constexpr int SPLIT_PART = 2 * SPLIT_STEP;     // one part (big or small) of a 16-k sub-tile
constexpr int SPLIT_SUBTILE = 2 * SPLIT_PART;  // both parts of a sub-tile
constexpr unsigned CORE_K_BYTES = 8 * 4 * 4;       // next 4 k of the same 8 columns
constexpr unsigned CORE_N_BYTES = 2 * 8 * 4 * 4;   // next 8 columns
// Shared memory: the split B of a stage, then the stages (A, then B, each; GemmSmem).
static_assert((MW_U_PAIRED ? B_STAGE : SUBTILES * SPLIT_SUBTILE) == WGMMA_SPLIT_FLOATS && A_STAGE + B_STAGE == WGMMA_STAGE_FLOATS,
              "layout");
static_assert(GEMM_BK == 16 && WGMMA_BK % GEMM_BK == 0 && BLOCK_THREADS == 4 * GEMM_BN,
              "each thread splits 4 k of one B column per sub-tile");
// A rows are WGMMA_BK = 8 chunks of 16 bytes; chunk c of row r sits at c ^ a_swizzle(r), so that
// a quarter warp's fragment reads (rows g = 0, 1, four chunks each) hit 32 distinct banks.
__device__ __forceinline__ int a_swizzle(int row) { return (row & 1) << 2; }
}  // namespace wgmma_tile

template <int ROWS, bool ROW_BOUND = false>
__device__ __forceinline__ void gemm_tile_wgmma(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                                long long row0, int col0, int col_end, int c_stride,
                                                int k_stride, long long row_end = 0) {
  using namespace wgmma_tile;
  constexpr int WARPGROUPS = BLOCK_THREADS / 128;
  constexpr int WARPGROUPS_M = ROWS / 64;
  constexpr int WG_N = GEMM_BN / (WARPGROUPS / WARPGROUPS_M);   // columns of one warpgroup's MMA
  constexpr int A_CHUNKS = ROWS * (WGMMA_BK / 4);
  constexpr int A_PER_THREAD = A_CHUNKS / BLOCK_THREADS;
  constexpr int B_PER_THREAD = B_STAGE / 4 / BLOCK_THREADS;
  static_assert(A_CHUNKS % BLOCK_THREADS == 0 && B_PER_THREAD == SUBTILES && (WG_N == 64 || WG_N == 32),
                "tile shape");
  float* const split = sm.floats;
  float* const a_stages = split + WGMMA_SPLIT_FLOATS;   // stage s at s * WGMMA_STAGE_FLOATS
  float* const b_stages = a_stages + A_STAGE;
  const int tid = thread_index();
  const int lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int warp_row = ((warp >> 2) % WARPGROUPS_M) * 64 + 16 * (warp & 3);
  const int warp_col = ((warp >> 2) / WARPGROUPS_M) * WG_N;

  // Copies: chunk r of an A stage is row tid / 8 + r * A_ROW_STEP, k 4 (tid % 8) .. + 3 (a
  // warp copies 4 whole 128-byte rows); B chunk r is k row tid / 16 + 16 r, columns
  // (tid % 16) * 4 .. + 3.  The ring asks for k tiles in order 0, 1, 2, ...: the sources
  // advance by one k tile a call.
  constexpr int A_ROW_STEP = BLOCK_THREADS / 8;   // rows between a thread's chunks
  const int a_chunk = tid & 7, a_row0 = tid >> 3;
  const float* a_src = Vp + (row0 + a_row0) * c_stride + 4 * a_chunk;
  const long long a_src_step = static_cast<long long>(A_ROW_STEP) * c_stride;
  // A_ROW_STEP is even: every chunk of the thread has row a_row0's swizzle.
  const unsigned a_dst = smem_addr(a_stages + a_row0 * WGMMA_BK + 4 * (a_chunk ^ a_swizzle(a_row0)));
  static_assert(A_ROW_STEP % 2 == 0, "one swizzle per thread");
#if MW_U_PAIRED
  // B rows are U's rows (the tile's columns; the paired format: a stage is 32 stored k, 128
  // bytes) in wgmma's 128-byte swizzle, 16-byte chunk u of row n at u ^ (n % 8): thread tid
  // copies chunk tid % 8 of rows tid / 8 + B_ROW_STEP r (a quarter warp one whole row, as the
  // copies of the A rows) and splits those chunks itself.
  constexpr int B_ROW_STEP = BLOCK_THREADS / 8;
  constexpr unsigned B_ROW_BYTES = WGMMA_BK * 4;
  const int b_chunk = tid & 7, b_row = tid >> 3;
  const float* b_src = Up + static_cast<long long>(col0 + b_row) * c_stride + 4 * b_chunk;
  const long long b_src_step = static_cast<long long>(B_ROW_STEP) * c_stride;
  const int b_rows_left = col_end - col0 - b_row;
  const unsigned b_chunk_offset = b_row * B_ROW_BYTES + 16 * (b_chunk ^ (b_row & 7));   // in a stage
  const unsigned b_dst = smem_addr(b_stages) + b_chunk_offset;
  static_assert(B_ROW_STEP % 8 == 0 && B_ROW_STEP * B_PER_THREAD == GEMM_BN, "one swizzle per thread");
  auto b_chunk_at = [&](int stage, int r) { return b_dst + stage * WGMMA_STAGE_FLOATS * 4 + r * B_ROW_STEP * B_ROW_BYTES; };
#else
  const int b_k = tid >> 4, b_col = (tid & 15) * 4;
  const bool b_col_ok = col0 + b_col < col_end;
  const float* b_src = Up + static_cast<long long>(b_k) * k_stride + col0 + b_col;
  const unsigned b_dst = smem_addr(b_stages + b_k * GEMM_BN + b_col);
  const long long b_sub_step = static_cast<long long>(GEMM_BK) * k_stride;
#endif
  int k_next = c_stride;   // k from the next copied tile on (the paired build derives it from kt)
  auto load_stage = [&](int kt, int stage) {
    const int k_left = U_PAIRED ? c_stride - kt * WGMMA_BK : k_next;
#pragma unroll
    for (int r = 0; r < A_PER_THREAD; ++r) {
      const bool ok = k_left > 4 * a_chunk && (!ROW_BOUND || row0 + a_row0 + r * A_ROW_STEP < row_end);
      cp_async_cg16_shared(a_dst + (stage * WGMMA_STAGE_FLOATS + r * A_ROW_STEP * WGMMA_BK) * 4, ok ? a_src + r * a_src_step : Vp,
                           ok);
    }
    a_src += WGMMA_BK;
#if MW_U_PAIRED
#pragma unroll
    for (int r = 0; r < B_PER_THREAD; ++r) {
      const bool ok = k_left > 4 * b_chunk && B_ROW_STEP * r < b_rows_left;
      cp_async_cg16_shared(b_chunk_at(stage, r), ok ? b_src + r * b_src_step : Up, ok);
    }
    b_src += WGMMA_BK;
#else
#pragma unroll
    for (int r = 0; r < B_PER_THREAD; ++r) {
      const bool ok = b_col_ok && k_left > b_k + GEMM_BK * r;
      cp_async_cg16_shared(b_dst + (stage * WGMMA_STAGE_FLOATS + r * GEMM_BK * GEMM_BN) * 4, ok ? b_src + r * b_sub_step : Up,
                           ok);
    }
    b_src += SUBTILES * b_sub_step;
#endif
    k_next -= WGMMA_BK;
  };
#if MW_U_PAIRED
  // Split: each thread its own chunks, in place (big) and at the same offset of `split` (small).
  const unsigned split_small = smem_addr(split) + b_chunk_offset;
  auto split_stage = [&](int stage) {
#pragma unroll
    for (int r = 0; r < B_PER_THREAD; ++r) {
      const unsigned at = b_chunk_at(stage, r);
      const float4 raw = lds_f32x4(at);
      unsigned big[4], small[4];
      Tf32x3::split(raw.x, big[0], small[0]);
      Tf32x3::split(raw.y, big[1], small[1]);
      Tf32x3::split(raw.z, big[2], small[2]);
      Tf32x3::split(raw.w, big[3], small[3]);
      sts_u32x4(at, big[0], big[1], big[2], big[3]);
      sts_u32x4(split_small + r * B_ROW_STEP * B_ROW_BYTES, small[0], small[1], small[2], small[3]);
    }
    fence_proxy_async_smem();
  };
  // k8 step `step` (2 sub + q) of the warpgroup's columns: +32 bytes within the swizzled rows.
  const unsigned b_big_base = smem_addr(b_stages) + warp_col * B_ROW_BYTES;
  const unsigned b_small_base = smem_addr(split) + warp_col * B_ROW_BYTES;
  auto b_descs = [&](int stage, int step, unsigned long long& big, unsigned long long& small) {
    big = wgmma_desc_swizzle128(b_big_base + stage * WGMMA_STAGE_FLOATS * 4 + step * 32);
    small = wgmma_desc_swizzle128(b_small_base + step * 32);
  };
#else
  // Split: thread (column n, phase j) takes B rows 4 kc + j, kc = 0..3, of each sub-tile.  The A
  // fragment pairs k 4 t4 + 2 q (column t4 of k8 step q) with k 4 t4 + 2 q + 1 (column t4 + 4),
  // so row 4 kc + j is k column kc of core half j & 1 in step j >> 1: one 16-byte core-matrix
  // row per part.
  const int n = tid % GEMM_BN, j = tid / GEMM_BN;
  float* const split_row = split + (j >> 1) * SPLIT_STEP + (n >> 3) * 64 + (j & 1) * 32 + (n & 7) * 4;
  auto split_stage = [&](int stage) {
#pragma unroll
    for (int sub = 0; sub < SUBTILES; ++sub) {
      const float* raw = b_stages + stage * WGMMA_STAGE_FLOATS + (sub * GEMM_BK + j) * GEMM_BN + n;
      unsigned big[4], small[4];
#pragma unroll
      for (int kc = 0; kc < 4; ++kc) Tf32x3::split(raw[4 * kc * GEMM_BN], big[kc], small[kc]);
      float* const dst = split_row + sub * SPLIT_SUBTILE;
      *reinterpret_cast<uint4*>(dst) = make_uint4(big[0], big[1], big[2], big[3]);
      *reinterpret_cast<uint4*>(dst + SPLIT_PART) = make_uint4(small[0], small[1], small[2], small[3]);
    }
    fence_proxy_async_smem();
  };
  const unsigned split_base = smem_addr(split + (warp_col >> 3) * 64);
  auto b_descs = [&](int, int step, unsigned long long& big, unsigned long long& small) {
    const unsigned at = split_base + ((step >> 1) * SPLIT_SUBTILE + (step & 1) * SPLIT_STEP) * 4;
    big = wgmma_desc(at, CORE_K_BYTES, CORE_N_BYTES);
    small = wgmma_desc(at + SPLIT_PART * 4, CORE_K_BYTES, CORE_N_BYTES);
  };
#endif
  auto mma = [](float (&d)[WG_N / 2], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    if constexpr (WG_N == 64) wgmma_tf32_m64n64k8(d, a, b, accumulate);
    else wgmma_tf32_m64n32k8(d, a, b, accumulate);
  };

  const int k_tiles = (c_stride + WGMMA_BK - 1) / WGMMA_BK;
  float acc[WG_N / 2];
#pragma unroll
  for (int i = 0; i < WG_N / 2; ++i) acc[i] = 0.0f;
  // The warp's A fragments (rows g and g + 8, k 4 t4 .. + 3 of a sub-tile): sub-tile 0's read
  // before the B split and split after it (the stage is complete after the first barrier), so
  // that their shared-memory latency hides behind it; the next sub-tile's once the previous
  // one's MMAs are done with the registers.
  const int a_row = warp_row + g;
  const int a_col = 4 * t4, a_sw = 4 * a_swizzle(a_row);
  float4 a_raw[2];
  unsigned a_big[2][4], a_small[2][4];
  auto read_a = [&](int stage, int sub) {
    const float* As = a_stages + stage * WGMMA_STAGE_FLOATS + a_row * WGMMA_BK + ((sub * GEMM_BK + a_col) ^ a_sw);
    a_raw[0] = *reinterpret_cast<const float4*>(As);
    a_raw[1] = *reinterpret_cast<const float4*>(As + 8 * WGMMA_BK);
  };
  auto split_a = [&] {
#pragma unroll
    for (int q = 0; q < 2; ++q) Tf32x3::split_a_step(a_raw[0], a_raw[1], q, a_big[q], a_small[q]);
  };
  auto prepare = [&](int stage) {
    read_a(stage, 0);
    split_stage(stage);
    split_a();
  };
  int k_rest = c_stride;   // k from this stage on
  cp_async_pipeline<WGMMA_STAGES>(k_tiles, load_stage, prepare, [&](int stage) {
    __syncthreads();   // the split stage complete for the tensor cores
#pragma unroll
    for (int sub = 0; sub < SUBTILES; ++sub) {
      // A sub-tile wholly past c_stride adds nothing (and an FADD of +0 could flip a -0).
      if (sub > 0) {
        if (k_rest <= sub * GEMM_BK) break;
        read_a(stage, sub);
        split_a();
      }
      float part[WG_N / 2];
      unsigned long long b_big[2], b_small[2];
#pragma unroll
      for (int q = 0; q < 2; ++q) b_descs(stage, 2 * sub + q, b_big[q], b_small[q]);
      wgmma_fence();
      tf32x3_products(mma, part, a_big, a_small, b_big, b_small);
      add_wgmma_part(acc, part);
    }
    k_rest -= WGMMA_BK;
  });
  store_wgmma_acc<WG_N, ROW_BOUND>(acc, Mp, row0 + warp_row + g, col0 + warp_col + 2 * t4, col_end, k_stride, row_end);
}

struct WgmmaTf32x3Mainloop {
  template <int ROWS, bool ROW_BOUND = false>
  static __device__ __forceinline__ void tile(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                              long long row0, int col0, int col_end, int c_stride, int k_stride,
                                              long long row_end = 0) {
    gemm_tile_wgmma<ROWS, ROW_BOUND>(sm, Vp, Up, Mp, row0, col0, col_end, c_stride, k_stride, row_end);
  }
};

}  // namespace mw
#endif  // MW_GEMM_WGMMA && MW_GEMM_TF32X3
