// Probe (bench/experiments/fused_f2_probe.py): a fused Winograd F(2x2, 3x3) convolution whose V and
// M never leave the SM, for layers with C <= 64 (docs/experiments.md 77, 115).  3xTF32 on mma.sync
// (m16n8k8), products added straight into the fp32 accumulators.
//
// One persistent block of 512 threads an SM (192 KB of shared memory): block b keeps the filter
// slice of output channels 32 (b % slices) .. + 31 (U, all 16 Winograd positions and all C
// channels, fp32) in shared memory and walks strips of 64 consecutive 2x2 output tiles (tile id:
// image-major, then tile row, then tile column).  Per strip and 8-channel chunk, thread (tile t,
// channel c) transforms its 4x4 input window into 16 V values, split into TF32 big and small parts
// in shared memory; warp w then multiplies tiles 16 (w / 4) .. + 15 by output channels
// 8 (w % 4) .. + 7 at every position into 16 x 4 accumulators, which hold all 16 positions of the
// same (tile, channel) pairs, so the output transform runs in registers.
//
// x NCHW [N][C][H][W], y NCHW [N][K][H][W] (3x3, stride 1, padding 1), U [K / 32][16][32][C] fp32.

#ifndef FUSED_PREFETCH
#define FUSED_PREFETCH 0
#endif
// FUSED_STAGE=1: each thread's 16 input values of the next chunk come by 4-byte cp.async into a
// slot of its own in shared memory while the block multiplies the current chunk.
#ifndef FUSED_STAGE
#define FUSED_STAGE 1
#endif

namespace fused {
constexpr int THREADS = 512;
constexpr int TILES = 64;         // tiles a strip
constexpr int K_SLICE = 32;       // output channels a block
constexpr int CHUNK = 8;          // channels a k8 step
constexpr int POS = 16;
constexpr int V_PART = POS * TILES * CHUNK;   // floats of one part (big or small) of a chunk's V

__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
  const unsigned bits = __float_as_uint(x);
  big = (bits + 0x1000u) & 0xFFFFE000u;   // round to nearest (ties away), 10 mantissa bits
  const float rest = x - __uint_as_float(big);
  small = __float_as_uint(rest) & 0xFFFFE000u;
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x2(unsigned& r0, unsigned& r1, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async4(unsigned dst, const float* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(dst), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// V row t of a position: 8 floats as two 16-byte chunks, chunk j at j ^ ((t >> 2) & 1), so that
// the eight rows one ldmatrix phase reads hit distinct banks.
__device__ __forceinline__ int v_index(int p, int t, int c) {
  return (p * TILES + t) * CHUNK + (((c >> 2) ^ ((t >> 2) & 1)) << 2) + (c & 3);
}
// U row n (output channel) of a position: C floats, 16-byte chunk j at j ^ (n % 8).
__device__ __forceinline__ int u_index(int p, int n, int c, int C) {
  return (p * K_SLICE + n) * C + (((c >> 2) ^ (n & 7)) << 2) + (c & 3);
}
}  // namespace fused

extern "C" __global__ void __launch_bounds__(fused::THREADS, 1)
fused_f2(const float* __restrict__ x, const float* __restrict__ U, float* __restrict__ y,
         int N, int C, int K, int H, int W) {
  using namespace fused;
  extern __shared__ __align__(128) float smem[];
  float* const Us = smem;                                   // [16][32][C]
  float* const Vbig = Us + POS * K_SLICE * C;               // [16][64][8]
  float* const Vsmall = Vbig + V_PART;
  float* const stage = Vsmall + V_PART;                     // [16][THREADS]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int slices = K / K_SLICE;
  const int slice = blockIdx.x % slices;
  const int blocks_per_slice = gridDim.x / slices;
  const int slot = blockIdx.x / slices;
  if (slot >= blocks_per_slice) return;

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
  const long long plane = static_cast<long long>(H) * W;

  // Input role: tile t_in, channel c_in of each chunk.
  const int c_in = tid & 7, t_in = tid >> 3;
  // MMA role.
  const int m_tile = warp >> 2, n_tile = warp & 3;
  const int g = lane >> 2, t4 = lane & 3;
  // ldmatrix row addresses: A matrices (tiles 16 m_tile + (lane & 7) + 8 ((lane >> 3) & 1),
  // chunk lane >> 4); B matrices (rows n = 8 n_tile + (lane & 7), chunk (lane >> 3) & 1).
  const int a_row = 16 * m_tile + (lane & 7) + 8 * ((lane >> 3) & 1);
  const int a_chunk = lane >> 4;
  const unsigned a_off = 4u * ((a_row * CHUNK) + ((a_chunk ^ ((a_row >> 2) & 1)) << 2));
  const unsigned vbig_base = smem_addr(Vbig) + a_off, vsmall_base = smem_addr(Vsmall) + a_off;
  const int b_row = 8 * n_tile + (lane & 7);
  const int b_half = (lane >> 3) & 1;
  const unsigned us_base = smem_addr(Us);

  for (long long strip = slot; strip < strips; strip += blocks_per_slice) {
    // This thread's input tile (recomputed where used, so that no register holds it through
    // the MMAs).
    const long long tile_in = strip * TILES + t_in;
#define FUSED_TILE_ORIGIN                                                                  \
    const bool tile_ok = tile_in < total_tiles;                                            \
    const int img = tile_ok ? static_cast<int>(tile_in / tiles_image) : 0;                 \
    const int rem = tile_ok ? static_cast<int>(tile_in % tiles_image) : 0;                 \
    const int oy = 2 * (rem / tiles_w), ox = 2 * (rem % tiles_w);                          \
    const float* xt = x + static_cast<long long>(img) * C * plane;
#if !FUSED_STAGE
    FUSED_TILE_ORIGIN
#endif

    float acc[POS][4];
#pragma unroll
    for (int p = 0; p < POS; ++p) acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.0f;

    float d[4][4];
#if FUSED_STAGE
    const unsigned stage_at = smem_addr(stage + tid);
    // Offsets within the image fit an int (C * H * W < 2^31, checked by the host).
    auto issue = [&](int c0) {
      FUSED_TILE_ORIGIN
      const int base = (c0 + c_in) * static_cast<int>(plane) + (oy - 1) * W + ox - 1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool row_ok = tile_ok && oy - 1 + i >= 0 && oy - 1 + i < H;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const bool ok = row_ok && ox - 1 + j >= 0 && ox - 1 + j < W;
          cp_async4(stage_at + 4u * (4 * i + j) * THREADS, ok ? xt + (base + i * W + j) : x, ok);
        }
      }
      cp_async_commit();
    };
    auto load = [&](int) {
      cp_async_commit_wait_all();
#pragma unroll
      for (int q = 0; q < 16; ++q) d[q / 4][q % 4] = stage[q * THREADS + tid];
    };
    issue(0);
#else
    auto load = [&](int c0) {
      const float* xc = xt + static_cast<long long>(c0 + c_in) * plane;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int iy = oy - 1 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int ix = ox - 1 + j;
          const bool ok = tile_ok && iy >= 0 && iy < H && ix >= 0 && ix < W;
          d[i][j] = ok ? __ldg(xc + static_cast<long long>(iy) * W + ix) : 0.0f;
        }
      }
    };
#endif
#if FUSED_PREFETCH
    load(0);
#endif
    for (int c0 = 0; c0 < C; c0 += CHUNK) {
#if !FUSED_PREFETCH || FUSED_STAGE
      load(c0);
#endif
      // V = B^T d B, split, to shared memory.
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
          unsigned big, small;
          split_tf32(v[j], big, small);
          const int at = v_index(4 * i + j, t_in, c_in);
          Vbig[at] = __uint_as_float(big);
          Vsmall[at] = __uint_as_float(small);
        }
      }
#if FUSED_STAGE
      // d is consumed (the V stores above used it): the slots may take the next chunk.
      if (c0 + CHUNK < C) issue(c0 + CHUNK);
#endif
      __syncthreads();
#if FUSED_PREFETCH && !FUSED_STAGE
      if (c0 + CHUNK < C) load(c0 + CHUNK);   // in flight during the MMAs
#endif
      const int b_chunk = (c0 >> 2) + b_half;
      const unsigned b_addr0 = us_base + 4u * (b_row * C + ((b_chunk ^ (b_row & 7)) << 2));
#pragma unroll
      for (int p = 0; p < POS; ++p) {
        unsigned a_big[4], a_small[4], b0, b1, b0_big, b0_small, b1_big, b1_small;
        ldmatrix_x4(a_big, vbig_base + 4u * p * TILES * CHUNK);
        ldmatrix_x4(a_small, vsmall_base + 4u * p * TILES * CHUNK);
        ldmatrix_x2(b0, b1, b_addr0 + 4u * p * K_SLICE * C);
        split_tf32(__uint_as_float(b0), b0_big, b0_small);
        split_tf32(__uint_as_float(b1), b1_big, b1_small);
        mma_tf32(acc[p], a_small, b0_big, b1_big);
        mma_tf32(acc[p], a_big, b0_small, b1_small);
        mma_tf32(acc[p], a_big, b0_big, b1_big);
      }
      __syncthreads();
    }

    // Output transform: acc[p][r] is position p of (tile 16 m_tile + g + 8 (r >> 1), channel
    // 32 slice + 8 n_tile + 2 t4 + (r & 1)).
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const long long tile = strip * TILES + 16 * m_tile + g + 8 * (r >> 1);
      if (tile >= total_tiles) continue;
      const int k = K_SLICE * slice + 8 * n_tile + 2 * t4 + (r & 1);
      const int im = static_cast<int>(tile / tiles_image), rm = static_cast<int>(tile % tiles_image);
      const int y0 = 2 * (rm / tiles_w), x0 = 2 * (rm % tiles_w);
      float s[2][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[0][j] = acc[j][r] + acc[4 + j][r] + acc[8 + j][r];
        s[1][j] = acc[4 + j][r] - acc[8 + j][r] - acc[12 + j][r];
      }
      float* yk = y + (static_cast<long long>(im) * K + k) * plane;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int yy = y0 + i;
        if (yy >= H) continue;
        const float o0 = s[i][0] + s[i][1] + s[i][2];
        const float o1 = s[i][1] - s[i][2] - s[i][3];
        yk[static_cast<long long>(yy) * W + x0] = o0;
        if (x0 + 1 < W) yk[static_cast<long long>(yy) * W + x0 + 1] = o1;
      }
    }
  }
}
