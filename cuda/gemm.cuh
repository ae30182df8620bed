// GEMM task (group g, j = position * k_blocks + K block):
//   M[p][rows of g][K block] = V[p][rows of g][:] @ U[p][:][K block]
// Mirrors megawino/stages/gemm.py.  float32 FFMA (the opt-in MW_GEMM_TF32X3 build: 3xTF32 tensor cores).
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
// MW_GEMM_SHARED_RING (a build variant the runtime picks per layer, megawino.tasks
// .gemm_shared_ring): 1 = one cp.async ring through all tiles of a GEMM task, 0 = a ring per
// tile.  Separate builds, because the shared-ring code in the same kernel slowed the per-tile
// path by ~5% on the C >= 256 layers (register allocation at the 128 cap, bench/NOTES.md 33).
#ifndef MW_GEMM_SHARED_RING
#define MW_GEMM_SHARED_RING 1
#endif
// MW_GEMM_TF32X3 (opt-in experiment, bench/NOTES.md 25): the tile's products on tensor cores
// as three TF32 MMAs (big*big + big*small + small*big of each operand's TF32 split).  Its B
// fragment reads 4 k rows x 8 columns per warp instruction: a row stride of 72 floats puts
// them in 32 distinct banks (64 would be a 4-way conflict).
#ifndef MW_GEMM_TF32X3
#define MW_GEMM_TF32X3 0
#endif
constexpr int GEMM_BS_STRIDE = MW_GEMM_TF32X3 ? GEMM_BN + 8 : GEMM_BN;

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

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;   // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// x = big + small, both TF32 bit patterns (low 13 mantissa bits zero): big rounds x to nearest
// (ties away, as cvt.rna.tf32.f32, in two integer ops: x is finite), small = x - big (exact in
// fp32) truncated.  big*big + big*small + small*big carry x*y to about 2^-21 relative
// (small*small is dropped).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
}
// d += a (16 x 8, row) * b (8 x 8, col) on the tensor cores.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A task's (MI*16) x 64 output tiles: row tiles [row0, row0 + row_tiles * MI*16) of Vp / Mp
// times column tiles [col0, col0 + col_tiles * 64) of Up / Mp (columns >= col_end predicated
// off), column-tile major.  SHARED_RING: one cp.async ring runs through all of them (bench/NOTES.md
// 33): the next tile's first k tiles load while the current one finishes, so only the task's
// first load is exposed (a small-C tile has 2-4 k tiles: a fresh ring per tile exposed one load
// latency in each).  Otherwise exactly one tile.  Each output element is one __fmaf_rn chain
// over k in order either way: same bits.
template <int MI, bool SHARED_RING>
__device__ __forceinline__ void gemm_tiles(GemmSmemNarrow& sm, const float* Vp, const float* Up, float* Mp,
                                           long long row0, int row_tiles, int col0, int col_tiles, int col_end,
                                           int c_stride, int k_stride) {
  if constexpr (!SHARED_RING) row_tiles = col_tiles = 1;   // one tile: the ring is the tile's own
  constexpr int ROWS = MI * 16;
  constexpr int A_CHUNKS = ROWS * (GEMM_BK / 4);              // 16-byte chunks per stage
  constexpr int A_PER_THREAD = A_CHUNKS / BLOCK_THREADS;      // 2 or 1
  static_assert(A_CHUNKS % BLOCK_THREADS == 0, "A chunks");
  static_assert(GEMM_BK * GEMM_BN / 4 == BLOCK_THREADS, "one B chunk per thread");
  const int tid = threadIdx.x;
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

  const int k_tiles = (c_stride + GEMM_BK - 1) / GEMM_BK;
  const int total = row_tiles * col_tiles * k_tiles;   // ring steps of the task

  // Sources of a ring step.  One tile: fixed row / column bases, the step is the k tile.
  // Shared ring: (tile, k tile) advanced incrementally, the bases derived per step.
  const float* a_src[A_PER_THREAD];
#pragma unroll
  for (int r = 0; r < A_PER_THREAD; ++r) a_src[r] = Vp + (row0 + a_row[r]) * c_stride + a_ch[r];
  const float* b_src = Up + static_cast<long long>(b_k) * k_stride + col0 + b_col;
  const bool b_col_ok = col0 + b_col < col_end;
  int load_tile = 0, load_kt = 0;
  auto load_next = [&](int step, int stage) {
    if constexpr (SHARED_RING) {
      const int ct = load_tile / row_tiles;
      const long long dr = static_cast<long long>(load_tile - ct * row_tiles) * ROWS * c_stride;
      const int dc = ct * GEMM_BN;
      const int kbase = load_kt * GEMM_BK;
#pragma unroll
      for (int r = 0; r < A_PER_THREAD; ++r) {
        const bool ok = kbase + a_ch[r] < c_stride;
        cp_async16(&sm.A[stage][a_row[r] * GEMM_AS_STRIDE + a_ch[r]], ok ? a_src[r] + dr + kbase : Vp, ok);
      }
      const bool ok = col0 + dc + b_col < col_end && kbase + b_k < c_stride;
      cp_async16(&sm.B[stage][b_k * GEMM_BS_STRIDE + b_col],
                 ok ? b_src + static_cast<long long>(kbase) * k_stride + dc : Up, ok);
      if (++load_kt == k_tiles) {
        load_kt = 0;
        ++load_tile;
      }
    } else {
      const int kbase = step * GEMM_BK;
#pragma unroll
      for (int r = 0; r < A_PER_THREAD; ++r) {
        const bool ok = kbase + a_ch[r] < c_stride;
        cp_async16(&sm.A[stage][a_row[r] * GEMM_AS_STRIDE + a_ch[r]], ok ? a_src[r] + kbase : Vp, ok);
      }
      const bool ok = b_col_ok && kbase + b_k < c_stride;
      cp_async16(&sm.B[stage][b_k * GEMM_BS_STRIDE + b_col],
                 ok ? b_src + static_cast<long long>(kbase) * k_stride : Up, ok);
    }
  };

#if MW_GEMM_TF32X3
  // Warp tile: one m16 row block x NT n8 column blocks of m16n8k8 (16 x 64 for 128-row tiles,
  // 16 x 32 for 64-row tiles): one A fragment per k step keeps the registers under the cap.
  constexpr int WARPS_M = ROWS / 16;
  constexpr int NT = GEMM_BN / 8 / (BLOCK_THREADS / 32 / WARPS_M);
  static_assert(WARPS_M * (GEMM_BN / (8 * NT)) * 32 == BLOCK_THREADS, "warp grid covers the tile");
  const int g = lane >> 2, t4 = lane & 3;
  const int warp_row = (warp % WARPS_M) * 16, warp_col = (warp / WARPS_M) * (8 * NT);
  constexpr int ACC_ROWS = NT;   // acc[j]: the C fragment of n8 block j
#else
  constexpr int ACC_ROWS = MI;   // acc[i]: row tr + 16 i, columns tc * 4 + [0, 4)
#endif
  float acc[ACC_ROWS][4];
#pragma unroll
  for (int i = 0; i < ACC_ROWS; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  auto store_tile = [&](int t) {
    const int ct = t / row_tiles;
    const long long r0 = row0 + static_cast<long long>(t - ct * row_tiles) * ROWS;
    const int col = col0 + ct * GEMM_BN;
#if MW_GEMM_TF32X3
    // C fragment: rows g and g + 8, columns 2 t4 and 2 t4 + 1 of each n8 block.  col_end
    // is a multiple of K_ALIGN (4), so a column pair is wholly inside or wholly outside.
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int c = col + warp_col + 8 * j + 2 * t4;
      if (c < col_end) {
        float* dst = Mp + (r0 + warp_row + g) * k_stride + c;
        *reinterpret_cast<float2*>(dst) = make_float2(acc[j][0], acc[j][1]);
        *reinterpret_cast<float2*>(dst + 8 * k_stride) = make_float2(acc[j][2], acc[j][3]);
      }
    }
#else
    if (col + tc * 4 < col_end) {
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        float* dst = Mp + (r0 + tr + 16 * i) * k_stride + col + tc * 4;
        *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      }
    }
#endif
  };

#pragma unroll
  for (int s = 0; s < GEMM_STAGES - 1; ++s) {
    if (s < total) load_next(s, s);
    cp_async_commit();
  }

  int tile = 0, kt = 0;   // the compute side of the ring
  for (int step = 0; step < total; ++step) {
    cp_async_wait<GEMM_STAGES - 2>();
    __syncthreads();   // stage of this step visible to all; the previous step's stage no longer read
    {
      const int next = step + GEMM_STAGES - 1;
      if (next < total) load_next(next, next % GEMM_STAGES);
      cp_async_commit();
    }
    const int stage = step % GEMM_STAGES;
    const float* As = sm.A[stage];
    const float* Bs = sm.B[stage];
#if MW_GEMM_TF32X3
    // Each m16 x n8 tile's k-tile sum starts from zero and is added to acc with one FADD:
    // the tensor core's accumulation (not round-to-nearest) then only spans BK terms.
    constexpr int K8 = GEMM_BK / 8;
    unsigned a_big[K8][4], a_small[K8][4];
#pragma unroll
    for (int q = 0; q < K8; ++q) {
      const float* ap = As + (warp_row + g) * GEMM_AS_STRIDE + 8 * q + t4;
      split_tf32(ap[0], a_big[q][0], a_small[q][0]);
      split_tf32(ap[8 * GEMM_AS_STRIDE], a_big[q][1], a_small[q][1]);
      split_tf32(ap[4], a_big[q][2], a_small[q][2]);
      split_tf32(ap[8 * GEMM_AS_STRIDE + 4], a_big[q][3], a_small[q][3]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int q = 0; q < K8; ++q) {
        const float* bp = Bs + (8 * q + t4) * GEMM_BS_STRIDE + warp_col + 8 * j + g;
        unsigned b_big[2], b_small[2];
        split_tf32(bp[0], b_big[0], b_small[0]);
        split_tf32(bp[4 * GEMM_BS_STRIDE], b_big[1], b_small[1]);
        mma_tf32(part, a_small[q], b_big);
        mma_tf32(part, a_big[q], b_small);
        mma_tf32(part, a_big[q], b_big);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = __fadd_rn(acc[j][e], part[e]);
    }
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
    if constexpr (SHARED_RING) {
      if (++kt < k_tiles) continue;
      kt = 0;   // last k tile of this output tile: store it, start the next from zero
      store_tile(tile++);
#pragma unroll
      for (int i = 0; i < ACC_ROWS; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    }
  }
  if constexpr (!SHARED_RING) store_tile(0);
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task
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
  const int col_tiles = (k1 - k0 + GEMM_BN - 1) / GEMM_BN;
  const int wide_rows = tpg / 128 * 128;   // 128-row tiles, then one 64-row tile if tpg % 128
#if MW_GEMM_SHARED_RING
  if (wide_rows > 0)
    gemm_tiles<8, true>(sm.n, Vp, Up, Mp, t0, wide_rows / 128, k0, col_tiles, k1, c_stride, k_stride);
  if (wide_rows < tpg)
    gemm_tiles<4, true>(sm.n, Vp, Up, Mp, t0 + wide_rows, 1, k0, col_tiles, k1, c_stride, k_stride);
#else
  for (int ct = 0; ct < col_tiles; ++ct) {
    for (int r = 0; r < wide_rows; r += 128)
      gemm_tiles<8, false>(sm.n, Vp, Up, Mp, t0 + r, 1, k0 + ct * GEMM_BN, 1, k1, c_stride, k_stride);
    if (wide_rows < tpg)
      gemm_tiles<4, false>(sm.n, Vp, Up, Mp, t0 + wide_rows, 1, k0 + ct * GEMM_BN, 1, k1, c_stride, k_stride);
  }
#endif
}

}  // namespace mw
