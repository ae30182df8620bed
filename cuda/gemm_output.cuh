// GEMM_OUTPUT task (group g, index = K block; megawino.core.tasks TaskParams.fused_output):
//   y[tiles of g][K block] = A^T (V[p][tiles of g][:] @ U[p][:][K block], every position p) A
// Mirrors megawino/core/stages/gemm_output.py.  For a small C the GEMM and output tasks are bound
// by writing M and reading it back; this task keeps M in shared memory instead.  Per 16 tiles:
// each warp takes positions warp, warp + 8, ..., multiplies that position's 16 x C block of V by
// the K block's C x 32 block of U as 3xTF32 on mma.sync m16n8k8 in the GEMM tile's fragment order,
// split and 16-term partial sums (Tf32x3Fragments::multiply, so the products have the GEMM
// task's bits), and parks them in shared memory; after a block barrier each thread transforms
// (tile, channel) pairs with the output task's output_store_channel.  Each lane copies its own
// operand chunks of the next k tile (or of its next position's first) into the warp's stage with
// cp.async while the MMAs of this one run, so no register holds a load in flight; U is transposed
// so that each fragment is 16-byte chunks: C <= GEMM_OUTPUT_MAX_C_STRIDE keeps a position's
// fragments a handful of them.
#pragma once

#include "gemm.cuh"
#include "generated_tasks.cuh"
#include "output_transform.cuh"
#include "params.cuh"

namespace mw {

constexpr int GEMM_OUTPUT_NT = GEMM_OUTPUT_CHANNELS / 8;     // n8 blocks of a position's products
constexpr int GEMM_OUTPUT_POSITION_FLOATS = GEMM_OUTPUT_CHANNELS * GEMM_OUTPUT_TILES;
// Where the product of (channel, tile) waits in its position's plane, so that a warp's fragment
// stores (channels 8 nt + 2 t4 + h, tiles g + 8 i) and its output reads each touch 32 banks.
// NCHW reads two channels' 16 tiles: rows of 32 floats hold a channel pair's 16 tiles each, their
// columns XOR-swizzled by the pair's low two bits.  NHWC reads one tile's 32 channels: rows hold a
// tile's 32 channels, XOR-swizzled by the tile's low three bits.
template <bool NHWC>
__device__ __forceinline__ int gemm_output_slot(int ch, int tile) {
  if constexpr (NHWC) return tile * 32 + (ch ^ (((tile & 3) << 3) | ((tile >> 2) & 1)));
  return (ch >> 1) * 32 + ((((ch & 1) << 4) | tile) ^ (((ch >> 1) & 3) << 3));
}
static_assert(GEMM_OUTPUT_TILES == 16 && GEMM_OUTPUT_NT * 8 == GEMM_OUTPUT_CHANNELS && GEMM_OUTPUT_MAX_C_STRIDE % 16 == 0, "fragment tiling");
// Each lane's six 16-byte operand chunks of one k tile (V rows g and g + 8, U^T rows of the four
// n8 blocks), copied by cp.async while the MMAs of the previous k tile run: a warp's 3 KB after
// the products' planes.
constexpr int GEMM_OUTPUT_LANE_CHUNKS = 2 + GEMM_OUTPUT_NT;
constexpr int GEMM_OUTPUT_STAGE_FLOATS = 4 * GEMM_OUTPUT_LANE_CHUNKS * BLOCK_THREADS;
// The dynamic shared memory a launch that runs GEMM_OUTPUT tasks passes at least
// (megawino.gpu.nvrtc.GemmSmemKernel.reserve_gemm_output).
extern "C" __device__ int mw_gemm_output_smem_bytes =
    ((MW_M + 2) * (MW_M + 2) * GEMM_OUTPUT_POSITION_FLOATS + GEMM_OUTPUT_STAGE_FLOATS) * static_cast<int>(sizeof(float));

// Copies the 16-byte B chunk of k tile kt a thread's fragments take for column n from U^T (the
// plan's float32_u_transposed format) to the shared-window address dst: channels 4 t4 .. 4 t4 + 3
// of 16 kt ..., k8 step q's pair being the (2 q, 2 q + 1)-th of them; zeros for padding columns.
__device__ __forceinline__ void copy_gemm_output_b(unsigned dst, const float* Up, int c_stride, int k_stride, int kt,
                                                   int n, int t4) {
  const bool real = n < k_stride;
  cp_async_cg16_shared(dst, real ? Up + static_cast<long long>(n) * c_stride + 16 * kt + 4 * t4 : Up, real);
}

template <int M, bool NHWC>
__device__ __forceinline__ void gemm_output_task(const Params& p, float* y, int group, int index, float* smem) {
#if MW_GEMM_TF32X3 && !MW_SPLIT_OPERANDS
  constexpr int ALPHA2 = (M + 2) * (M + 2);
  const int tid = thread_index(), lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int c_stride = static_cast<int>(p.c_stride), k_stride = static_cast<int>(p.k_stride);
  const int K = static_cast<int>(p.K), tpg = static_cast<int>(p.tiles_per_group);
  const int k_tiles = c_stride / 16;
  const int k0 = index * GEMM_OUTPUT_CHANNELS;
  const long long t_group = static_cast<long long>(group) * tpg;
  const long long row_group = t_group - ring_shift(p, group);
  const float* V = reinterpret_cast<const float*>(p.V);
  const float* U = reinterpret_cast<const float*>(p.U);
  for (int sub = 0; sub < tpg && t_group + sub < p.tiles; sub += GEMM_OUTPUT_TILES) {
    // The lane's chunk r of a k tile at chunk r * 32 + lane of the warp's stage (conflict-free).
    const unsigned stage = smem_addr(smem + ALPHA2 * GEMM_OUTPUT_POSITION_FLOATS + warp * 32 * 4 * GEMM_OUTPUT_LANE_CHUNKS) +
                           16 * lane;
    const float4* stage_chunks = reinterpret_cast<const float4*>(smem + ALPHA2 * GEMM_OUTPUT_POSITION_FLOATS) +
                                 warp * 32 * GEMM_OUTPUT_LANE_CHUNKS + lane;
    auto copy_k_tile = [&](int pos, int kt) {
      const float* Vp = V + (static_cast<long long>(pos) * p.buffer_tiles + row_group + sub) * c_stride + 4 * t4 + 16 * kt;
      const float* Up = U + static_cast<long long>(pos) * c_stride * k_stride;
      cp_async_cg16_shared(stage, Vp + g * c_stride, true);
      cp_async_cg16_shared(stage + 16 * 32, Vp + (g + 8) * c_stride, true);
#pragma unroll
      for (int nt = 0; nt < GEMM_OUTPUT_NT; ++nt)
        copy_gemm_output_b(stage + 16 * 32 * (2 + nt), Up, c_stride, k_stride, kt, k0 + 8 * nt + g, t4);
      cp_async_commit();
    };
#ifdef MW_GEMM_FREE   // a diagnostic build (cuda/diagnostics.cuh): no products
    (void)copy_k_tile, (void)stage_chunks, (void)k_tiles;
    diagnostics::gemm_output_products_free<ALPHA2, GEMM_OUTPUT_POSITION_FLOATS>(V, p.buffer_tiles, row_group + sub,
                                                                                 c_stride, index, smem);
#else
    if (warp < ALPHA2) copy_k_tile(warp, 0);
    for (int pos = warp; pos < ALPHA2; pos += BLOCK_THREADS / 32) {
      float acc[GEMM_OUTPUT_NT][4];
#pragma unroll
      for (int nt = 0; nt < GEMM_OUTPUT_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll 1
      for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<0>();
        const float4 a0 = stage_chunks[0];
        const float4 a8 = stage_chunks[32];
        float4 b[GEMM_OUTPUT_NT];
#pragma unroll
        for (int nt = 0; nt < GEMM_OUTPUT_NT; ++nt) b[nt] = stage_chunks[32 * (2 + nt)];
        // The next copy overwrites these chunks: it is issued after the splits below consume them.
        const int next_pos = kt + 1 < k_tiles ? pos : pos + BLOCK_THREADS / 32;
        const int next_kt = kt + 1 < k_tiles ? kt + 1 : 0;
        float part[GEMM_OUTPUT_NT][4];
        // The small products of both k8 steps, then the big ones (cuda/gemm_arithmetic.cuh),
        // whose parts are split again from the chunks in registers rather than kept.
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          unsigned a_big[1][4], a_small[1][4], b_big[GEMM_OUTPUT_NT][2], b_small[GEMM_OUTPUT_NT][2];
          Tf32x3::split_a_step(a0, a8, q, a_big[0], a_small[0]);
#pragma unroll
          for (int nt = 0; nt < GEMM_OUTPUT_NT; ++nt) {
            Tf32x3::split(q == 0 ? b[nt].x : b[nt].z, b_big[nt][0], b_small[nt][0]);
            Tf32x3::split(q == 0 ? b[nt].y : b[nt].w, b_big[nt][1], b_small[nt][1]);
          }
          if (q == 0) small_products<true>(part, a_big, a_small, b_big, b_small, mma_tf32, mma_tf32_zero);
          else small_products<false>(part, a_big, a_small, b_big, b_small, mma_tf32, mma_tf32_zero);
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          unsigned a_big[1][4], b_big[GEMM_OUTPUT_NT][2];
          Tf32x3::big_a_step(a0, a8, q, a_big[0]);
#pragma unroll
          for (int nt = 0; nt < GEMM_OUTPUT_NT; ++nt) {
            b_big[nt][0] = Tf32x3::big(q == 0 ? b[nt].x : b[nt].z);
            b_big[nt][1] = Tf32x3::big(q == 0 ? b[nt].y : b[nt].w);
          }
          if (q == 1 && next_pos < ALPHA2) copy_k_tile(next_pos, next_kt);
          big_products(part, a_big, b_big, mma_tf32);
        }
        add_partial_sums(acc, part);
      }
      // C fragment: tiles g and g + 8, channels 2 t4 and 2 t4 + 1 of each n8 block.
      float* Mp = smem + pos * GEMM_OUTPUT_POSITION_FLOATS;
#pragma unroll
      for (int nt = 0; nt < GEMM_OUTPUT_NT; ++nt) {
        const int ch = 8 * nt + 2 * t4;
        Mp[gemm_output_slot<NHWC>(ch, g)] = acc[nt][0];
        Mp[gemm_output_slot<NHWC>(ch + 1, g)] = acc[nt][1];
        Mp[gemm_output_slot<NHWC>(ch, g + 8)] = acc[nt][2];
        Mp[gemm_output_slot<NHWC>(ch + 1, g + 8)] = acc[nt][3];
      }
    }
#endif
    __syncthreads();
#ifndef MW_TRANSFORMS_FREE   // a diagnostic build (cuda/diagnostics.cuh): no output transform
    // NHWC: a warp's lanes take consecutive channels of a tile (y's contiguous dimension); NCHW:
    // consecutive tiles of a channel.
    for (int pair = tid; pair < GEMM_OUTPUT_TILES * GEMM_OUTPUT_CHANNELS; pair += BLOCK_THREADS) {
      const int ch = NHWC ? pair % GEMM_OUTPUT_CHANNELS : pair / GEMM_OUTPUT_TILES;
      const int tile = NHWC ? pair / GEMM_OUTPUT_CHANNELS : pair % GEMM_OUTPUT_TILES;
      const long long t = t_group + sub + tile;
      if (t < p.tiles && k0 + ch < K) {
        float mm[ALPHA2];
#pragma unroll
        for (int q = 0; q < ALPHA2; ++q) mm[q] = smem[q * GEMM_OUTPUT_POSITION_FLOATS + gemm_output_slot<NHWC>(ch, tile)];
        output_store_channel<M, NHWC>(p, y, mm, tile_coord(p, t), k0 + ch);
      }
    }
#endif
    __syncthreads();
  }
#else
  // Planned only for 3xTF32 on float32 operands (megawino.gpu.winograd_plan checks).
  (void)p, (void)y, (void)group, (void)index, (void)smem;
  __trap();
#endif
}

}  // namespace mw
