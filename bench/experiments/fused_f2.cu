// Probe (bench/experiments/fused_f2_probe.py): a fused Winograd F(2x2, 3x3) convolution whose V and
// M never leave the SM, for layers with C <= 64 (docs/experiments.md 77, 115).  3xTF32 on mma.sync
// (m16n8k8), products added straight into the fp32 accumulators.
//
// Persistent blocks (FUSED_K_SLICE 16: two of 256 threads an SM; 32: one of 512, the fastest
// measured): block b keeps the filter slice of output channels K_SLICE (b % slices) .. (U, all 16
// Winograd positions and all C channels, fp32) in shared memory and walks strips of 64
// consecutive 2x2 output tiles (tile id: image-major, then tile row, then tile column), whose
// window offsets and validity masks it computes once a strip.  Per 8-channel chunk the warps
// transform the 64 tiles' windows (lane: tile, so a load instruction reads neighbouring columns)
// into 16 V values each in shared memory; warp w then multiplies the 64 tiles by 16 output
// channels at positions 2 (w % 8) and 2 (w % 8) + 1 (both operands split into TF32 parts in
// registers; each V value serves 2 MMAs, each U value 4).  After the strip's last chunk the
// accumulators go through shared memory (half the strip at a time) to the threads that transform
// each (tile, output channel) back and store y.
//
// x NCHW [N][C][H][W], y NCHW [N][K][H][W] (3x3, stride 1, padding 1), U [K / K_SLICE][16][K_SLICE][C] fp32.

// FUSED_CLUSTER=S (> 1; v5, measured 2x slower than without): S CTAs a cluster, one per K slice
// (K = S K_SLICE); each window is transformed once, by one CTA of the cluster, and its V stored
// into every CTA's shared memory between two cluster barriers a chunk.
#ifndef FUSED_CLUSTER
#define FUSED_CLUSTER 1
#endif

// split_tf32 (3xTF32's split) and smem_addr are the package's (cuda/gemm.cuh, ptx.cuh: the probe
// compiles with -I at megawino's cuda folder).
#include "gemm.cuh"

namespace fused {
using mw::smem_addr;
using mw::split_tf32;
// FUSED_K_SLICE: output channels a block, 16 (two blocks of 256 threads an SM) or 32 (one block of
// 512: each window is transformed K / 32 times instead of K / 16).
#ifndef FUSED_K_SLICE
#define FUSED_K_SLICE 16
#endif
constexpr int K_SLICE = FUSED_K_SLICE;
constexpr int THREADS = 16 * K_SLICE;
constexpr int BLOCKS_PER_SM = 32 / K_SLICE;
constexpr int TILES = 64;         // tiles a strip
constexpr int CHUNK = 8;          // channels a k8 step
constexpr int POS = 16;
constexpr int V_ROW = TILES + 8;                       // a V row (64 tiles of one channel), padded
constexpr int V_FLOATS = POS * CHUNK * V_ROW;          // a chunk's V
constexpr int M_FLOATS = POS * K_SLICE * (TILES / 2);  // half a strip's M, over V
constexpr int VM_FLOATS = V_FLOATS > M_FLOATS ? V_FLOATS : M_FLOATS;

// mw::mma_tf32 as a volatile asm, the form every build of docs/experiments.md 115 was measured
// with (the cluster build schedules differently with the package's non-volatile one).
__device__ __forceinline__ void mma_tf32_in_order(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}


#if FUSED_CLUSTER > 1
// Thread-block cluster helpers (sm_90): this CTA's rank, a shared address in CTA `rank`, a store
// there, and the cluster-wide barrier (release / acquire: stores before it are seen after it).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_count() {
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned map_rank(unsigned addr, unsigned rank) {
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_cluster(unsigned addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" :: "r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
#endif

// V of a chunk: [position][channel][tile], rows padded to 72 floats so that an A fragment's four
// channel rows (8 tiles each) hit distinct banks.
__device__ __forceinline__ int v_index(int p, int c, int t) { return (p * CHUNK + c) * V_ROW + t; }
// U row n (output channel) of a position: C floats, 16-byte chunk j at j ^ (n % 8).
__device__ __forceinline__ int u_index(int p, int n, int c, int C) {
  return (p * K_SLICE + n) * C + (((c >> 2) ^ (n & 7)) << 2) + (c & 3);
}
// M of half a strip: [position][output channel][tile ^ 8 ((k >> 1) % 4)], so that the MMA
// fragments' stores and the output threads' loads (32 tiles of one channel) hit distinct banks.
__device__ __forceinline__ int m_index(int p, int k, int t) {
  return (p * K_SLICE + k) * (TILES / 2) + (t ^ (((k >> 1) & 3) << 3));
}
}  // namespace fused

extern "C" __global__ void __launch_bounds__(fused::THREADS, fused::BLOCKS_PER_SM)
#if FUSED_CLUSTER > 1
__cluster_dims__(FUSED_CLUSTER, 1, 1)
#endif
fused_f2(const float* __restrict__ x, const float* __restrict__ U, float* __restrict__ y,
         int N, int C, int K, int H, int W) {
  using namespace fused;
  extern __shared__ __align__(128) float smem[];
  float* const Us = smem;                                   // [16][32][C]
  float* const Vs = Us + POS * K_SLICE * C;                 // [16][8][72]; M of half a strip over it
  // The strip's tiles, computed once a strip: the window's first element (in x, channel 0), its
  // valid elements (bit 4 i + j) and, for the output, y's offset of the tile in channel 0 with
  // bits 16 / 17 / 18: second row / second column / tile inside the layer.
  long long* const tile_x = reinterpret_cast<long long*>(Vs + VM_FLOATS);
  long long* const tile_y = tile_x + TILES;
  unsigned* const tile_bits = reinterpret_cast<unsigned*>(tile_y + TILES);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int slices = K / K_SLICE;
#if FUSED_CLUSTER > 1
  // slices == FUSED_CLUSTER (checked by the host): the cluster walks the strips, CTA rank = slice.
  const int slice = static_cast<int>(cluster_rank());
  const int blocks_per_slice = static_cast<int>(cluster_count());
  const int slot = static_cast<int>(cluster_id());
#else
  const int slice = blockIdx.x % slices;
  const int blocks_per_slice = gridDim.x / slices;
  const int slot = blockIdx.x / slices;
  if (slot >= blocks_per_slice) return;
#endif

  // The block's filter slice, once.
  const float* Ug = U + static_cast<long long>(slice) * POS * K_SLICE * C;
  for (int i = tid; i < POS * K_SLICE * C; i += THREADS) {
    const int c = i % C, n = (i / C) % K_SLICE, p = i / (C * K_SLICE);
    Us[u_index(p, n, c, C)] = Ug[i];
  }

  const int tiles_w = (W + 1) / 2, tiles_h = (H + 1) / 2;
  const int tiles_image = tiles_w * tiles_h;
  const long long total_tiles = static_cast<long long>(N) * tiles_image;
  const long long strips = (total_tiles + TILES - 1) / TILES;
  const int plane = H * W;   // C * H * W < 2^31 (checked by the host)

  // Input role: channel warp of each chunk, tiles lane and lane + 32.  MMA role: positions
  // 2 warp, 2 warp + 1; all 64 tiles (four m16 tiles) and 16 channels (two n8 tiles).
  const int g = lane >> 2, t4 = lane & 3;
  const int pair = warp % 8, k_half = warp / 8;   // MMA role: positions 2 pair, + 1; channels 16 k_half ..
  // ldmatrix rows (B, U): n tile lane >> 4, row 8 (lane >> 4) + (lane & 7), chunk + ((lane >> 3) & 1).
  const int b_row = 16 * k_half + 8 * (lane >> 4) + (lane & 7);
  const int b_hi = (lane >> 3) & 1, b_swizzle = lane & 7;
  const unsigned us_base = smem_addr(Us);

  for (long long strip = slot; strip < strips; strip += blocks_per_slice) {
    float acc[2][4][2][4];   // [position of the pair][m16 tile][n8 tile][fragment]
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int m = 0; m < 4; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n) acc[q][m][n][0] = acc[q][m][n][1] = acc[q][m][n][2] = acc[q][m][n][3] = 0.0f;

    if (tid < TILES) {
      const long long tile = strip * TILES + tid;
      const bool ok = tile < total_tiles;
      const int img = ok ? static_cast<int>(tile / tiles_image) : 0;
      const int rem = ok ? static_cast<int>(tile % tiles_image) : 0;
      const int oy = 2 * (rem / tiles_w), ox = 2 * (rem % tiles_w);
      unsigned bits = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (ok && oy - 1 + i >= 0 && oy - 1 + i < H && ox - 1 + j >= 0 && ox - 1 + j < W) bits |= 1u << (4 * i + j);
      bits |= (oy + 1 < H ? 1u << 16 : 0u) | (ox + 1 < W ? 1u << 17 : 0u) | (ok ? 1u << 18 : 0u);
      tile_x[tid] = static_cast<long long>(img) * C * plane + (oy - 1) * W + (ox - 1);
      tile_y[tid] = static_cast<long long>(img) * K * plane + oy * W + ox;
      tile_bits[tid] = bits;
    }
    __syncthreads();
    for (int c0 = 0; c0 < C; c0 += CHUNK) {
#if FUSED_CLUSTER > 1
      // This CTA's share of the chunk: channels c0 + slice * CHANNELS_A_CTA ..., tile tid % 64;
      // V = B^T d B into the shared memory of every CTA of the cluster.
      constexpr int CHANNELS_A_CTA = CHUNK / FUSED_CLUSTER;
      static_assert(CHUNK % FUSED_CLUSTER == 0 && TILES * CHANNELS_A_CTA <= THREADS, "cluster share");
      if (tid < TILES * CHANNELS_A_CTA) {
        const int t_in = tid % TILES;
        const int c_local = slice * CHANNELS_A_CTA + tid / TILES;
#else
      // Channel c0 + warp of tiles lane and lane + 32: 4x4 input windows, V = B^T d B to shared memory.
      const int c_local = warp % CHUNK;
      constexpr int PASSES = TILES * CHUNK / THREADS;
#pragma unroll 1
      for (int pass = 0; pass < PASSES; ++pass) {
        const int t_in = lane + 32 * (warp / CHUNK + (THREADS / 256) * pass);
#endif
        const float* xc = x + tile_x[t_in] + (c0 + c_local) * plane;
        const unsigned valid = tile_bits[t_in] & 0xFFFFu;
        float d[4][4];
        if (valid == 0xFFFFu) {   // an interior window: no bounds
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) d[i][j] = __ldg(xc + i * W + j);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) d[i][j] = (valid >> (4 * i + j)) & 1u ? __ldg(xc + i * W + j) : 0.0f;
        }
        float t[4][4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          t[0][j] = d[0][j] - d[2][j];
          t[1][j] = d[1][j] + d[2][j];
          t[2][j] = d[2][j] - d[1][j];
          t[3][j] = d[1][j] - d[3][j];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float v[4] = {t[i][0] - t[i][2], t[i][1] + t[i][2], t[i][2] - t[i][1], t[i][1] - t[i][3]};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
#if FUSED_CLUSTER > 1
            const unsigned at = smem_addr(Vs + v_index(4 * i + j, c_local, t_in));
#pragma unroll
            for (int r = 0; r < FUSED_CLUSTER; ++r) st_cluster(map_rank(at, r), v[j]);
#else
            Vs[v_index(4 * i + j, c_local, t_in)] = v[j];
#endif
          }
        }
      }
#if FUSED_CLUSTER > 1
      cluster_sync();   // every CTA's V complete
#endif
#if FUSED_CLUSTER == 1
      __syncthreads();
#endif
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int p = 2 * pair + q;
        unsigned b_big[2][2], b_small[2][2];
        {
          unsigned raw[4];
          ldmatrix_x4(raw, us_base + 4u * ((p * K_SLICE + b_row) * C + ((((c0 >> 2) + b_hi) ^ b_swizzle) << 2)));
#pragma unroll
          for (int i = 0; i < 4; ++i) split_tf32(__uint_as_float(raw[i]), b_big[i >> 1][i & 1], b_small[i >> 1][i & 1]);
        }
        const float* Vp = Vs + v_index(p, t4, g);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          unsigned a_big[4], a_small[4];
          const float raw[4] = {Vp[16 * m], Vp[16 * m + 8], Vp[16 * m + 4 * V_ROW], Vp[16 * m + 4 * V_ROW + 8]};
#pragma unroll
          for (int i = 0; i < 4; ++i) split_tf32(raw[i], a_big[i], a_small[i]);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            mma_tf32_in_order(acc[q][m][n], a_small, b_big[n][0], b_big[n][1]);
            mma_tf32_in_order(acc[q][m][n], a_big, b_small[n][0], b_small[n][1]);
            mma_tf32_in_order(acc[q][m][n], a_big, b_big[n][0], b_big[n][1]);
          }
        }
      }
#if FUSED_CLUSTER > 1
      cluster_sync();   // no CTA reads this chunk's V any more: the next may be stored
#else
      __syncthreads();
#endif
    }

    // Output: half a strip at a time, every warp's accumulators of those tiles to M in shared
    // memory (over V), then thread (tile lane, channel warp + 8 j) transforms all 16 positions
    // back and stores y.
    float* const Ms = Vs;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r)
              Ms[m_index(2 * pair + q, 16 * k_half + 8 * n + 2 * t4 + (r & 1), 16 * m + g + 8 * (r >> 1))] = acc[q][2 * h + m][n][r];
      __syncthreads();
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int k = warp + (THREADS / 32) * j, t = lane;
        float mv[POS];
#pragma unroll
        for (int p = 0; p < POS; ++p) mv[p] = Ms[m_index(p, k, t)];
        const unsigned bits = tile_bits[32 * h + t];
        if (bits & (1u << 18)) {
          float s[2][4];
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            s[0][jj] = mv[jj] + mv[4 + jj] + mv[8 + jj];
            s[1][jj] = mv[4 + jj] - mv[8 + jj] - mv[12 + jj];
          }
          float* yk = y + tile_y[32 * h + t] + (K_SLICE * slice + k) * plane;
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if (i == 1 && !(bits & (1u << 16))) continue;
            yk[i * W] = s[i][0] + s[i][1] + s[i][2];
            if (bits & (1u << 17)) yk[i * W + 1] = s[i][1] - s[i][2] - s[i][3];
          }
        }
      }
      __syncthreads();
    }
#if FUSED_CLUSTER > 1
    cluster_sync();   // M (over V) read: the cluster may store the next strip's V here
#endif
  }
}
