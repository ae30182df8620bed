// GEMM task (group g, j = position * k_blocks + K block):
//   M[p][rows of g][K block] = V[p][rows of g][:] @ U[p][:][K block]
// Mirrors megawino/core/stages/gemm.py.  float32 in and out; the products run as 3xTF32 on the
// tensor cores (MW_GEMM_TF32X3=1: fp32-level error at tensor-core speed) or as one FFMA chain per
// element (MW_GEMM_TF32X3=0).
//
// Block tile 128 rows x 64 columns (64-row chunks take a 64 x 64 tile; the split BF16x3 tile up to
// 128 columns), 256 threads, a cp.async
// ring of 16-byte copies (L1 bypassed: .cg; cp_async_pipeline; GEMM_STAGES of BK = 16, or
// WGMMA_STAGES of WGMMA_BK = 32 for the wgmma tile), V rows (C contiguous) as A, U rows (K
// contiguous; C contiguous where U is in the paired format, MW_U_PAIRED) as B.  gemm_tile
// multiplies with mma.sync or
// FFMA (the fragment types Tf32x3Fragments, FfmaFragments); gemm_tile_wgmma multiplies 3xTF32 on
// warpgroup MMAs where the build targets sm_90a (MW_GEMM_WGMMA).  Every output element is one
// fixed reduction over k = 0 .. c_stride-1: no split-K, no atomics, the same bits for every
// mapping, the megakernel and the non-fused kernel, and (3xTF32, FFMA) the wgmma and mma.sync builds.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

constexpr int GEMM_BM = 128;
constexpr int GEMM_BN = GEMM_TILE_COLS;
constexpr int GEMM_BK = 16;
constexpr int GEMM_STAGES = 3;
constexpr bool U_PAIRED = MW_U_PAIRED;   // for pragmas, which take no macros

static_assert(GEMM_BLOCK_ROWS % 64 == 0, "GEMM tasks come in 64-row chunks");
static_assert(CHANNEL_ALIGN % 4 == 0 && K_ALIGN % 4 == 0, "16-byte copies need 4-float alignment");
static_assert(GEMM_BK * GEMM_BN / 4 == BLOCK_THREADS, "one B chunk per thread");

#if MW_GEMM_WGMMA
// The warpgroup-MMA tile's ring: WGMMA_BK k per stage (GEMM_BK-term sub-tiles, each summed on its
// own as in the mma.sync tile), so that a block meets at its barriers once per 32 k.
constexpr int WGMMA_BK = 32;
// -DMW_WGMMA_STAGES=N: a ring of N stages, for A/B builds.
#ifndef MW_WGMMA_STAGES
#define MW_WGMMA_STAGES 3
#endif
constexpr int WGMMA_STAGES = MW_WGMMA_STAGES;
#endif

// Shared memory of the GEMM tile, which the megakernel's transforms reuse as scratch: 3 stages
// of padded 128-row A and 16 x 64 B (B rows of 72 floats under 3xTF32, whose unpadded stages
// need less), so that the block's shared-memory footprint, and with it the L1 / shared split
// the kernels are tuned under, is that of the padded layouts.
// The warpgroup-MMA tile: the split B of a stage (big and small parts) the tensor cores read,
// then its WGMMA_STAGES stages, A and B each, so that tiles of fewer k tiles than stages touch
// only the first stages (mw_gemm_smem_bytes_by_k_tiles).
// The split-operand tile (MW_SPLIT_OPERANDS): SPLIT_STAGES stages of hi and lo parts of 128 x
// WGMMA_BK A and 64 x WGMMA_BK B in BF16; its build's pointwise kernels run the mma.sync tile.
constexpr int MMA_SYNC_SMEM_FLOATS =
    GEMM_STAGES * (GEMM_BM * (GEMM_BK + 4) + GEMM_BK * (GEMM_BN + (MW_GEMM_TF32X3 || MW_GEMM_BF16X3 ? 8 : 0)));
#if MW_SPLIT_OPERANDS
#ifndef MW_SPLIT_STAGES
#define MW_SPLIT_STAGES 4
#endif
constexpr int SPLIT_STAGES = MW_SPLIT_STAGES;
constexpr int SPLIT_STAGE_FLOATS = (GEMM_BM + GEMM_BN) * WGMMA_BK;   // two BF16 parts per float
#endif
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
// The split B buffer: both parts of a stage, or (MW_U_PAIRED) the small parts only, the big ones
// going over the stage.
constexpr int WGMMA_SPLIT_FLOATS = (MW_U_PAIRED ? 1 : 2) * WGMMA_BK * GEMM_BN;
constexpr int WGMMA_STAGE_FLOATS = GEMM_BM * WGMMA_BK + WGMMA_BK * GEMM_BN;
#endif
struct GemmSmem {
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
  float floats[WGMMA_SPLIT_FLOATS + WGMMA_STAGES * WGMMA_STAGE_FLOATS];
#elif MW_SPLIT_OPERANDS
  // + 512 bytes: the split tile's stages start 512-byte aligned (their swizzle).
  float floats[SPLIT_STAGES * SPLIT_STAGE_FLOATS + 128 > MMA_SYNC_SMEM_FLOATS ? SPLIT_STAGES * SPLIT_STAGE_FLOATS + 128
                                                                               : MMA_SYNC_SMEM_FLOATS];
#else
  float floats[MMA_SYNC_SMEM_FLOATS];
#endif
};

// The kernels that run GEMM tiles keep GemmSmem in dynamic shared memory (the wgmma tile's is
// over the 48 KB a static array may take); every launch passes mw_gemm_smem_bytes
// (megawino.gpu.nvrtc.GemmSmemKernel).
extern "C" __device__ int mw_gemm_smem_bytes = static_cast<int>(sizeof(GemmSmem));

// The transforms' scratch (their sbuf: alpha^2 floats a thread), which the megakernel's take from
// GemmSmem.
constexpr int TRANSFORM_SCRATCH_FLOATS = (MW_M + 2) * (MW_M + 2) * BLOCK_THREADS;
static_assert(TRANSFORM_SCRATCH_FLOATS * sizeof(float) <= sizeof(GemmSmem),
              "the megakernel's transforms keep alpha^2 floats per thread in the GEMM's shared memory");
// The shared memory a launch needs whose GEMM tiles have k_tiles k tiles of mw_gemm_k_per_tile
// (c_stride / k per tile, rounded up; entry min(k_tiles, 4) - 1): the 3xTF32 warpgroup-MMA ring
// touches only the stages its tiles fill, and what a launch does not take is the L1's
// (megawino.gpu.nvrtc.gemm_smem_bytes); every other tile takes all of GemmSmem.
// -DMW_GEMM_SMEM_BY_K_TILES=0: every launch takes all of GemmSmem.
#ifndef MW_GEMM_SMEM_BY_K_TILES
#define MW_GEMM_SMEM_BY_K_TILES 1
#endif
__host__ __device__ constexpr int gemm_smem_bytes_for(int k_tiles) {
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3 && MW_GEMM_SMEM_BY_K_TILES
  if (k_tiles >= WGMMA_STAGES) return static_cast<int>(sizeof(GemmSmem));
  const int ring = WGMMA_SPLIT_FLOATS + k_tiles * WGMMA_STAGE_FLOATS;
  return static_cast<int>(sizeof(float)) * (ring > TRANSFORM_SCRATCH_FLOATS ? ring : TRANSFORM_SCRATCH_FLOATS);
#else
  (void)k_tiles;
  return static_cast<int>(sizeof(GemmSmem));
#endif
}
// The ring's k per stage and its depth (the non-fused module's may be deeper than the megakernel's).
#if MW_GEMM_WGMMA
extern "C" __device__ int mw_gemm_k_per_tile = WGMMA_BK;
extern "C" __device__ int mw_gemm_stages = WGMMA_STAGES;
#else
extern "C" __device__ int mw_gemm_k_per_tile = GEMM_BK;
extern "C" __device__ int mw_gemm_stages = GEMM_STAGES;
#endif
extern "C" __device__ int mw_gemm_smem_bytes_by_k_tiles[4] = {gemm_smem_bytes_for(1), gemm_smem_bytes_for(2),
                                                             gemm_smem_bytes_for(3), gemm_smem_bytes_for(4)};
__device__ __forceinline__ GemmSmem& gemm_smem() {
#if MW_U_PAIRED
  // The paired build's swizzled stages start 1024-byte aligned (the 128-byte swizzle's period).
  extern __shared__ __align__(1024) unsigned char mw_dynamic_smem[];
#else
  extern __shared__ __align__(128) unsigned char mw_dynamic_smem[];
#endif
  return *reinterpret_cast<GemmSmem*>(mw_dynamic_smem);
}

// x = big + small, both TF32 bit patterns (low 13 mantissa bits zero): big rounds x to nearest
// (ties away, as cvt.rna.tf32.f32, in two integer ops: x is finite), small = x - big (exact in
// fp32) truncated.  big*big + big*small + small*big carry x*y to about 2^-21 relative
// (small*small is dropped).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
}

// The A operand of k8 step q from a thread's two float4 of one k tile (rows g and g + 8, k
// 4 t4 .. 4 t4 + 3): columns t4 and t4 + 4 are k 4 t4 + 2 q and 4 t4 + 2 q + 1, split in two TF32
// parts in m16n8k8 fragment order.
__device__ __forceinline__ void split_a_step(const float4& r0, const float4& r8, int q, unsigned (&big)[4],
                                             unsigned (&small)[4]) {
  split_tf32(q == 0 ? r0.x : r0.z, big[0], small[0]);
  split_tf32(q == 0 ? r8.x : r8.z, big[1], small[1]);
  split_tf32(q == 0 ? r0.y : r0.w, big[2], small[2]);
  split_tf32(q == 0 ? r8.y : r8.w, big[3], small[3]);
}

// Where a 3xTF32 stage keeps 16-byte chunk `chunk` of B row k: the chunks are XOR-swizzled by
// (k >> 2) & 3, so that a warp's fragment reads (rows 4 t4 + 2 q, t4 = 0..3) hit 32 distinct
// banks without padding.
__device__ __forceinline__ int swizzled_b_chunk(int k, int chunk) { return chunk ^ (2 * ((k >> 2) & 3)); }

// part (+)= a_small * b_big + a_big * b_small + a_big * b_big for a warp's MT x NT blocks, product
// by product, so that MT * NT independent MMAs separate two that accumulate into the same
// registers; ZERO starts part from zero (mma_zero), else it adds to it (mma).
template <bool ZERO, int MT, int NT, class Mma, class MmaZero>
__device__ __forceinline__ void three_products(float (&part)[MT * NT][4], const unsigned (&a_big)[MT][4],
                                               const unsigned (&a_small)[MT][4], const unsigned (&b_big)[NT][2],
                                               const unsigned (&b_small)[NT][2], Mma mma, MmaZero mma_zero) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if constexpr (ZERO) mma_zero(part[mt * NT + nt], a_small[mt], b_big[nt]);
      else mma(part[mt * NT + nt], a_small[mt], b_big[nt]);
    }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma(part[mt * NT + nt], a_big[mt], b_small[nt]);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma(part[mt * NT + nt], a_big[mt], b_big[nt]);
}

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
      for (int mt = 0; mt < MT; ++mt) split_a_step(a_vec[mt][0], a_vec[mt][1], q, a_big[mt], a_small[mt]);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int n = warp_col + 8 * nt + g;
        // Rows 4 t4 + 2 q and 4 t4 + 2 q + 1 share row 4 t4's swizzle.
        const float* bp = Bs + (4 * t4 + 2 * q) * GEMM_BN + ((swizzled_b_chunk(4 * t4, n >> 2) << 2) | (n & 3));
        split_tf32(bp[0], b_big[nt][0], b_small[nt][0]);
        split_tf32(bp[GEMM_BN], b_big[nt][1], b_small[nt][1]);
      }
      if (q == 0) three_products<true>(part, a_big, a_small, b_big, b_small, mma_tf32, mma_tf32_zero);
      else three_products<false>(part, a_big, a_small, b_big, b_small, mma_tf32, mma_tf32_zero);
    }
#pragma unroll
    for (int j = 0; j < MT * NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = __fadd_rn(acc[j][e], part[j][e]);
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

  // hi and lo BF16 pairs of (x0, x1).
  static __device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = pack_bf16x2(x0, x1);
    lo = pack_bf16x2(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xFFFF0000u));
  }

  __device__ __forceinline__ void multiply(Acc& acc, const float* As, const float* Bs) const {
    const int g = this->g, t4 = this->t4;
    unsigned a_hi[MT][4], a_lo[MT][4], b_hi[NT][2], b_lo[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float* row = As + (this->warp_row + 16 * mt + g) * Base::A_STRIDE + 4 * t4;
      const float4 r0 = *reinterpret_cast<const float4*>(row);
      const float4 r8 = *reinterpret_cast<const float4*>(row + 8 * Base::A_STRIDE);
      split_pair(r0.x, r0.y, a_hi[mt][0], a_lo[mt][0]);
      split_pair(r8.x, r8.y, a_hi[mt][1], a_lo[mt][1]);
      split_pair(r0.z, r0.w, a_hi[mt][2], a_lo[mt][2]);
      split_pair(r8.z, r8.w, a_hi[mt][3], a_lo[mt][3]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = this->warp_col + 8 * nt + g;
      // Rows 4 t4 .. 4 t4 + 3 share row 4 t4's swizzle.
      const float* bp = Bs + 4 * t4 * GEMM_BN + ((swizzled_b_chunk(4 * t4, n >> 2) << 2) | (n & 3));
      split_pair(bp[0], bp[GEMM_BN], b_hi[nt][0], b_lo[nt][0]);
      split_pair(bp[2 * GEMM_BN], bp[3 * GEMM_BN], b_hi[nt][1], b_lo[nt][1]);
    }
    float part[MT * NT][4];
    three_products<true>(part, a_hi, a_lo, b_hi, b_lo, mma_bf16, mma_bf16_zero);
#pragma unroll
    for (int j = 0; j < MT * NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = __fadd_rn(acc[j][e], part[j][e]);
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

// Which arithmetic this build's GEMM runs, for the host to check (megawino.gpu.nvrtc.gemm_uses_wgmma).
extern "C" __device__ int mw_gemm_wgmma = MW_GEMM_WGMMA;
// Whether U is in the paired format (megawino.gpu.nvrtc.operand_format).
extern "C" __device__ int mw_u_paired = MW_U_PAIRED;

#if MW_GEMM_BF16X3
template <int ROWS> using GemmFragments = Bf16x3Fragments<ROWS>;
#elif MW_GEMM_TF32X3
template <int ROWS> using GemmFragments = Tf32x3Fragments<ROWS>;
#else
template <int ROWS> using GemmFragments = FfmaFragments<ROWS>;
#endif

// The cp.async ring both tiles run (STAGES deep): stages 0 .. STAGES - 2 in flight first, then
// per k tile: wait for it, one barrier (stage kt visible to all, the stage the next copy
// overwrites no longer read), prepare(stage), the copy STAGES - 1 tiles ahead, and
// multiply(stage).  prepare runs before the copy is issued because a fence in it would wait for
// that copy.
template <int STAGES, class LoadStage, class Prepare, class Multiply>
__device__ __forceinline__ void cp_async_pipeline(int k_tiles, LoadStage load_stage, Prepare prepare,
                                                  Multiply multiply) {
  // Rolled in the paired build, whose registers its 4-stage ring needs.
#pragma unroll(U_PAIRED ? 1 : STAGES - 1)
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int stage = kt % STAGES;
    prepare(stage);
    const int nk = kt + STAGES - 1;
    if (nk < k_tiles) load_stage(nk, nk % STAGES);
    cp_async_commit();
    multiply(stage);
  }
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task
}

// One ROWS x 64 output tile: rows [row0, row0 + ROWS) of Vp / Mp, columns [col0, col0 + 64) of
// Up / Mp, columns >= col_end predicated off (and rows >= row_end where ROW_BOUND: the pointwise
// kernel's operands are the user's tensors, which have no padding rows).  The cp.async ring is shared by both arithmetics:
// stages at F::a_stage / F::b_stage (A rows of F::A_STRIDE floats, B rows of 64 with the chunks
// at swizzled_b_chunk when F::SWIZZLE_B); each thread copies fixed 16-byte chunks of every stage,
// GEMM_STAGES - 1 k tiles ahead of the one being multiplied, and k beyond c_stride and columns
// >= col_end are zero-filled.
template <int ROWS, bool ROW_BOUND = false>
__device__ __forceinline__ void gemm_tile(GemmSmem& sm, const float* Vp, const float* Up, float* Mp,
                                          long long row0, int col0, int col_end, int c_stride, int k_stride,
                                          long long row_end = 0) {
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

#if MW_GEMM_WGMMA
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
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = __fadd_rn(acc[i], part[i]);
}
#endif  // MW_GEMM_WGMMA

#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
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
      split_tf32(raw.x, big[0], small[0]);
      split_tf32(raw.y, big[1], small[1]);
      split_tf32(raw.z, big[2], small[2]);
      split_tf32(raw.w, big[3], small[3]);
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
      for (int kc = 0; kc < 4; ++kc) split_tf32(raw[4 * kc * GEMM_BN], big[kc], small[kc]);
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
    for (int q = 0; q < 2; ++q) split_a_step(a_raw[0], a_raw[1], q, a_big[q], a_small[q]);
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
      wgmma_fence();
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        unsigned long long b_big, b_small;
        b_descs(stage, 2 * sub + q, b_big, b_small);
        mma(part, a_small[q], b_big, q);
        mma(part, a_big[q], b_small, 1);
        mma(part, a_big[q], b_big, 1);
      }
      add_wgmma_part(acc, part);
    }
    k_rest -= WGMMA_BK;
  });
  store_wgmma_acc<WG_N, ROW_BOUND>(acc, Mp, row0 + warp_row + g, col0 + warp_col + 2 * t4, col_end, k_stride, row_end);
}
#endif  // MW_GEMM_WGMMA && MW_GEMM_TF32X3

#if MW_SPLIT_OPERANDS
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
  auto mma = [](float (&d)[MMA_N / 2], unsigned long long a, unsigned long long b, int accumulate) {
    if constexpr (MMA_N == 64) wgmma_bf16_m64n64k16(d, a, b, accumulate);
    else wgmma_bf16_m64n32k16(d, a, b, accumulate);
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
        mma(d, desc(a_lo), desc(b_hi), 1);
        mma(d, desc(a_hi), desc(b_lo), 1);
        mma(d, desc(a_hi), desc(b_hi), 1);
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
#endif  // MW_SPLIT_OPERANDS

__device__ __forceinline__ void gemm_task(const Params& p, GemmSmem& sm, int group, int index) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
  const int pos = index / static_cast<int>(p.k_blocks);
  const int tpg = static_cast<int>(p.tiles_per_group);
  const long long t0 = static_cast<long long>(group) * tpg - ring_shift(p, group);   // first row of V and M
  const int c_stride = static_cast<int>(p.c_stride), k_stride = static_cast<int>(p.k_stride);
  const float* Vp = reinterpret_cast<const float*>(p.V) + static_cast<long long>(pos) * p.buffer_tiles * c_stride;
  const float* Up = reinterpret_cast<const float*>(p.U) + static_cast<long long>(pos) * c_stride * k_stride;
  float* Mp = reinterpret_cast<float*>(p.Mbuf) + static_cast<long long>(pos) * p.buffer_tiles * k_stride;
#ifdef MW_GEMM_FREE
  // Diagnostic build (bench/experiments/free_stage_bounds.sh): the GEMM's arithmetic costs nothing,
  // so the megakernel's time is what the rest of it takes.  1: the task only writes its M block;
  // 2: the first K block's task also reads its V rows once, as any GEMM must.
  {
    (void)Up, (void)sm;
    const int tid = thread_index(), cols4 = (k1 - k0) / 4;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    if (MW_GEMM_FREE >= 2 && kb == 0) {
      const float4* V4 = reinterpret_cast<const float4*>(Vp + t0 * c_stride);
      for (int i = tid; i < tpg * c_stride / 4; i += BLOCK_THREADS) {
        const float4 v = V4[i];
        sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
      }
    }
    for (int i = tid; i < tpg * cols4; i += BLOCK_THREADS) {
      const int r = i / cols4, c = i - r * cols4;
      reinterpret_cast<float4*>(Mp + (t0 + r) * k_stride + k0)[c] = sum;
    }
  }
#elif MW_SPLIT_OPERANDS
  // 128-column tiles while more than 64 columns are left.
  for (int col = k0; col < k1; col += k1 - col > GEMM_BN ? 2 * GEMM_BN : GEMM_BN) {
    int r = 0;
    if (k1 - col > GEMM_BN) {
      for (; r + 128 <= tpg; r += 128)
        gemm_tile_wgmma_bf16x3<128, 2 * GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
      for (; r < tpg; r += 64) gemm_tile_wgmma_bf16x3<64, 2 * GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    } else {
      for (; r + 128 <= tpg; r += 128) gemm_tile_wgmma_bf16x3<128, GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
      for (; r < tpg; r += 64) gemm_tile_wgmma_bf16x3<64, GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    }
  }
#else
  for (int col = k0; col < k1; col += GEMM_BN) {
    int r = 0;
#if MW_GEMM_WGMMA
    for (; r + 128 <= tpg; r += 128) gemm_tile_wgmma<128>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    for (; r < tpg; r += 64) gemm_tile_wgmma<64>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
#else
    for (; r + 128 <= tpg; r += 128) gemm_tile<128>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    for (; r < tpg; r += 64) gemm_tile<64>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
#endif
  }
#endif  // MW_SPLIT_OPERANDS
}

// The non-fused GEMM kernel runs its tasks position by position, K blocks innermost, so that one
// position's filter matrix and each V row range stay in L2 while every group uses them: block b's
// task among the GEMM ids (group-major, alpha^2 * k_blocks a group: megawino.core.tasks).  Any
// bijection gives the same bits.
__device__ __forceinline__ int gemm_position_major_block(const Params& p) {
  const int k_blocks = static_cast<int>(p.k_blocks);
  const int per_group = Wino<MW_M>::ALPHA * Wino<MW_M>::ALPHA * k_blocks;
  const int groups = static_cast<int>(gridDim.x) / per_group;
  const int b = static_cast<int>(blockIdx.x);
  const int rest = b / k_blocks;
  return (rest % groups) * per_group + (rest / groups) * k_blocks + (b - rest * k_blocks);
}

}  // namespace mw
