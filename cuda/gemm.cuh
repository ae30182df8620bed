// GEMM task (group g, j = position * k_blocks + K block):
//   M[p][rows of g][K block] = V[p][rows of g][:] @ U[p][:][K block]
// Mirrors megawino/stages/gemm.py.  float32 FFMA only.
//
// Block tile 128 rows x 64 columns (64-row chunks take a 64 x 64 variant),
// 256 threads, register micro-tile 8 x 4 (4 x 4), BK = 16, GEMM_STAGES-deep
// cp.async pipeline (16-byte copies, L1 bypassed: .cg).
//   As[stage][row][BK + 4]  (V rows, C contiguous; the +4 pad makes the four
//                            rows a warp reads at one time hit distinct banks)
//   Bs[stage][BK][64]       (U rows, K contiguous)
// Thread (tr, tc) owns rows tr + 16 i and columns tc * 4 + [0, 4); a warp is
// 4 row-threads x 8 column-threads, so each LDS.128 of a warp reads 4 distinct
// A addresses and 8 consecutive B vectors (128 bytes): no bank conflicts.
// Every output element is one reduction over k = 0 .. c_stride-1 in order, one
// __fmaf_rn per k (zero-filled k beyond c_stride adds +0): no split-K, no
// atomics, the same bits for every mapping and both executors.
//
// Wide variant (bench/NOTES.md experiment 6; column spans > 64, i.e. gemm_k_per_task >= 128):
// block tile 128 (64) rows x 128 columns, 256 threads, micro-tile 8 x 8 (4 x 8), BK = 8,
// GEMM_W_STAGES-deep cp.async pipeline.
//   Aw[stage][k][128 + 4]  A transposed (k-major) by 4-byte cp.async.ca copies: lanes of a
//                          warp copy 8 k x 4 rows; with the +4 pad their banks are all distinct
//   Bw[stage][k][128]      U rows, 16-byte cp.async.cg
// Thread (tr, tc) owns rows h * 64 + tr * 4 + [0, 4) and columns c * 64 + tc * 4 + [0, 4)
// (h, c in {0, 1}); per k a thread reads two float4 of A and two of B (each warp-wide LDS.128
// covers 64 or 128 contiguous bytes: conflict-free) for 64 FFMA.  Same per-element reduction
// order as the narrow tile, so both tiles give the same bits.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"

namespace mw {

constexpr int BLOCK_THREADS = 256;
constexpr int GEMM_BM = 128;
constexpr int GEMM_BN = 64;
constexpr int GEMM_BK = 16;
constexpr int GEMM_STAGES = 3;
constexpr int GEMM_AS_STRIDE = GEMM_BK + 4;
constexpr int GEMM_BS_STRIDE = GEMM_BN;

static_assert(GEMM_BLOCK_ROWS % 64 == 0, "GEMM tasks come in 64-row chunks");
static_assert(CHANNEL_ALIGN % 4 == 0 && K_ALIGN % 4 == 0, "16-byte copies need 4-float alignment");

#ifndef MW_GEMM_W_STAGES
#define MW_GEMM_W_STAGES 4
#endif
#ifndef MW_GEMM_W_KUNROLL
#define MW_GEMM_W_KUNROLL 2   // fits the 128-register cap of 2 blocks/SM; 1 block/SM: 8
#endif
constexpr int GEMM_W_KUNROLL = MW_GEMM_W_KUNROLL;
constexpr int GEMM_W_BN = 128;
constexpr int GEMM_W_BK = 8;
constexpr int GEMM_W_STAGES = MW_GEMM_W_STAGES;
constexpr int GEMM_W_AS_STRIDE = 128 + 4;
constexpr int GEMM_W_BS_STRIDE = GEMM_W_BN;

struct GemmSmemNarrow {
  float A[GEMM_STAGES][GEMM_BM * GEMM_AS_STRIDE];
  float B[GEMM_STAGES][GEMM_BK * GEMM_BS_STRIDE];
};
struct GemmSmemWide {
  float A[GEMM_W_STAGES][GEMM_W_BK * GEMM_W_AS_STRIDE];
  float B[GEMM_W_STAGES][GEMM_W_BK * GEMM_W_BS_STRIDE];
};
union GemmSmem {
  GemmSmemNarrow n;
  GemmSmemWide w;
};

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;   // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async4(float* smem, const float* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes)
               : "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// One (MI*16) x 64 output tile: rows [row0, row0 + MI*16) of Vp / Mp, columns
// [col0, col0 + 64) of Up / Mp, columns >= col_end predicated off.
template <int MI>
__device__ __forceinline__ void gemm_tile(GemmSmemNarrow& sm, const float* Vp, const float* Up, float* Mp,
                                          long long row0, int col0, int col_end, int c_stride,
                                          int k_stride) {
  constexpr int ROWS = MI * 16;
  constexpr int A_CHUNKS = ROWS * (GEMM_BK / 4);              // 16-byte chunks per stage
  constexpr int A_PER_THREAD = A_CHUNKS / BLOCK_THREADS;      // 2 or 1
  static_assert(A_CHUNKS % BLOCK_THREADS == 0, "A chunks");
  static_assert(GEMM_BK * GEMM_BN / 4 == BLOCK_THREADS, "one B chunk per thread");
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int tr = (warp >> 1) * 4 + (lane >> 3);   // 0..15
  const int tc = (warp & 1) * 8 + (lane & 7);     // 0..15

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
      cp_async16(&sm.A[stage][a_row[r] * GEMM_AS_STRIDE + a_ch[r]], ok ? a_src[r] + kbase : Vp, ok);
    }
    const bool ok = b_col_ok && kbase + b_k < c_stride;
    cp_async16(&sm.B[stage][b_k * GEMM_BS_STRIDE + b_col],
               ok ? b_src + static_cast<long long>(kbase) * k_stride : Up, ok);
  };

  float acc[MI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

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
    const float* As = sm.A[stage];
    const float* Bs = sm.B[stage];
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
  }
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task

  if (col0 + tc * 4 < col_end) {
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      float* dst = Mp + (row0 + tr + 16 * i) * k_stride + col0 + tc * 4;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
    }
  }
}

// Geometry of wide tile `it` of GEMM task (group, index): it = column span * row blocks + row
// block; row blocks are 128 rows, the last one 64 when tiles_per_group % 128 == 64.
struct WideTile {
  const float* Vp;     // V[pos] + row0 * c_stride
  const float* Up;     // U[pos] + col
  float* Mp;           // M[pos] + row0 * k_stride + col
  int col_left;        // columns of the span left from col (may exceed 128)
  int rows;            // 128 or 64
};

__device__ __forceinline__ WideTile wide_tile_geometry(const Params& p, int group, int index, int it) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int pos = index / static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int row_blocks = (tpg + 127) >> 7;
  const int cb = it / row_blocks, rb = it - cb * row_blocks;
  const long long c_stride = p.c_stride, k_stride = p.k_stride;
  const long long row0 = static_cast<long long>(group) * tpg + rb * 128;
  const int col = k0 + cb * GEMM_W_BN;
  WideTile g;
  g.Vp = reinterpret_cast<const float*>(p.V) + (pos * p.tiles_padded + row0) * c_stride;
  g.Up = reinterpret_cast<const float*>(p.U) + pos * c_stride * k_stride + col;
  g.Mp = reinterpret_cast<float*>(p.Mbuf) + (pos * p.tiles_padded + row0) * k_stride + col;
  g.col_left = k1 - col;
  g.rows = min(128, tpg - rb * 128);
  return g;
}

// One (RH*64) x 128 output tile (wide variant).  The load pointers are derived up front and the
// store pointer again at the end (fewer registers live around the 8 x 8 micro-tile).
template <int RH>
__device__ __forceinline__ void gemm_tile_wide(const Params& p, GemmSmemWide& sm, int group, int index,
                                               int it) {
  constexpr int BK = GEMM_W_BK;
  constexpr int ST = GEMM_W_STAGES;
  constexpr int ROWS = RH * 64;
  constexpr int A_PER_THREAD = ROWS * BK / BLOCK_THREADS;   // 4 or 2 single floats
  static_assert(BK == 8 && BK * GEMM_W_BN / 4 == BLOCK_THREADS, "one B chunk per thread");
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int tr = (warp >> 1) * 4 + (lane >> 3);   // 0..15: rows h*64 + tr*4 + [0,4)
  const int tc = (warp & 1) * 8 + (lane & 7);     // 0..15: cols c*64 + tc*4 + [0,4)
  const int c_stride = static_cast<int>(p.c_stride);
  const int k_tiles = (c_stride + BK - 1) / BK;

  // A copies: element e = tid + r * 256 -> k = tid & 7, row = (tid >> 3) + 32 r; 4-byte copies.
  // B copies: one 16-byte chunk: k = tid >> 5, cols (tid & 31) * 4.  A copy that is off reads
  // nothing (src-size 0) and points at the thread's first element.
  const float* a_src;
  const float* b_src;
  bool b_col_ok;
  int b_kstep;
  {
    const WideTile g = wide_tile_geometry(p, group, index, it);
    a_src = g.Vp + (tid >> 3) * c_stride + (tid & 7);
    b_col_ok = (tid & 31) * 4 < g.col_left;
    b_kstep = static_cast<int>(p.k_stride);
    b_src = g.Up + (b_col_ok ? (tid >> 5) * b_kstep + (tid & 31) * 4 : 0);
  }
  const unsigned a_dst = static_cast<unsigned>(__cvta_generic_to_shared(&sm.A[0][0])) +
                         4u * ((tid & 7) * GEMM_W_AS_STRIDE + (tid >> 3));
  const unsigned b_dst = static_cast<unsigned>(__cvta_generic_to_shared(&sm.B[0][0])) +
                         4u * ((tid >> 5) * GEMM_W_BS_STRIDE + (tid & 31) * 4);

  auto load_stage = [&](int kt, int stage) {
    const int kbase = kt * BK;
    const bool a_ok = kbase + (tid & 7) < c_stride;
    const float* as = a_src + (a_ok ? kbase : 0);
#pragma unroll
    for (int r = 0; r < A_PER_THREAD; ++r) {
      const unsigned s = a_dst + 4u * (stage * BK * GEMM_W_AS_STRIDE + r * 32);
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s),
                   "l"(as + r * 32 * c_stride), "r"(a_ok ? 4 : 0) : "memory");
    }
    const bool ok = b_col_ok && kbase + (tid >> 5) < c_stride;
    const unsigned s = b_dst + 4u * (stage * BK * GEMM_W_BS_STRIDE);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s),
                 "l"(b_src + (ok ? kbase * b_kstep : 0)), "r"(ok ? 16 : 0) : "memory");
  };

  float acc[RH * 4][8];
#pragma unroll
  for (int i = 0; i < RH * 4; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<ST - 2>();
    __syncthreads();   // stage kt visible to all; stage kt-1 no longer read by anyone
    {
      const int nk = kt + ST - 1;
      if (nk < k_tiles) load_stage(nk, nk % ST);
      cp_async_commit();
    }
    const int stage = kt % ST;
    const float* As = sm.A[stage] + tr * 4;
    const float* Bs = sm.B[stage] + tc * 4;
#pragma unroll GEMM_W_KUNROLL
    for (int k = 0; k < BK; ++k) {
      float a[RH * 4], b[8];
#pragma unroll
      for (int h = 0; h < RH; ++h) {
        const float4 v = *reinterpret_cast<const float4*>(As + k * GEMM_W_AS_STRIDE + h * 64);
        a[h * 4 + 0] = v.x; a[h * 4 + 1] = v.y; a[h * 4 + 2] = v.z; a[h * 4 + 3] = v.w;
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float4 v = *reinterpret_cast<const float4*>(Bs + k * GEMM_W_BS_STRIDE + c * 64);
        b[c * 4 + 0] = v.x; b[c * 4 + 1] = v.y; b[c * 4 + 2] = v.z; b[c * 4 + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < RH * 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[i], b[j], acc[i][j]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task

  const WideTile g = wide_tile_geometry(p, group, index, it);
  const int k_stride = static_cast<int>(p.k_stride);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col = c * 64 + tc * 4;
    if (col < g.col_left) {
#pragma unroll
      for (int h = 0; h < RH; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float* dst = g.Mp + (h * 64 + tr * 4 + i) * k_stride + col;
          *reinterpret_cast<float4*>(dst) =
              make_float4(acc[h * 4 + i][c * 4 + 0], acc[h * 4 + i][c * 4 + 1], acc[h * 4 + i][c * 4 + 2],
                          acc[h * 4 + i][c * 4 + 3]);
        }
    }
  }
}

__device__ __forceinline__ void gemm_wide_tile(const Params& p, GemmSmemWide& sm, int group, int index,
                                               int it) {
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int row_blocks = (tpg + 127) >> 7;
  const int rb = it % row_blocks;
  if (rb * 128 + 128 <= tpg)
    gemm_tile_wide<2>(p, sm, group, index, it);
  else
    gemm_tile_wide<1>(p, sm, group, index, it);
}

__device__ __forceinline__ void gemm_task(const Params& p, GemmSmem& sm, int group, int index) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
#ifdef MW_GEMM_WIDE   // opt-in: measured no faster than the narrow tile (bench/NOTES.md exp. 6)
  if (k1 - k0 > GEMM_BN) {
    // Wide task (more than 64 columns): every tile wide, the last column span predicated
    // (same per-element reduction as the narrow tile, so the same bits).
    const int n = ((k1 - k0 + GEMM_W_BN - 1) / GEMM_W_BN) * ((static_cast<int>(p.tiles_per_group) + 127) >> 7);
#pragma unroll 1
    for (int it = 0; it < n; ++it) gemm_wide_tile(p, sm.w, group, index, it);
    return;
  }
#endif
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
