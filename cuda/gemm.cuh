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

struct GemmSmemNarrow {
  float A[GEMM_STAGES][GEMM_BM * GEMM_AS_STRIDE];
  float B[GEMM_STAGES][GEMM_BK * GEMM_BS_STRIDE];
};
// A union (one member since the wide tile was removed): as a struct, nvcc emits different PTX
// for the GEMM at MW_GEMM_MIN_BLOCKS=1.  The megakernel's transforms reuse it as plain floats.

// Opt-in wide tile (bench/NOTES.md experiments 6, 19): 0 = narrow tile only (the default build).
#ifndef MW_GEMM_WIDE
#define MW_GEMM_WIDE 0
#endif
// Narrow tile's threadIdx.x read (gemm_thread): volatile in the megakernel of a wide build
// (megakernel.cu defines MW_MEGA_MIN_BLOCKS before including this header), plain otherwise.
#ifndef MW_GEMM_NARROW_VTID
#if MW_GEMM_WIDE && defined(MW_MEGA_MIN_BLOCKS)
#define MW_GEMM_NARROW_VTID 1
#else
#define MW_GEMM_NARROW_VTID 0
#endif
#endif
#if MW_GEMM_WIDE
#ifndef MW_GEMM_W_STAGES
#define MW_GEMM_W_STAGES 4
#endif
constexpr int GEMM_W_BN = 128;
constexpr int GEMM_W_BK = 8;
constexpr int GEMM_W_STAGES = MW_GEMM_W_STAGES;
constexpr int GEMM_W_AS_STRIDE = 128 + 4;
struct GemmStageWide {
  float A[GEMM_W_BK * GEMM_W_AS_STRIDE];   // A transposed: [k][row], +4 pad
  float B[GEMM_W_BK * GEMM_W_BN];          // [k][col]
};
// The tile's task coordinates wait in shared memory while the k loop runs (not in registers).
struct WideCtx {
  int group, index, it, col_left;
  const float* v;   // V[pos] + row0 * c_stride
  const float* u;   // U[pos] + col
};
struct GemmSmemWide {
  GemmStageWide s[GEMM_W_STAGES];
  WideCtx ctx;
};
static_assert(sizeof(GemmSmemWide) <= sizeof(GemmSmemNarrow), "the wide tile fits the narrow tile's shared memory");
static_assert(CHANNEL_ALIGN % GEMM_W_BK == 0, "c_stride is a multiple of the wide tile's BK: no k tail");
#endif
union GemmSmem {
  GemmSmemNarrow n;
#if MW_GEMM_WIDE
  GemmSmemWide w;
#endif
};

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;   // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// threadIdx.x for the GEMM tiles.  volatile = true reads it through a volatile asm, so a tile
// derives its thread offsets itself instead of the compiler hoisting them to the kernel's entry;
// in the persistent megakernel hoisted offsets stay live across every task, the wide tile's k
// loop included (7 registers of the narrow tile's alone).  The wide tile always reads it so;
// the narrow tile only in the megakernel of a wide build (MW_GEMM_NARROW_VTID below; in the
// non-fused kernel the volatile read made ptxas spill the narrow path).  Default build: plain
// threadIdx.x everywhere (PTX unchanged).
template <bool Volatile>
__device__ __forceinline__ int gemm_thread() {
  if constexpr (Volatile) {
    int t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
  } else {
    return threadIdx.x;
  }
}

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
  const int tid = gemm_thread<MW_GEMM_NARROW_VTID != 0>();
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

#if MW_GEMM_WIDE
// Wide tile (opt-in, MW_GEMM_WIDE=1; bench/NOTES.md experiment 19): (RH*64) x 128 outputs,
// 256 threads, micro-tile (RH*4) x 8, BK 8, GEMM_W_STAGES-deep cp.async ring.
//   s[stage].A[k][128 + 4]  A transposed (k-major) by 4-byte cp.async.ca: a thread copies
//                           KPT = 2 RH consecutive k of one row from one source address
//                           (immediate offsets); banks (4k + row) % 32 all distinct per warp
//   s[stage].B[k][128]      U rows, 16-byte cp.async.cg (past the span: zero-fill)
//   ctx                     the tile's task coordinates and V / U bases (WideCtx)
// Thread (tr, tc) owns rows h * 64 + tr * 4 + [0, 4) and columns c * 64 + tc * 4 + [0, 4).
// k loop fully unrolled with the fragments double-buffered in registers: the LDS of step k + 1
// are issued before the FFMAs of step k; at k = BK - 1 the block waits for the next stage and
// loads its k = 0 fragments before the last 64 FFMAs.  c_stride % BK == 0 (CHANNEL_ALIGN), so
// no k tail; one __fmaf_rn per k in order per element: the narrow tile's bits.
// Registers (128 cap of 2 blocks/SM): per-thread shared offsets come from a volatile tid read
// per k tile, the copies' 64-bit bases from ctx (LDS) per k tile, the store geometry is derived
// again after the k loop; live across the k loop: 64 accumulators, the fragments, two shared
// read offsets.  gemm_tile_wide<2> alone fits __maxnreg__(96) without spills.
// Geometry of wide tile `it` of GEMM task (group, index): it = column span * row blocks + row
// block; row blocks are 128 rows, the last one 64 when tiles_per_group % 128 == 64.  Derived
// from Params at the start of a tile and again for its stores (nothing 64-bit stays live
// across the k loop or between tiles).
struct WideTile {
  long long v_off;   // V[pos] + row0 * c_stride (floats)
  long long u_off;   // U[pos] + col
  long long m_off;   // M[pos] + row0 * k_stride + col
  int col_left;      // columns of the span left from col (may exceed 128)
};
__device__ __forceinline__ WideTile wide_tile_geometry(const Params& p, int group, int index, int it) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int pos = index / static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int row_blocks = (tpg + 127) >> 7;
  const int cb = it / row_blocks, rb = it - cb * row_blocks;
  const long long row0 = static_cast<long long>(group) * tpg + rb * 128;
  const int col = k0 + cb * GEMM_W_BN;
  WideTile g;
  g.v_off = (pos * p.tiles_padded + row0) * p.c_stride;
  g.u_off = pos * p.c_stride * p.k_stride + col;
  g.m_off = (pos * p.tiles_padded + row0) * p.k_stride + col;
  g.col_left = k1 - col;
  return g;
}

// group / index / it: in at the start, out again after the k loop (read back from sm.ctx, so the
// caller's copies are dead while the k loop runs).
template <int RH>
__device__ __forceinline__ void gemm_tile_wide(const Params& p, GemmSmemWide& sm, int& group, int& index, int& it) {
  constexpr int BK = GEMM_W_BK;
  constexpr int ST = GEMM_W_STAGES;
  constexpr int AS = GEMM_W_AS_STRIDE;
  constexpr int MR = RH * 4;                        // rows per thread
  constexpr int KPT = RH * 64 * BK / BLOCK_THREADS;  // A copies per thread: consecutive k of one row
  constexpr int TPR = BK / KPT;                      // threads per A row
  static_assert(BK * GEMM_W_BN / 4 == BLOCK_THREADS, "one B chunk per thread");
  constexpr unsigned STAGE_BYTES = sizeof(GemmStageWide);
  const int tid = gemm_thread<true>();
  const int c_stride = static_cast<int>(p.c_stride);
  const int k_tiles = c_stride / BK;

  const int k_stride = static_cast<int>(p.k_stride);
  const unsigned a_base = static_cast<unsigned>(__cvta_generic_to_shared(&sm.s[0].A[0]));
  const unsigned b_base = static_cast<unsigned>(__cvta_generic_to_shared(&sm.s[0].B[0]));

  // Copies of k tile kt into slot `stage` (t = threadIdx.x, read per k tile; v / u / col_left:
  // the tile's bases and columns, see WideCtx).  A: row t / TPR, k (t % TPR) * KPT + [0, KPT)
  // (one source address, the KPT 4-byte copies at immediate offsets; banks (4 k + row) % 32
  // distinct within a warp).  B: one 16-byte chunk, k t >> 5, columns (t & 31) * 4; past the
  // span's last column: zero-fill from a clamped address.
  auto load_stage = [&](int kt, int stage, int t, const float* v, const float* u, int col_left) {
    const unsigned so = stage * STAGE_BYTES;
    const unsigned a_dst = a_base + so + 4u * ((t % TPR) * KPT * AS + t / TPR);
    const float* a_src = v + ((t / TPR) * c_stride + (t % TPR) * KPT + kt * BK);
#pragma unroll
    for (int j = 0; j < KPT; ++j)
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a_dst + 4u * (j * AS)), "l"(a_src + j)
                   : "memory");
    const int b_col = (t & 31) * 4;
    const float* b_src = u + ((kt * BK + (t >> 5)) * k_stride + min(b_col, col_left - 4));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(b_base + so + 16u * t), "l"(b_src),
                 "r"(b_col < col_left ? 16 : 0) : "memory");
  };

  float acc[MR][8];
#pragma unroll
  for (int i = 0; i < MR; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

  {
    const WideTile g = wide_tile_geometry(p, group, index, it);
    const float* v = reinterpret_cast<const float*>(p.V) + g.v_off;
    const float* u = reinterpret_cast<const float*>(p.U) + g.u_off;
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
      if (s < k_tiles) load_stage(s, s, tid, v, u, g.col_left);
      cp_async_commit();
    }
    // Thread 0 parks the tile's coordinates and bases; every thread reads them back after the
    // barriers below (the k loop's copies take the bases from here, the stores the
    // coordinates), so no 64-bit pointer and no task coordinate stays live across the k loop.
    if (tid == 0) sm.ctx = WideCtx{group, index, it, g.col_left, v, u};
  }

  // Fragment reads: thread (tr, tc) = ((warp >> 1) * 4 + (lane >> 3), (warp & 1) * 8 + (lane & 7)).
  auto rd_a = [&](int t) { return a_base + 16u * (((t >> 6) << 2) + ((t & 31) >> 3)); };
  auto rd_b = [&](int t) { return b_base + 16u * ((((t >> 5) & 1) << 3) + (t & 7)); };
  float a[2][MR], b[2][8];
  auto load_frag = [&](int buf, unsigned ar, unsigned br, int k) {
#pragma unroll
    for (int h = 0; h < RH; ++h) {
      float4 v;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(ar + 4u * (k * AS + h * 64)));
      a[buf][h * 4 + 0] = v.x; a[buf][h * 4 + 1] = v.y; a[buf][h * 4 + 2] = v.z; a[buf][h * 4 + 3] = v.w;
    }
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float4 v;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(br + 4u * (k * GEMM_W_BN + c * 64)));
      b[buf][c * 4 + 0] = v.x; b[buf][c * 4 + 1] = v.y; b[buf][c * 4 + 2] = v.z; b[buf][c * 4 + 3] = v.w;
    }
  };

  cp_async_wait<ST - 2>();
  __syncthreads();   // stage 0 visible to all
  load_frag(0, rd_a(tid), rd_b(tid), 0);
  int stage = 0;
#pragma unroll 1
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int t = gemm_thread<true>();
    {
      // Slot of tile kt + ST - 1 = slot of tile kt - 1: every thread passed the barrier below
      // after its last read of it.
      const int ws = stage == 0 ? ST - 1 : stage - 1;
      if (kt + ST - 1 < k_tiles) {
        const WideCtx& c = sm.ctx;
        load_stage(kt + ST - 1, ws, t, c.v, c.u, c.col_left);
      }
      cp_async_commit();
    }
    const unsigned ar = rd_a(t), br = rd_b(t);
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const int cur = k & 1;
      if (k + 1 < BK) {
        load_frag(cur ^ 1, ar + stage * STAGE_BYTES, br + stage * STAGE_BYTES, k + 1);
      } else {
        cp_async_wait<ST - 2>();
        __syncthreads();   // tile kt + 1 visible to all; tile kt no longer read by anyone
        stage = stage == ST - 1 ? 0 : stage + 1;
        load_frag(cur ^ 1, ar + stage * STAGE_BYTES, br + stage * STAGE_BYTES, 0);
      }
#pragma unroll
      for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = __fmaf_rn(a[cur][i], b[cur][j], acc[i][j]);
    }
  }
  cp_async_wait<0>();
  {
    const WideCtx c = sm.ctx;   // written before the k loop's barriers, rewritten after the next one
    group = c.group;
    index = c.index;
    it = c.it;
  }
  __syncthreads();   // shared memory free for the next tile / task

  // Stores: geometry derived again from Params (opaque pointer: reloaded, not kept live).
  const Params* pp = &p;
  asm volatile("" : "+l"(pp));
  const WideTile g = wide_tile_geometry(*pp, group, index, it);
  const int m_stride = static_cast<int>(pp->k_stride);
  const int t = gemm_thread<true>();
  const int tr = ((t >> 6) << 2) + ((t & 31) >> 3);
  const int tc = (((t >> 5) & 1) << 3) + (t & 7);
  float* Mt = reinterpret_cast<float*>(pp->Mbuf) + g.m_off;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col = c * 64 + tc * 4;
    if (col < g.col_left) {
#pragma unroll
      for (int h = 0; h < RH; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float* dst = Mt + (h * 64 + tr * 4 + i) * m_stride + col;
          *reinterpret_cast<float4*>(dst) = make_float4(acc[h * 4 + i][c * 4 + 0], acc[h * 4 + i][c * 4 + 1],
                                                        acc[h * 4 + i][c * 4 + 2], acc[h * 4 + i][c * 4 + 3]);
        }
    }
  }
}
#endif

__device__ __forceinline__ void gemm_task(const Params& p, GemmSmem& sm, int group, int index) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
#if MW_GEMM_WIDE
  if (k1 - k0 > GEMM_BN) {   // more than 64 columns: wide tiles, the last column span predicated
    int g = group, j = index;
#pragma unroll 1
    for (int it = 0;; ++it) {
      // Tile count derived again after every tile (opaque pointer): nothing but g / j / it
      // (themselves parked in shared memory during a tile) is carried from tile to tile.
      const Params* pp = &p;
      asm volatile("" : "+l"(pp));
      const int tpg = static_cast<int>(pp->tiles_per_group);
      const int kw = static_cast<int>(pp->gemm_k_per_task);
      const int k_lo = (j % static_cast<int>(pp->k_blocks)) * kw;
      const int span = min(static_cast<int>(pp->k_stride), k_lo + kw) - k_lo;
      const int row_blocks = (tpg + 127) >> 7;
      if (it >= ((span + GEMM_W_BN - 1) / GEMM_W_BN) * row_blocks) break;
      if ((it % row_blocks) * 128 + 128 <= tpg)
        gemm_tile_wide<2>(p, sm.w, g, j, it);
      else
        gemm_tile_wide<1>(p, sm.w, g, j, it);
    }
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
