// The warp-specialized batched GEMM (sm_90a, 3xTF32): M[a] = V[a] @ U[a] for every Winograd
// position a, with one 384-thread block per SM that loops over (position, row tile, column tile)
// work items strided by blockIdx.  Warpgroup 0 is the producer: it copies 128 V rows and 128 U
// rows (the paired format, float32_u_paired: U transposed, each 16 channels in the A fragments'
// pairing order) of one 16-channel sub-tile a stage into a ring of STAGES shared-memory stages,
// then, once they have landed, puts the V rows in the same pairing order (a 4 x 4 transpose of
// each row's 16 channels), splits both operands into big and small TF32 parts and marks the
// stage full on an mbarrier.  Warpgroups 1 and 2 are the consumers, each owning 64 rows of the
// 128 x 128 tile (m64n128k8; 128 x 64 and m64n64k8 where K <= 64), both operands read by
// the tensor cores from shared memory in the 64-byte swizzle; they free a stage on its empty
// mbarrier once their MMAs are done with it.  The arithmetic is that of cuda/gemm_wgmma.cuh,
// product by product: each 16-term sub-tile is summed from zero on the tensor cores (a_small *
// b_big, a_big * b_small, a_big * b_big per k8 step, the k8 steps holding the same channels), then
// added to the fp32 accumulator with one round-to-nearest FADD, so M is bitwise the non-fused GEMM
// stage's.  Two partial sums alternate, so that one sub-tile's MMAs run while the previous one's
// sum is added.  Every mbarrier wait is bounded: a wait that outlasts WAIT_NS writes which block,
// role and stage was stuck to the report word and the warp leaves the kernel.
#pragma once

#include "gemm_wgmma.cuh"

#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
namespace mw {
namespace ws {

constexpr int THREADS = 384;            // producer warpgroup + two consumer warpgroups
constexpr int BM = 128, BN = 128;       // block tile: rows (tiles of V and M) x columns (K)
constexpr int BK = GEMM_BK;             // channels a stage: one 16-term sub-tile (c_stride % 16 == 0)
constexpr int STAGES = 6;
constexpr int LAG = 3;                  // stages the producer keeps in flight before publishing one
constexpr int PRODUCER_REGS = 48, CONSUMER_REGS = 224;   // the least the producer takes without spilling
constexpr int ROW_BYTES = BK * 4;       // 64: wgmma's 64-byte swizzle, 8-row groups of 512 bytes
constexpr int PART_BYTES = BM * ROW_BYTES;
static_assert(BM == BN, "A and B parts share one layout");
constexpr int A_BIG = 0, A_SMALL = PART_BYTES, B_BIG = 2 * PART_BYTES, B_SMALL = 3 * PART_BYTES;
constexpr int STAGE_BYTES = 4 * PART_BYTES;
constexpr int BARRIER_BYTES = 2 * STAGES * 8;             // full[STAGES], empty[STAGES]
constexpr int CONSUMER_WARPS = 8;
constexpr int PRODUCER_BARRIER = 1;                       // named barrier of the producer warpgroup
constexpr long long WAIT_NS = 2000000000ll;               // a wait this long is a hang
static_assert(LAG >= 1 && LAG < STAGES, "the producer publishes stage f - LAG before it needs stage f - STAGES back");
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= 65536, "register file");
static_assert(CHANNEL_ALIGN % BK == 0, "stages of whole sub-tiles");

// Report word: 0 while fine, else STUCK | block << 8 | role << 4 | stage.
constexpr unsigned STUCK = 0x80000000u;
constexpr unsigned ROLE_PRODUCER = 1, ROLE_CONSUMER = 2;

// Byte offset of 16-byte chunk c of row r in a part: the 64-byte swizzle.
__host__ __device__ constexpr unsigned swizzled(int r, int c) { return r * ROW_BYTES + 16 * (c ^ ((r >> 1) & 3)); }

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
  const float* U;   // [alpha2][k_stride][c_stride], the paired format
  float* M;         // [alpha2][m rows][k_stride]
  int alpha2, rows, c_stride, k_stride;
  long long v_alpha_stride, m_alpha_stride;   // floats between positions
};

// The producer.  Copies: thread t copies chunk t % 4 of rows t / 4 + 32 r (r = 0..3) of A and of
// B (a quarter warp two whole 64-byte rows) into the big parts.  Once a stage has landed (each
// thread's own copies, then the warpgroup's barrier), thread t prepares row t of both operands:
// stored chunk c of a paired row holds channels c, c + 4, c + 8, c + 12 (megawino.core.abi
// PAIRED_CHANNELS), element e of chunk c of A being element c of its chunk e.
__device__ __forceinline__ void produce(const Problem& pb, unsigned ring, unsigned bars, unsigned* report) {
  setmaxnreg_dec<PRODUCER_REGS>();
  const int t = threadIdx.x;
  const int chunk = t & 3, row_in = t >> 2;
  const unsigned copy_off = swizzled(row_in, chunk);   // rows 32 apart share the swizzle
  constexpr unsigned ROW_STEP = 32 * ROW_BYTES;
  const Items items(pb.alpha2, pb.rows, pb.k_stride);
  const int k_tiles = pb.c_stride / BK;
  auto split4 = [](const float (&x)[4], unsigned (&big)[4], unsigned (&small)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) Tf32x3::split(x[e], big[e], small[e]);
  };
  auto publish = [&](int stage) {
    const unsigned base = ring + stage * STAGE_BYTES;
    float4 raw[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) raw[c] = lds_f32x4(base + A_BIG + swizzled(t, c));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float x[4] = {c == 0 ? raw[0].x : c == 1 ? raw[0].y : c == 2 ? raw[0].z : raw[0].w,
                          c == 0 ? raw[1].x : c == 1 ? raw[1].y : c == 2 ? raw[1].z : raw[1].w,
                          c == 0 ? raw[2].x : c == 1 ? raw[2].y : c == 2 ? raw[2].z : raw[2].w,
                          c == 0 ? raw[3].x : c == 1 ? raw[3].y : c == 2 ? raw[3].z : raw[3].w};
      unsigned big[4], small[4];
      split4(x, big, small);
      sts_u32x4(base + A_BIG + swizzled(t, c), big[0], big[1], big[2], big[3]);
      sts_u32x4(base + A_SMALL + swizzled(t, c), small[0], small[1], small[2], small[3]);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float4 r = lds_f32x4(base + B_BIG + swizzled(t, c));
      const float x[4] = {r.x, r.y, r.z, r.w};
      unsigned big[4], small[4];
      split4(x, big, small);
      sts_u32x4(base + B_BIG + swizzled(t, c), big[0], big[1], big[2], big[3]);
      sts_u32x4(base + B_SMALL + swizzled(t, c), small[0], small[1], small[2], small[3]);
    }
    fence_proxy_async_smem();   // the tensor cores (async proxy) read what st.shared wrote
    mbarrier_arrive(bars + 8 * stage);
  };
  int fill = 0;
  for (int item = blockIdx.x; item < items.count; item += gridDim.x) {
    int alpha, row0, col0;
    items.at(item, alpha, row0, col0);
    const float* a_src = pb.V + alpha * pb.v_alpha_stride + static_cast<long long>(row0 + row_in) * pb.c_stride + 4 * chunk;
    const float* b_src = pb.U + static_cast<long long>(alpha) * pb.k_stride * pb.c_stride +
                         static_cast<long long>(col0 + row_in) * pb.c_stride + 4 * chunk;
    const long long src_step = 32ll * pb.c_stride;
    const int a_rows_left = pb.rows - row0 - row_in, b_rows_left = pb.k_stride - col0 - row_in;
    for (int kt = 0; kt < k_tiles; ++kt, ++fill) {
      const int stage = fill % STAGES;
      if (fill >= STAGES &&
          !wait_phase(bars + 8 * (STAGES + stage), ((fill / STAGES) - 1) & 1, report, ROLE_PRODUCER, stage))
        return;
      const unsigned dst = ring + stage * STAGE_BYTES + copy_off;
#pragma unroll
      for (int r = 0; r < BM / 32; ++r) {
        const bool ok = 32 * r < a_rows_left;
        cp_async_cg16_shared(dst + A_BIG + r * ROW_STEP, ok ? a_src + r * src_step : pb.V, ok);
      }
#pragma unroll
      for (int r = 0; r < BN / 32; ++r) {
        const bool ok = 32 * r < b_rows_left;
        cp_async_cg16_shared(dst + B_BIG + r * ROW_STEP, ok ? b_src + r * src_step : pb.U, ok);
      }
      cp_async_commit();
      a_src += BK;
      b_src += BK;
      if (fill >= LAG) {
        cp_async_wait<LAG>();
        named_barrier_sync(PRODUCER_BARRIER, 128);   // every producer thread's copies of the stage landed
        publish((fill - LAG) % STAGES);
      }
    }
  }
  cp_async_wait<0>();
  named_barrier_sync(PRODUCER_BARRIER, 128);
  for (int f = fill - LAG < 0 ? 0 : fill - LAG; f < fill; ++f) publish(f % STAGES);
}

// acc += part once all MMA groups but PENDING are done (the 16-term partial sums' one FADD).
template <int PENDING, int N>
__device__ __forceinline__ void retire(float (&acc)[N], float (&part)[N]) {
  wgmma_wait<PENDING>();
  fence_operands(part);
  add_partial_sums(acc, part);
}

// One consumer warpgroup's 64 x N part of a tile (its rows from wg_row on).  Sub-tile kt's MMAs go
// into part0 (even kt) or part1 (odd kt); once they are issued, the previous sub-tile's are waited
// for, its sum added to acc and its stage freed.
template <int N>
__device__ __forceinline__ bool consume_tile(const Problem& pb, unsigned ring, unsigned bars, unsigned* report,
                                             int& fill, int alpha, int row0, int col0, int wg_row) {
  const int lane = threadIdx.x & 31;
  const int k_tiles = pb.c_stride / BK;
  auto mma = [](float (&d)[N / 2], unsigned long long a, unsigned long long b, int accumulate) {
    if constexpr (N == 128) wgmma_tf32_ss_m64n128k8(d, a, b, accumulate);
    else wgmma_tf32_ss_m64n64k8(d, a, b, accumulate);
  };
  auto desc = [](unsigned address) { return wgmma_desc_swizzle64(address, 8 * ROW_BYTES); };
  float acc[N / 2], part0[N / 2], part1[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  int previous = -1;   // the stage of the sub-tile in flight
  auto sub_tile = [&](float (&part)[N / 2], float (&other)[N / 2]) {
    const int stage = fill % STAGES;
    if (!wait_phase(bars + 8 * stage, (fill / STAGES) & 1, report, ROLE_CONSUMER, stage)) return false;
    const unsigned base = ring + stage * STAGE_BYTES, a = base + wg_row * ROW_BYTES;
    wgmma_fence();
#pragma unroll
    for (int q = 0; q < 2; ++q)   // k8 step q: 32 bytes into the swizzled rows
      split_products(mma, part, desc(a + A_BIG + 32 * q), desc(a + A_SMALL + 32 * q), desc(base + B_BIG + 32 * q),
                     desc(base + B_SMALL + 32 * q), q);
    wgmma_commit();
    if (previous >= 0) {
      retire<1>(acc, other);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(bars + 8 * (STAGES + previous));
    }
    previous = stage;
    ++fill;
    return true;
  };
  for (int kt = 0; kt < k_tiles; kt += 2) {
    if (!sub_tile(part0, part1)) return false;
    if (kt + 1 < k_tiles && !sub_tile(part1, part0)) return false;
  }
  if (k_tiles & 1) retire<0>(acc, part0);
  else retire<0>(acc, part1);
  __syncwarp();
  if (lane == 0) mbarrier_arrive(bars + 8 * (STAGES + previous));
  const int row = row0 + wg_row + 16 * ((threadIdx.x >> 5) & 3) + (lane >> 2);
  store_wgmma_acc<N, true>(acc, pb.M + alpha * pb.m_alpha_stride, row, col0 + 2 * (lane & 3), pb.k_stride,
                           pb.k_stride, pb.rows);
  return true;
}

// Every item of the block with tiles N columns wide: 64 where the layer has no more columns
// (one loop a width, so that the two tiles' registers are allocated apart), else 128, a last
// column tile of <= 64 columns masked.
template <int N>
__device__ __forceinline__ void consume_items(const Problem& pb, unsigned ring, unsigned bars, unsigned* report) {
  const int wg_row = 64 * (threadIdx.x / 128 - 1);
  const Items items(pb.alpha2, pb.rows, pb.k_stride);
  int fill = 0;
  for (int item = blockIdx.x; item < items.count; item += gridDim.x) {
    int alpha, row0, col0;
    items.at(item, alpha, row0, col0);
    if (!consume_tile<N>(pb, ring, bars, report, fill, alpha, row0, col0, wg_row)) return;
  }
}

__device__ __forceinline__ void consume(const Problem& pb, unsigned ring, unsigned bars, unsigned* report) {
  setmaxnreg_inc<CONSUMER_REGS>();
  if (pb.k_stride <= 64) consume_items<64>(pb, ring, bars, report);
  else consume_items<128>(pb, ring, bars, report);
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
