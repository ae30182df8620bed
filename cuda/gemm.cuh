// GEMM task (group g, j = position * k_blocks + K block):
//   M[p][rows of g][K block] = V[p][rows of g][:] @ U[p][:][K block]
// Mirrors megawino/stages/gemm.py.  float32 in and out; the products run as 3xTF32 on the tensor
// cores (MW_GEMM_TF32X3=1, the default: fp32-level error, bench/NOTES.md 25 and 40) or as one
// FFMA chain per element (MW_GEMM_TF32X3=0).
//
// Block tile 128 rows x 64 columns (64-row chunks take a 64 x 64 variant), 256 threads, BK = 16,
// a cp.async ring of 16-byte copies (L1 bypassed: .cg), V rows (C contiguous) as A, U rows
// (K contiguous) as B.  Every output element is one fixed reduction over k = 0 .. c_stride-1:
// no split-K, no atomics, the same bits for every mapping, the megakernel and the non-fused
// kernel.
// 3xTF32 (default): warps own 32 x 32 (32 x 16) blocks of m16n8k8 MMAs; each operand is split
// into two TF32 parts and big*big + big*small + small*big of every 16-term k tile is summed on
// the tensor cores from zero, then added to the fp32 accumulator with one round-to-nearest FADD.
// Shared memory per TileLayout (A rows unpadded, B chunks XOR-swizzled: MW_GEMM_TF32_VEC).
// FFMA (MW_GEMM_TF32X3=0): register micro-tile 8 x 4 (4 x 4), 3 stages,
//   As[stage][row][BK + 4]  (the +4 pad makes the four rows a warp reads at one time hit
//                            distinct banks)
//   Bs[stage][BK][64]
// thread (tr, tc) owns rows tr + 16 i and columns tc * 4 + [0, 4); a warp is 4 row-threads x 8
// column-threads, so each LDS.128 of a warp reads 4 distinct A addresses and 8 consecutive B
// vectors (128 bytes): no bank conflicts.  One __fmaf_rn per k in order (zero-filled k beyond
// c_stride adds +0).
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

constexpr int GEMM_BM = 128;
constexpr int GEMM_BN = 64;
constexpr int GEMM_BK = 16;
constexpr int GEMM_STAGES = 3;
constexpr int GEMM_AS_STRIDE = GEMM_BK + 4;
// MW_GEMM_TF32X3 (default 1; bench/NOTES.md 25, 40): the tile's products on tensor cores
// as three TF32 MMAs (big*big + big*small + small*big of each operand's TF32 split).  With
// MW_GEMM_TF32_VEC=0 its B fragment reads 4 k rows x 8 columns per warp instruction: a row
// stride of 72 floats puts them in 32 distinct banks (64 would be a 4-way conflict).
#ifndef MW_GEMM_TF32X3
#define MW_GEMM_TF32X3 1
#endif
constexpr int GEMM_BS_STRIDE = MW_GEMM_TF32X3 ? GEMM_BN + 8 : GEMM_BN;

// MW_GEMM_TF32_VEC (TF32X3 only; default 1, bench/NOTES.md 41): A fragments as one LDS.128 per
// row and k tile (the k order inside each MMA permuted so that a thread's four k of a 16-wide
// tile are adjacent), A rows unpadded (16 floats: a quarter-warp's 128-bit reads cover 32
// banks), B rows unpadded with the 16-byte chunks XOR-swizzled by k so that the permuted B
// reads hit 32 banks.  0: one LDS.32 per fragment element, padded rows.
#ifndef MW_GEMM_TF32_VEC
#define MW_GEMM_TF32_VEC 1
#endif
// Most cp.async stages a TF32X3 tile keeps in flight; the tile takes as many as fit the shared
// memory union (3 for 128-row tiles, 4 or 5 for 64-row tiles), up to this.
#ifndef MW_GEMM_MAX_STAGES
#define MW_GEMM_MAX_STAGES 3
#endif

static_assert(GEMM_BLOCK_ROWS % 64 == 0, "GEMM tasks come in 64-row chunks");
static_assert(CHANNEL_ALIGN % 4 == 0 && K_ALIGN % 4 == 0, "16-byte copies need 4-float alignment");

struct GemmSmemNarrow {
  float A[GEMM_STAGES][GEMM_BM * GEMM_AS_STRIDE];
  float B[GEMM_STAGES][GEMM_BK * GEMM_BS_STRIDE];
};
// A union (one member since the wide tile was removed): as a struct, nvcc emits different PTX
// for the GEMM at MW_GEMM_MIN_BLOCKS=1.  The megakernel's transforms reuse it as plain floats.
union GemmSmem {
  GemmSmemNarrow n;
};

// x = big + small, both TF32 bit patterns (low 13 mantissa bits zero): big rounds x to nearest
// (ties away, as cvt.rna.tf32.f32, in two integer ops: x is finite), small = x - big (exact in
// fp32) truncated.  big*big + big*small + small*big carry x*y to about 2^-21 relative
// (small*small is dropped).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
}
// Shared-memory layout of a ROWS-row tile: STAGES A stages, then STAGES B stages.  The FFMA build
// keeps GemmSmemNarrow's layout (128-row A stages, 3 stages) for every tile.
template <int ROWS>
struct TileLayout {
  static constexpr bool VEC = MW_GEMM_TF32X3 && MW_GEMM_TF32_VEC;
  static constexpr int A_STRIDE = VEC ? GEMM_BK : GEMM_AS_STRIDE;
  static constexpr int B_STRIDE = VEC ? GEMM_BN : GEMM_BS_STRIDE;
  static constexpr int A_STAGE = (MW_GEMM_TF32X3 ? ROWS : GEMM_BM) * A_STRIDE;
  static constexpr int B_STAGE = GEMM_BK * B_STRIDE;
  static constexpr int FIT = static_cast<int>(sizeof(GemmSmem) / sizeof(float)) / (A_STAGE + B_STAGE);
  static constexpr int STAGES = MW_GEMM_TF32X3 ? (FIT < MW_GEMM_MAX_STAGES ? FIT : MW_GEMM_MAX_STAGES) : GEMM_STAGES;
  static_assert(STAGES >= 2 && STAGES * (A_STAGE + B_STAGE) * sizeof(float) <= sizeof(GemmSmem), "stages fit");
};

// One (MI*16) x 64 output tile: rows [row0, row0 + MI*16) of Vp / Mp, columns
// [col0, col0 + 64) of Up / Mp, columns >= col_end predicated off.
template <int MI>
__device__ __forceinline__ void gemm_tile(GemmSmemNarrow& sm, const float* Vp, const float* Up, float* Mp,
                                          long long row0, int col0, int col_end, int c_stride,
                                          int k_stride) {
  constexpr int ROWS = MI * 16;
  using L = TileLayout<ROWS>;
  constexpr int STAGES = L::STAGES;
  // Stage bases (the FFMA build: GemmSmemNarrow's members, as before TileLayout).
#if MW_GEMM_TF32X3
  float* const smem = reinterpret_cast<float*>(&sm);
  auto a_stage = [&](int stage) { return smem + stage * L::A_STAGE; };
  auto b_stage = [&](int stage) { return smem + STAGES * L::A_STAGE + stage * L::B_STAGE; };
#else
  auto a_stage = [&](int stage) { return sm.A[stage]; };
  auto b_stage = [&](int stage) { return sm.B[stage]; };
#endif
  constexpr int A_CHUNKS = ROWS * (GEMM_BK / 4);              // 16-byte chunks per stage
  constexpr int A_PER_THREAD = A_CHUNKS / BLOCK_THREADS;      // 2 or 1
  static_assert(A_CHUNKS % BLOCK_THREADS == 0, "A chunks");
  static_assert(GEMM_BK * GEMM_BN / 4 == BLOCK_THREADS, "one B chunk per thread");
  // TF32X3: %tid.x read through volatile asm; with threadIdx.x NVVM hoists the tile's
  // tid-derived offsets out of the megakernel's ticket loop, where they stay live through the
  // transform tasks (4 B spill in the m4 NHWC megakernel; bench/NOTES.md 19 saw the same).
  const int tid = MW_GEMM_TF32X3 ? thread_index() : static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
#if !MW_GEMM_TF32X3
  const int tr = (warp >> 1) * 4 + (lane >> 3);   // 0..15
  const int tc = (warp & 1) * 8 + (lane & 7);     // 0..15
#endif

  // Copy assignments (fixed per thread).
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
  // VEC: chunk c of B row k lands at chunk c ^ 2 ((k >> 2) & 3).
  const int b_dst_col = L::VEC ? (((b_col >> 2) ^ (2 * ((b_k >> 2) & 3))) << 2) : b_col;
  const float* a_src[A_PER_THREAD];
#pragma unroll
  for (int r = 0; r < A_PER_THREAD; ++r) a_src[r] = Vp + (row0 + a_row[r]) * c_stride + a_ch[r];
  const float* b_src = Up + static_cast<long long>(b_k) * k_stride + col0 + b_col;

  const int k_tiles = (c_stride + GEMM_BK - 1) / GEMM_BK;

  auto load_stage = [&](int kt, int stage) {
    const int kbase = kt * GEMM_BK;
#pragma unroll
    for (int r = 0; r < A_PER_THREAD; ++r) {
      const bool ok = kbase + a_ch[r] < c_stride;
      cp_async_cg16(&a_stage(stage)[a_row[r] * L::A_STRIDE + a_ch[r]], ok ? a_src[r] + kbase : Vp, ok);
    }
    const bool ok = b_col_ok && kbase + b_k < c_stride;
    cp_async_cg16(&b_stage(stage)[b_k * L::B_STRIDE + b_dst_col],
               ok ? b_src + static_cast<long long>(kbase) * k_stride : Up, ok);
  };

#if MW_GEMM_TF32X3
  // Warp tile: MT m16 row blocks x NT n8 column blocks of m16n8k8, 32 x 32 for 128-row tiles
  // (4 x 2 warps), 32 x 16 for 64-row tiles (2 x 4 warps): per k8 a warp reads and splits
  // 4 MT + 2 NT operands for 3 MT NT MMAs.
  constexpr int MT = 2;   // m16 blocks per warp (1: 16 x 64 warp tiles, 2-6% slower, NOTES.md 40)
  constexpr int WARPS_M = ROWS / (16 * MT);
  constexpr int WARPS_N = BLOCK_THREADS / 32 / WARPS_M;
  constexpr int NT = GEMM_BN / 8 / WARPS_N;
  static_assert(WARPS_M * WARPS_N * 32 == BLOCK_THREADS && NT * 8 * WARPS_N == GEMM_BN, "warp grid covers the tile");
  const int g = lane >> 2, t4 = lane & 3;
  const int warp_row = (warp % WARPS_M) * (16 * MT), warp_col = (warp / WARPS_M) * (8 * NT);
  constexpr int ACC_ROWS = MT * NT;   // acc[mt * NT + nt]: the C fragment of block (mt, nt)
#else
  constexpr int ACC_ROWS = MI;   // acc[i]: row tr + 16 i, columns tc * 4 + [0, 4)
#endif
  float acc[ACC_ROWS][4];
#pragma unroll
  for (int i = 0; i < ACC_ROWS; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();   // stage kt visible to all; stage kt-1 no longer read by anyone
    {
      const int nk = kt + STAGES - 1;
      if (nk < k_tiles) load_stage(nk, nk % STAGES);
      cp_async_commit();
    }
    const int stage = kt % STAGES;
    const float* As = a_stage(stage);
    const float* Bs = b_stage(stage);
#if MW_GEMM_TF32X3
    // Each (mt, nt) block's k-tile sum starts from zero and is added to acc with one FADD:
    // the tensor core's accumulation (not round-to-nearest) then only spans BK terms.  Per k8
    // the three products of all blocks are issued product by product, so MT * NT independent
    // MMAs separate two that accumulate into the same registers.
    float part[MT * NT][4];
#if MW_GEMM_TF32_VEC
    // Thread (g, t4) holds k 4 t4 .. 4 t4 + 3 of rows g and g + 8: MMA q takes k 4 t4 + 2 q as its
    // column t4 and k 4 t4 + 2 q + 1 as its column t4 + 4 (B rows likewise).
    static_assert(GEMM_BK == 16, "VEC fragments cover a 16-wide k tile");
    float4 a_vec[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        a_vec[mt][h] = *reinterpret_cast<const float4*>(As + (warp_row + 16 * mt + 8 * h + g) * L::A_STRIDE + 4 * t4);
#endif
#pragma unroll
    for (int q = 0; q < GEMM_BK / 8; ++q) {
      unsigned a_big[MT][4], a_small[MT][4], b_big[NT][2], b_small[NT][2];
#if MW_GEMM_TF32_VEC
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
        const float* bp = Bs + (4 * t4 + 2 * q) * L::B_STRIDE + ((((n >> 2) ^ (2 * t4)) << 2) | (n & 3));
        split_tf32(bp[0], b_big[nt][0], b_small[nt][0]);
        split_tf32(bp[L::B_STRIDE], b_big[nt][1], b_small[nt][1]);
      }
#else
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const float* ap = As + (warp_row + 16 * mt + g) * GEMM_AS_STRIDE + 8 * q + t4;
        split_tf32(ap[0], a_big[mt][0], a_small[mt][0]);
        split_tf32(ap[8 * GEMM_AS_STRIDE], a_big[mt][1], a_small[mt][1]);
        split_tf32(ap[4], a_big[mt][2], a_small[mt][2]);
        split_tf32(ap[8 * GEMM_AS_STRIDE + 4], a_big[mt][3], a_small[mt][3]);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float* bp = Bs + (8 * q + t4) * GEMM_BS_STRIDE + warp_col + 8 * nt + g;
        split_tf32(bp[0], b_big[nt][0], b_small[nt][0]);
        split_tf32(bp[4 * GEMM_BS_STRIDE], b_big[nt][1], b_small[nt][1]);
      }
#endif
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
#else
#pragma unroll
    for (int kk = 0; kk < GEMM_BK; kk += 4) {
      float4 a[MI], b[4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        a[i] = *reinterpret_cast<const float4*>(As + (tr + 16 * i) * GEMM_AS_STRIDE + kk);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        b[j] = *reinterpret_cast<const float4*>(Bs + (kk + j) * GEMM_BS_STRIDE + tc * 4);
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
#endif
  }
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task

#if MW_GEMM_TF32X3
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
#else
  if (col0 + tc * 4 < col_end) {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      float* dst = Mp + (row0 + tr + 16 * i) * k_stride + col0 + tc * 4;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
  }
#endif
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
    for (; r + 128 <= tpg; r += 128) gemm_tile<8>(sm.n, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    for (; r < tpg; r += 64) gemm_tile<4>(sm.n, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
  }
}

}  // namespace mw
