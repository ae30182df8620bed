// GEMM task (group g, j = position * k_blocks + K block):
//   M[p][rows of g][K block] = V[p][rows of g][:] @ U[p][:][K block]
// Mirrors megawino/stages/gemm.py.  float32 in and out; the products run as 3xTF32 on the tensor
// cores (MW_GEMM_TF32X3=1: fp32-level error at tensor-core speed) or as one FFMA chain per
// element (MW_GEMM_TF32X3=0).
//
// Block tile 128 rows x 64 columns (64-row chunks take a 64 x 64 tile), 256 threads, BK = 16,
// a GEMM_STAGES-deep cp.async ring of 16-byte copies (L1 bypassed: .cg), V rows (C contiguous)
// as A, U rows (K contiguous) as B: gemm_tile.  The arithmetic's fragment type (Tf32x3Fragments,
// FfmaFragments) multiplies each k tile and stores the results.  Every output element is one
// fixed reduction over k = 0 .. c_stride-1: no split-K, no atomics, the same bits for every
// mapping, the megakernel and the non-fused kernel.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

constexpr int GEMM_BM = 128;
constexpr int GEMM_BN = 64;
constexpr int GEMM_BK = 16;
constexpr int GEMM_STAGES = 3;

static_assert(GEMM_BLOCK_ROWS % 64 == 0, "GEMM tasks come in 64-row chunks");
static_assert(CHANNEL_ALIGN % 4 == 0 && K_ALIGN % 4 == 0, "16-byte copies need 4-float alignment");
static_assert(GEMM_BK * GEMM_BN / 4 == BLOCK_THREADS, "one B chunk per thread");

// Shared memory of the GEMM tile, which the megakernel's transforms reuse as scratch: 3 stages
// of padded 128-row A and 16 x 64 B (B rows of 72 floats under 3xTF32, whose unpadded stages
// need less), so that the block's shared-memory footprint, and with it the L1 / shared split
// the kernels are tuned under, is that of the padded layouts.
struct GemmSmem {
  float floats[GEMM_STAGES * (GEMM_BM * (GEMM_BK + 4) + GEMM_BK * (GEMM_BN + (MW_GEMM_TF32X3 ? 8 : 0)))];
};

// x = big + small, both TF32 bit patterns (low 13 mantissa bits zero): big rounds x to nearest
// (ties away, as cvt.rna.tf32.f32, in two integer ops: x is finite), small = x - big (exact in
// fp32) truncated.  big*big + big*small + small*big carry x*y to about 2^-21 relative
// (small*small is dropped).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
}

// Where a 3xTF32 stage keeps 16-byte chunk `chunk` of B row k: the chunks are XOR-swizzled by
// (k >> 2) & 3, so that a warp's fragment reads (rows 4 t4 + 2 q, t4 = 0..3) hit 32 distinct
// banks without padding.
__device__ __forceinline__ int swizzled_b_chunk(int k, int chunk) { return chunk ^ (2 * ((k >> 2) & 3)); }

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
    // Per k8 the three products of all blocks are issued product by product, so MT * NT
    // independent MMAs separate two that accumulate into the same registers.
    float part[MT * NT][4];
    float4 a_vec[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        a_vec[mt][h] = *reinterpret_cast<const float4*>(As + (warp_row + 16 * mt + 8 * h + g) * A_STRIDE + 4 * t4);
#pragma unroll
    for (int q = 0; q < GEMM_BK / 8; ++q) {
      unsigned a_big[MT][4], a_small[MT][4], b_big[NT][2], b_small[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float4 r0 = a_vec[mt][0], r8 = a_vec[mt][1];
        split_tf32(q == 0 ? r0.x : r0.z, a_big[mt][0], a_small[mt][0]);
        split_tf32(q == 0 ? r8.x : r8.z, a_big[mt][1], a_small[mt][1]);
        split_tf32(q == 0 ? r0.y : r0.w, a_big[mt][2], a_small[mt][2]);
        split_tf32(q == 0 ? r8.y : r8.w, a_big[mt][3], a_small[mt][3]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = warp_col + 8 * nt + g;
        // Rows 4 t4 + 2 q and 4 t4 + 2 q + 1 share row 4 t4's swizzle.
        const float* bp = Bs + (4 * t4 + 2 * q) * GEMM_BN + ((swizzled_b_chunk(4 * t4, n >> 2) << 2) | (n & 3));
        split_tf32(bp[0], b_big[nt][0], b_small[nt][0]);
        split_tf32(bp[GEMM_BN], b_big[nt][1], b_small[nt][1]);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (q == 0) mma_tf32_zero(part[mt * NT + nt], a_small[mt], b_big[nt]);
          else mma_tf32(part[mt * NT + nt], a_small[mt], b_big[nt]);
        }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_tf32(part[mt * NT + nt], a_big[mt], b_small[nt]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_tf32(part[mt * NT + nt], a_big[mt], b_big[nt]);
    }
#pragma unroll
    for (int j = 0; j < MT * NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = __fadd_rn(acc[j][e], part[j][e]);
  }

  __device__ __forceinline__ void store(const Acc& acc, float* Mp, long long row0, int col0, int col_end,
                                        int k_stride) const {
    // C fragment: rows g and g + 8, columns 2 t4 and 2 t4 + 1 of each (mt, nt) block.  col_end
    // is a multiple of K_ALIGN (4), so a column pair is wholly inside or wholly outside.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = col0 + warp_col + 8 * nt + 2 * t4;
        if (col < col_end) {
          const float* a = acc[mt * NT + nt];
          float* dst = Mp + (row0 + warp_row + 16 * mt + g) * k_stride + col;
          *reinterpret_cast<float2*>(dst) = make_float2(a[0], a[1]);
          *reinterpret_cast<float2*>(dst + 8 * k_stride) = make_float2(a[2], a[3]);
        }
      }
  }
};

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

  static __device__ __forceinline__ int tid() { return static_cast<int>(threadIdx.x); }

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

  __device__ __forceinline__ void store(const Acc& acc, float* Mp, long long row0, int col0, int col_end,
                                        int k_stride) const {
    if (col0 + tc * 4 < col_end) {
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        float* dst = Mp + (row0 + tr + 16 * i) * k_stride + col0 + tc * 4;
        *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      }
    }
  }
};

#if MW_GEMM_TF32X3
template <int ROWS> using GemmFragments = Tf32x3Fragments<ROWS>;
#else
template <int ROWS> using GemmFragments = FfmaFragments<ROWS>;
#endif

// One ROWS x 64 output tile: rows [row0, row0 + ROWS) of Vp / Mp, columns [col0, col0 + 64) of
// Up / Mp, columns >= col_end predicated off.  The cp.async ring is shared by both arithmetics:
// stages at F::a_stage / F::b_stage (A rows of F::A_STRIDE floats, B rows of 64 with the chunks
// at swizzled_b_chunk when F::SWIZZLE_B); each thread copies fixed 16-byte chunks of every stage,
// GEMM_STAGES - 1 k tiles ahead of the one being multiplied, and k beyond c_stride and columns
// >= col_end are zero-filled.
template <int ROWS>
__device__ __forceinline__ void gemm_tile(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                          long long row0, int col0, int col_end, int c_stride, int k_stride) {
  using F = GemmFragments<ROWS>;
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
      const bool ok = kbase + a_ch[r] < c_stride;
      cp_async_cg16(&a_stage(stage)[a_row[r] * F::A_STRIDE + a_ch[r]], ok ? a_src[r] + kbase : Vp, ok);
    }
    const bool ok = b_col_ok && kbase + b_k < c_stride;
    cp_async_cg16(&b_stage(stage)[b_k * GEMM_BN + b_dst_col],
                  ok ? b_src + static_cast<long long>(kbase) * k_stride : Up, ok);
  };

#pragma unroll
  for (int s = 0; s < GEMM_STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<GEMM_STAGES - 2>();
    __syncthreads();   // stage kt visible to all; stage kt-1 no longer read by anyone
    {
      const int nk = kt + GEMM_STAGES - 1;
      if (nk < k_tiles) load_stage(nk, nk % GEMM_STAGES);
      cp_async_commit();
    }
    const int stage = kt % GEMM_STAGES;
    frag.multiply(acc, a_stage(stage), b_stage(stage));
  }
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task
  frag.store(acc, Mp, row0, col0, col_end, k_stride);
}

__device__ __forceinline__ void gemm_task(const Params& p, GemmSmem& sm, int group, int index) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
  const int pos = index / static_cast<int>(p.k_blocks);
  const int tpg = static_cast<int>(p.tiles_per_group);
  const long long t0 = static_cast<long long>(group) * tpg;
  const int c_stride = static_cast<int>(p.c_stride), k_stride = static_cast<int>(p.k_stride);
  const float* Vp = reinterpret_cast<const float*>(p.V) + static_cast<long long>(pos) * p.tiles_padded * c_stride;
  const float* Up = reinterpret_cast<const float*>(p.U) + static_cast<long long>(pos) * c_stride * k_stride;
  float* Mp = reinterpret_cast<float*>(p.Mbuf) + static_cast<long long>(pos) * p.tiles_padded * k_stride;
  for (int col = k0; col < k1; col += GEMM_BN) {
    int r = 0;
    for (; r + 128 <= tpg; r += 128) gemm_tile<128>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    for (; r < tpg; r += 64) gemm_tile<64>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
  }
}

}  // namespace mw
