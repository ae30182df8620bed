// Probe (bench/experiments/fused_f2_probe.py): a fused Winograd F(2x2, 3x3) convolution whose V and
// M never leave the SM, for layers with C <= 64 (docs/experiments.md 77, 115).  3xTF32 on mma.sync
// (m16n8k8), products added straight into the fp32 accumulators.
//
// One persistent block of 512 threads an SM keeps the filter slice of 32 output channels (U, all
// 16 Winograd positions and all C channels, fp32) in shared memory and walks strips of 64
// consecutive 2x2 output tiles (tile id: image-major, then tile row, then tile column), whose
// window offsets and validity masks it computes once a strip.  Per chunk (FUSED_CHUNK channels)
// the block transforms the 64 tiles' windows into 16 V values each in shared memory; warp w then
// multiplies the 64 tiles by 16 output channels (w / 8) at positions 2 (w % 8), + 1 (both operands
// split into TF32 parts in registers).  After the strip's last chunk the accumulators go through
// shared memory (half the strip at a time) to the threads that transform each (tile, channel)
// back and store y.
// FUSED_CLUSTER = S = K / 32 (> 1, with FUSED_CHUNK 16): the S CTAs of a thread-block cluster (one
// per 32-channel slice) each transform 16 / S channels of a chunk and store that V into their own
// and, by st.async, every peer's shared memory, so each window is transformed once instead of S
// times; mbarriers order it: `full` (this CTA's V of the chunk complete: one local arrival plus the
// peers' bytes) and `free` (every peer has read its V of the previous chunk: one remote arrival a
// peer), so no cluster-wide barrier runs per chunk.
//
// x NCHW [N][C][H][W], y NCHW [N][K][H][W] (3x3, stride 1, padding 1), U [K / 32][16][32][C] fp32.

#ifndef FUSED_CLUSTER
#define FUSED_CLUSTER 1
#endif

namespace fused {
constexpr int K_SLICE = 32;       // output channels a block (each window is transformed K / 32 times)
constexpr int THREADS = 16 * K_SLICE;
constexpr int BLOCKS_PER_SM = 32 / K_SLICE;
static_assert(K_SLICE == 32 && THREADS == 512, "the input phase maps 512 threads on 64 tiles x 8 or 16 channels");
constexpr int TILES = 64;         // tiles a strip
// FUSED_CHUNK: channels a block transforms between two barriers (one or two k8 steps).
#ifndef FUSED_CHUNK
#define FUSED_CHUNK 8
#endif
constexpr int CHUNK = FUSED_CHUNK;
constexpr int POS = 16;
constexpr int V_ROW = TILES + 8;                       // a V row (64 tiles of one channel), padded
constexpr int V_FLOATS = POS * CHUNK * V_ROW;          // a chunk's V
constexpr int M_FLOATS = POS * K_SLICE * (TILES / 2);  // half a strip's M, over V
constexpr int VM_FLOATS = V_FLOATS > M_FLOATS ? V_FLOATS : M_FLOATS;

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

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

#if FUSED_CLUSTER > 1
static_assert(FUSED_CHUNK == 16 && 16 % FUSED_CLUSTER == 0, "the cluster build shares 16-channel chunks");
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
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// The one local arrival of a phase, with the bytes the peers will store.
__device__ __forceinline__ void mbar_arrive_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
// An arrival on a peer's barrier (cluster address), releasing this CTA's reads before it.
__device__ __forceinline__ void mbar_arrive_remote(unsigned cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" :: "r"(cluster_bar) : "memory");
}
// Bounded: a phase that has not completed after about two seconds traps, naming the block and
// the barrier, so a wrong protocol fails the launch instead of hanging it.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  const long long start = clock64();
  for (;;) {
    unsigned done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (done) return;
    if (clock64() - start > (1ll << 32)) {
      printf("fused_f2: block %d thread %d stuck on the mbarrier at %u, parity %u\n", blockIdx.x, threadIdx.x, bar, parity);
      __trap();
    }
  }
}
// Two floats into a peer's shared memory (cluster addresses), counted on its barrier in bytes.
__device__ __forceinline__ void st_async_f2(unsigned cluster_addr, float a, float b, unsigned cluster_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n"
               :: "r"(cluster_addr), "f"(a), "f"(b), "r"(cluster_bar) : "memory");
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
// A 4x4 window from its first element xc (valid elements: bits 0-15 of `bits`, bit 4 i + j).
__device__ __forceinline__ void load_window(const float* xc, unsigned bits, int W, float (&d)[4][4]) {
  if ((bits & 0xFFFFu) == 0xFFFFu) {   // an interior window: no bounds
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) d[i][j] = __ldg(xc + i * W + j);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) d[i][j] = (bits >> (4 * i + j)) & 1u ? __ldg(xc + i * W + j) : 0.0f;
  }
}

// V = B^T d B of F(2x2, 3x3); v[4 i + j].
__device__ __forceinline__ void input_transform(const float (&d)[4][4], float (&v)[POS]) {
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
    v[4 * i + 0] = t[i][0] - t[i][2];
    v[4 * i + 1] = t[i][1] + t[i][2];
    v[4 * i + 2] = t[i][2] - t[i][1];
    v[4 * i + 3] = t[i][1] - t[i][3];
  }
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
  // slices == FUSED_CLUSTER (the host builds one per K): the cluster walks the strips.
  const int slice = static_cast<int>(cluster_rank());
  const int blocks_per_slice = static_cast<int>(cluster_count());
  const int slot = static_cast<int>(cluster_id());
  __shared__ __align__(8) unsigned long long full_bar, free_bar;
  const unsigned full_at = smem_addr(&full_bar), free_at = smem_addr(&free_bar);
  if (threadIdx.x == 0) {
    mbar_init(full_at, 1);
    mbar_init(free_at, FUSED_CLUSTER - 1);
    mbar_fence_init();
  }
  cluster_sync_all();   // every CTA's barriers initialised before any peer uses them
  constexpr unsigned SHARE_BYTES = POS * (CHUNK / FUSED_CLUSTER) * TILES * 4;   // V a CTA stores a peer, a chunk
  unsigned chunk_count = 0;   // chunks so far (the barriers' phases)
  auto release_peers = [&] {  // this CTA has read its V of the chunk: peers may store the next
    if (threadIdx.x == 0)
      for (unsigned r = 0; r < FUSED_CLUSTER; ++r)
        if (r != static_cast<unsigned>(slice)) mbar_arrive_remote(map_rank(free_at, r));
  };
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
      // Bit 19 (even tiles): this window and the next tile's are interior, side by side in one
      // tile row, and rows start 8-byte aligned (W even).
      const bool next_ok = tile + 1 < total_tiles && (rem % tiles_w) + 1 < tiles_w;
      if (next_ok && (tid & 1) == 0 && (W & 1) == 0 && oy >= 1 && oy + 2 < H && ox >= 1 && ox + 4 < W) bits |= 1u << 19;
      tile_x[tid] = static_cast<long long>(img) * C * plane + (oy - 1) * W + (ox - 1);
      tile_y[tid] = static_cast<long long>(img) * K * plane + oy * W + ox;
      tile_bits[tid] = bits;
    }
    __syncthreads();
    for (int c0 = 0; c0 < C; c0 += CHUNK) {
#if FUSED_CHUNK == 16
      // Channel c0 + warp, tiles 2 lane and 2 lane + 1: where both windows are interior and side by
      // side (tile bit 19), each row's 6 columns by three 8-byte loads and one 4-byte load.  In
      // the cluster build this CTA's warps 0 .. 16 / S - 1 take channels 16 / S slice ...
#if FUSED_CLUSTER > 1
      // Peers store into this chunk's V only after they read the previous one.
      if (chunk_count > 0 && warp < CHUNK / FUSED_CLUSTER) mbar_wait(free_at, (chunk_count - 1) & 1);
      if (warp < CHUNK / FUSED_CLUSTER) {
        const int c_local = (CHUNK / FUSED_CLUSTER) * slice + warp, t0 = 2 * lane;
#else
      {
        const int c_local = warp, t0 = 2 * lane;
#endif
        const unsigned bits0 = tile_bits[t0];
        float va[POS], vb[POS];
        if (bits0 & (1u << 19)) {
          const float* xc = x + tile_x[t0] + (c0 + c_local) * plane;
          float da[4][4], db[4][4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float* r = xc + i * W;
            const float2 f0 = __ldg(reinterpret_cast<const float2*>(r - 1));
            const float2 f1 = __ldg(reinterpret_cast<const float2*>(r + 1));
            const float2 f2 = __ldg(reinterpret_cast<const float2*>(r + 3));
            const float f3 = __ldg(r + 5);
            da[i][0] = f0.y; da[i][1] = f1.x; da[i][2] = f1.y; da[i][3] = f2.x;
            db[i][0] = f1.y; db[i][1] = f2.x; db[i][2] = f2.y; db[i][3] = f3;
          }
          input_transform(da, va);
          input_transform(db, vb);
        } else {
          float d[4][4];
          load_window(x + tile_x[t0] + (c0 + c_local) * plane, bits0, W, d);
          input_transform(d, va);
          load_window(x + tile_x[t0 + 1] + (c0 + c_local) * plane, tile_bits[t0 + 1], W, d);
          input_transform(d, vb);
        }
#pragma unroll
        for (int p = 0; p < POS; ++p) {
          float* const at = Vs + v_index(p, c_local, t0);
          *reinterpret_cast<float2*>(at) = make_float2(va[p], vb[p]);
#if FUSED_CLUSTER > 1
#pragma unroll
          for (unsigned r = 1; r < FUSED_CLUSTER; ++r) {
            const unsigned peer = (static_cast<unsigned>(slice) + r) % FUSED_CLUSTER;
            st_async_f2(map_rank(smem_addr(at), peer), va[p], vb[p], map_rank(full_at, peer));
          }
#endif
        }
      }
#else
      // Channel c0 + warp % 8 of tile lane + 32 (warp / 8): its 4x4 window, V = B^T d B to shared memory.
      {
        const int c_local = warp % CHUNK, t_in = lane + 32 * (warp / CHUNK);
        float d[4][4], v[POS];
        load_window(x + tile_x[t_in] + (c0 + c_local) * plane, tile_bits[t_in], W, d);
        input_transform(d, v);
#pragma unroll
        for (int p = 0; p < POS; ++p) Vs[v_index(p, c_local, t_in)] = v[p];
      }
#endif
      __syncthreads();
#if FUSED_CLUSTER > 1
      if (threadIdx.x == 0) mbar_arrive_expect(full_at, (FUSED_CLUSTER - 1) * SHARE_BYTES);
      mbar_wait(full_at, chunk_count & 1);   // the peers' channels of the chunk are here too
#endif
#pragma unroll
      for (int kk = 0; kk < CHUNK / 8; ++kk)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int p = 2 * pair + q;
        unsigned b_big[2][2], b_small[2][2];
        {
          unsigned raw[4];
          ldmatrix_x4(raw, us_base + 4u * ((p * K_SLICE + b_row) * C + (((((c0 + 8 * kk) >> 2) + b_hi) ^ b_swizzle) << 2)));
#pragma unroll
          for (int i = 0; i < 4; ++i) split_tf32(__uint_as_float(raw[i]), b_big[i >> 1][i & 1], b_small[i >> 1][i & 1]);
        }
        const float* Vp = Vs + v_index(p, 8 * kk + t4, g);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          unsigned a_big[4], a_small[4];
          const float raw[4] = {Vp[16 * m], Vp[16 * m + 8], Vp[16 * m + 4 * V_ROW], Vp[16 * m + 4 * V_ROW + 8]};
#pragma unroll
          for (int i = 0; i < 4; ++i) split_tf32(raw[i], a_big[i], a_small[i]);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            mma_tf32(acc[q][m][n], a_small, b_big[n][0], b_big[n][1]);
            mma_tf32(acc[q][m][n], a_big, b_small[n][0], b_small[n][1]);
            mma_tf32(acc[q][m][n], a_big, b_big[n][0], b_big[n][1]);
          }
        }
      }
      __syncthreads();
#if FUSED_CLUSTER > 1
      if (c0 + CHUNK < C) release_peers();   // the last chunk's V is released after the output (M over it)
      ++chunk_count;
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
    release_peers();
#endif
  }
#if FUSED_CLUSTER > 1
  cluster_sync_all();   // no peer stores into this CTA or arrives on its barriers after it exits
#endif
}
