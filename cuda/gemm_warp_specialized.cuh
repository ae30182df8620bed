// The warp-specialized batched GEMM (sm_90a, 3xTF32): M[a] = V[a] @ U[a] for every Winograd
// position a, with one block per SM that loops over (position, row tile, column tile) work items
// strided by blockIdx.  Warpgroup 0 is the producer: it only copies, the tile's V rows and the big
// and small TF32 parts of 128 U rows (U split once ahead, as prepared weights are: the paired
// format, float32_u_paired, U transposed with each 16 channels in the A fragments' pairing order),
// BK channels a stage, into a ring of STAGES shared-memory stages; each copy arrives on the
// stage's full mbarrier when it lands (cp.async.mbarrier.arrive), so every stage of the ring can
// be in flight at once.  The other WS_CONSUMER_WARPGROUPS warpgroups (2: 128-row tiles, 3:
// 192-row tiles) are the consumers, each owning 64 rows of the tile's 128 columns (m64n128k8;
// 64 columns and m64n64k8 for a column tile of <= 64 columns): A (V) from shared memory into
// registers, split there; B's parts read by the tensor cores from shared memory.  They free a
// stage on its empty mbarrier once their MMAs are done with it.  setmaxnreg leaves the producer
// PRODUCER_REGS registers and gives the rest to the consumers.  The arithmetic is that of
// cuda/gemm_wgmma.cuh, product by product: each 16-term sub-tile is summed from zero on the tensor
// cores (the small products of both k8 steps, then the big ones), then added to the fp32
// accumulator with one round-to-nearest FADD, so M is bitwise the non-fused GEMM stage's.  Every
// mbarrier wait is bounded: a wait that outlasts WAIT_NS writes which block, role and stage was
// stuck to the report word and the warp leaves the kernel.
#pragma once

#include "gemm_wgmma.cuh"

namespace mw {
// The block: one producer warpgroup and WS_CONSUMER_WARPGROUPS consumer warpgroups of 64 rows each
// (every target knows the block's size: the kernel's launch bounds).
#ifndef WS_CONSUMER_WARPGROUPS
#define WS_CONSUMER_WARPGROUPS 2
#endif
constexpr int WS_THREADS = 128 * (1 + WS_CONSUMER_WARPGROUPS);
}  // namespace mw

#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
namespace mw {
namespace ws {

constexpr int CONSUMER_WARPGROUPS = WS_CONSUMER_WARPGROUPS;
constexpr int THREADS = WS_THREADS;     // producer warpgroup + the consumer warpgroups
constexpr int BM = 64 * CONSUMER_WARPGROUPS, BN = 128;   // block tile: rows (tiles of V and M) x columns (K)
constexpr int BK = 32;                  // channels a stage: one 128-byte row of A and of B
constexpr int STAGES = 4;
// Registers after reallocation: the producer's least without spilling, the rest to the consumers.
constexpr int PRODUCER_REGS = 32;
constexpr int CONSUMER_REGS_LEFT = (65536 - 128 * PRODUCER_REGS) / (128 * CONSUMER_WARPGROUPS) / 8 * 8;
constexpr int CONSUMER_REGS = CONSUMER_REGS_LEFT < 232 ? CONSUMER_REGS_LEFT : 232;   // setmaxnreg takes multiples of 8
constexpr int ROW_BYTES = BK * 4;
constexpr int A_BYTES = BM * ROW_BYTES, B_PART_BYTES = BN * ROW_BYTES;
constexpr int STAGE_BYTES = A_BYTES + 2 * B_PART_BYTES;   // A, B big, B small
constexpr int BARRIER_BYTES = 2 * STAGES * 8;             // full[STAGES], empty[STAGES]
constexpr int CONSUMER_WARPS = 4 * CONSUMER_WARPGROUPS;
constexpr long long WAIT_NS = 2000000000ll;               // a wait this long is a hang
static_assert(128 * PRODUCER_REGS + 128 * CONSUMER_WARPGROUPS * CONSUMER_REGS <= 65536, "register file");
static_assert(STAGE_BYTES % 1024 == 0 && A_BYTES % 1024 == 0, "the 128-byte swizzle's stages start 1024-byte aligned");

// Report word: 0 while fine, else STUCK | block << 8 | role << 4 | stage.
constexpr unsigned STUCK = 0x80000000u;
constexpr unsigned ROLE_PRODUCER = 1, ROLE_CONSUMER = 2;

// Waits, warp-uniformly, for the phase of `parity` of the mbarrier at `bar`; false (after writing
// the report word) once WAIT_NS have passed.
__device__ __forceinline__ bool wait_phase(unsigned bar, unsigned parity, unsigned* report, unsigned role, int stage) {
  if (__all_sync(0xFFFFFFFFu, mbarrier_try_wait(bar, parity))) return true;
  const long long start = __shfl_sync(0xFFFFFFFFu, global_timer_ns(), 0);
  for (unsigned i = 1;; ++i) {
    if (__all_sync(0xFFFFFFFFu, mbarrier_try_wait(bar, parity))) return true;
    if ((i & 1023) == 0 && __shfl_sync(0xFFFFFFFFu, global_timer_ns(), 0) - start > WAIT_NS) {
      if ((threadIdx.x & 31) == 0)
        atomicCAS(report, 0u, STUCK | (blockIdx.x << 8) | (role << 4) | static_cast<unsigned>(stage));
      return false;
    }
  }
}

// The work items: position-major, then row tiles, column tiles innermost (the blocks running at
// once share V rows and one position's U in the L2).
struct Items {
  int row_tiles, col_tiles, count;
  __device__ Items(int alpha2, int rows, int k_stride)
      : row_tiles((rows + BM - 1) / BM), col_tiles((k_stride + BN - 1) / BN), count(alpha2 * row_tiles * col_tiles) {}
  __device__ void at(int item, int& alpha, int& row0, int& col0) const {
    col0 = (item % col_tiles) * BN;
    const int rest = item / col_tiles;
    row0 = (rest % row_tiles) * BM;
    alpha = rest / row_tiles;
  }
};

struct Problem {
  const float* V;   // [alpha2][v rows][c_stride]
  const float* U_big;     // [alpha2][k_stride][c_stride], the paired format's big TF32 parts
  const float* U_small;   // and its small parts (Tf32x3::split)
  float* M;         // [alpha2][m rows][k_stride]
  int alpha2, rows, c_stride, k_stride;
  long long v_alpha_stride, m_alpha_stride;   // floats between positions
};

// Producer thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 r (r = 0..7) of A and of both
// B parts (a quarter warp one whole 128-byte row); A chunk c of row n sits at c ^ 4 (n % 2) (the
// consumers' fragment reads hit distinct banks), B chunk c at c ^ (n % 8) (wgmma's 128-byte
// swizzle).
__device__ __forceinline__ void produce(const Problem& pb, unsigned ring, unsigned bars, unsigned* report) {
  setmaxnreg_dec<PRODUCER_REGS>();
  const int t = threadIdx.x;
  const int chunk = t & 7, row_in = t >> 3;
  const unsigned a_off = row_in * ROW_BYTES + 16 * (chunk ^ ((row_in & 1) << 2));
  const unsigned b_off = A_BYTES + row_in * ROW_BYTES + 16 * (chunk ^ (row_in & 7));
  constexpr unsigned ROW_STEP = 16 * ROW_BYTES;   // 16 rows: the swizzles repeat
  const Items items(pb.alpha2, pb.rows, pb.k_stride);
  const int k_tiles = (pb.c_stride + BK - 1) / BK;
  int fill = 0;
  for (int item = blockIdx.x; item < items.count; item += gridDim.x) {
    int alpha, row0, col0;
    items.at(item, alpha, row0, col0);
    const float* a_src = pb.V + alpha * pb.v_alpha_stride + static_cast<long long>(row0 + row_in) * pb.c_stride + 4 * chunk;
    const long long b_first = static_cast<long long>(alpha) * pb.k_stride * pb.c_stride +
                              static_cast<long long>(col0 + row_in) * pb.c_stride + 4 * chunk;
    const float* b_big = pb.U_big + b_first;
    const float* b_small = pb.U_small + b_first;
    const long long src_step = 16ll * pb.c_stride;
    const int a_rows_left = pb.rows - row0 - row_in, b_rows_left = pb.k_stride - col0 - row_in;
    for (int kt = 0; kt < k_tiles; ++kt, ++fill) {
      const int stage = fill % STAGES;
      if (fill >= STAGES &&
          !wait_phase(bars + 8 * (STAGES + stage), ((fill / STAGES) - 1) & 1, report, ROLE_PRODUCER, stage))
        return;
      const bool k_ok = pb.c_stride - kt * BK > 4 * chunk;
      const unsigned a_dst = ring + stage * STAGE_BYTES + a_off, b_dst = ring + stage * STAGE_BYTES + b_off;
#pragma unroll
      for (int r = 0; r < BM / 16; ++r) {
        const bool ok = k_ok && 16 * r < a_rows_left;
        cp_async_cg16_shared(a_dst + r * ROW_STEP, ok ? a_src + r * src_step : pb.V, ok);
      }
#pragma unroll
      for (int r = 0; r < BN / 16; ++r) {
        const bool ok = k_ok && 16 * r < b_rows_left;
        cp_async_cg16_shared(b_dst + r * ROW_STEP, ok ? b_big + r * src_step : pb.U_big, ok);
        cp_async_cg16_shared(b_dst + B_PART_BYTES + r * ROW_STEP, ok ? b_small + r * src_step : pb.U_small, ok);
      }
      cp_async_mbarrier_arrive(bars + 8 * stage);
      a_src += BK;
      b_big += BK;
      b_small += BK;
    }
  }
  cp_async_wait<0>();   // the copies land before the warpgroup leaves
}

// One consumer warpgroup's 64 x N part of a tile: rows 64 wg + 16 warp + g (and + 8), k
// 4 t4 .. + 3 of each sub-tile, read and split as in cuda/gemm_wgmma.cuh.
template <int N>
__device__ __forceinline__ bool consume_tile(const Problem& pb, unsigned ring, unsigned bars, unsigned* report,
                                             int& fill, int alpha, int row0, int col0, int wg_row) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int a_row = wg_row + 16 * ((threadIdx.x >> 5) & 3) + g;
  const int a_sw = 16 * (a_row & 1);   // rows a_row and a_row + 8 share the swizzle
  const int k_tiles = (pb.c_stride + BK - 1) / BK;
  auto mma = [](float (&d)[N / 2], const unsigned (&a)[4], unsigned long long b, int accumulate) {
    if constexpr (N == 128) wgmma_tf32_m64n128k8(d, a, b, accumulate);
    else wgmma_tf32_m64n64k8(d, a, b, accumulate);
  };
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  for (int kt = 0; kt < k_tiles; ++kt, ++fill) {
    const int stage = fill % STAGES;
    if (!wait_phase(bars + 8 * stage, (fill / STAGES) & 1, report, ROLE_CONSUMER, stage)) return false;
    fence_proxy_async_smem();   // cp.async wrote B through the generic proxy; the tensor cores read it
    const unsigned a_stage = ring + stage * STAGE_BYTES;
    const unsigned b_big = a_stage + A_BYTES;
#pragma unroll
    for (int sub = 0; sub < BK / GEMM_BK; ++sub) {
      // A sub-tile wholly past c_stride adds nothing (and an FADD of +0 could flip a -0).
      if (sub > 0 && pb.c_stride - kt * BK <= sub * GEMM_BK) break;
      const unsigned at = a_stage + 4 * (a_row * BK + ((sub * GEMM_BK + 4 * t4) ^ a_sw));
      const float4 r0 = lds_f32x4(at), r8 = lds_f32x4(at + 8 * ROW_BYTES);
      unsigned a_big[2][4], a_small[2][4];
#pragma unroll
      for (int q = 0; q < 2; ++q) Tf32x3::split_a_step(r0, r8, q, a_big[q], a_small[q]);
      float part[N / 2];
      unsigned long long b_big_desc[2], b_small_desc[2];
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const unsigned step = 32 * (2 * sub + q);   // k8 step: 32 bytes into the swizzled rows
        b_big_desc[q] = wgmma_desc_swizzle128(b_big + step);
        b_small_desc[q] = wgmma_desc_swizzle128(b_big + B_PART_BYTES + step);
      }
      wgmma_fence();
      tf32x3_products(mma, part, a_big, a_small, b_big_desc, b_small_desc);
      add_wgmma_part(acc, part);
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(bars + 8 * (STAGES + stage));
  }
  store_wgmma_acc<N, true>(acc, pb.M + alpha * pb.m_alpha_stride, row0 + a_row, col0 + 2 * t4, pb.k_stride,
                           pb.k_stride, pb.rows);
  return true;
}

__device__ __forceinline__ void consume(const Problem& pb, unsigned ring, unsigned bars, unsigned* report) {
  setmaxnreg_inc<CONSUMER_REGS>();
  const int wg_row = 64 * (threadIdx.x / 128 - 1);
  const Items items(pb.alpha2, pb.rows, pb.k_stride);
  int fill = 0;
  for (int item = blockIdx.x; item < items.count; item += gridDim.x) {
    int alpha, row0, col0;
    items.at(item, alpha, row0, col0);
    const bool ok = pb.k_stride - col0 > 64 ? consume_tile<128>(pb, ring, bars, report, fill, alpha, row0, col0, wg_row)
                                            : consume_tile<64>(pb, ring, bars, report, fill, alpha, row0, col0, wg_row);
    if (!ok) return;
  }
}

}  // namespace ws

// Dynamic shared memory of a launch: the ring, the barriers, and room to align the ring to 1024.
extern "C" __device__ int mw_ws_smem_bytes = ws::STAGES * ws::STAGE_BYTES + ws::BARRIER_BYTES + 1024;
extern "C" __device__ int mw_ws_threads = ws::THREADS;

__device__ __forceinline__ void gemm_warp_specialized(const ws::Problem& pb, unsigned* report) {
  using namespace ws;
  extern __shared__ __align__(1024) unsigned char mw_ws_smem[];
  const unsigned ring = (smem_addr(mw_ws_smem) + 1023u) & ~1023u;
  const unsigned bars = ring + STAGES * STAGE_BYTES;
  if (threadIdx.x < STAGES) {
    mbarrier_init(bars + 8 * threadIdx.x, 128);                           // full: every producer thread
    mbarrier_init(bars + 8 * (STAGES + threadIdx.x), CONSUMER_WARPS);     // empty: every consumer warp
  }
  fence_mbarrier_init();
  __syncthreads();
  if (threadIdx.x < 128) produce(pb, ring, bars, report);
  else consume(pb, ring, bars, report);
}

}  // namespace mw
#endif  // MW_GEMM_WGMMA && MW_GEMM_TF32X3
