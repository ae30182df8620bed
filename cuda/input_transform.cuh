// INPUT task (group g, channel chunk): V[:, tiles of g, chunk] = B^T d B for each
// (tile, channel) of the task, d the alpha x alpha input window at rows
// th*m - pad + [0, alpha), cols tw*m - pad + [0, alpha), zero outside the image.
// Padding tiles (t >= tiles) and padding channels (c >= C) get zeros.
// Mirrors megawino/stages/input_transform.py.
//
// Default, both layouts (input_transform_task): threads take (tile, channel) items with 8 channels
// fastest, then tiles: one warp covers 4 tiles x 8 channels, so every V store of
// a warp fills four whole 32-byte sectors and the loads read whole sectors too.
// NCHW, with -DMW_STAGED_NCHW only (input_transform_task_staged; measured slower in
// the megakernel, bench/NOTES.md experiment 2): a warp takes 32 consecutive tiles of one
// channel (loads run along image rows), the block stages 32 tiles x 8 channels x
// alpha^2 values in shared memory, then writes V as 16-byte vectors (8 channels
// of a tile = one 32-byte sector).
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"

namespace mw {

struct TileCoord {
  int n, th, tw;
};

__device__ __forceinline__ TileCoord tile_coord(const Params& p, long long t) {
  const int per_image = static_cast<int>(p.tiles_h * p.tiles_w);
  const int tt = static_cast<int>(t);
  TileCoord tc;
  tc.n = tt / per_image;
  const int rest = tt - tc.n * per_image;
  tc.th = rest / static_cast<int>(p.tiles_w);
  tc.tw = rest - tc.th * static_cast<int>(p.tiles_w);
  return tc;
}

template <int M, bool NHWC>
__device__ __forceinline__ void input_transform_task(const Params& p, const float* x, int group,
                                                     int index) {
  constexpr int A = M + 2;
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = index * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + 7) >> 3;
  const int items = tpg * ncg * 8;
  const long long t_base = static_cast<long long>(group) * tpg;
  const long long plane = p.tiles_padded * p.c_stride;   // V stride between positions
  const int C = static_cast<int>(p.C), H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  float* V = reinterpret_cast<float*>(p.V);

  for (int w = threadIdx.x; w < items; w += blockDim.x) {
    const int cl = w & 7;
    const int rest = w >> 3;
    const int cg = rest / tpg;
    const int tl = rest - cg * tpg;
    const int c = c0 + cg * 8 + cl;
    if (c >= c1) continue;
    const long long t = t_base + tl;
    float d[A * A];
    if (c < C && t < p.tiles) {
      const TileCoord tc = tile_coord(p, t);
      const int r0 = tc.th * M - static_cast<int>(p.pad);
      const int q0 = tc.tw * M - static_cast<int>(p.pad);
#pragma unroll
      for (int i = 0; i < A; ++i) {
        const int r = r0 + i;
        const bool row_in = r >= 0 && r < H;
#pragma unroll
        for (int j = 0; j < A; ++j) {
          const int q = q0 + j;
          float v = 0.0f;
          if (row_in && q >= 0 && q < W) {
            const long long off = NHWC
                ? ((static_cast<long long>(tc.n) * H + r) * W + q) * C + c
                : ((static_cast<long long>(tc.n) * C + c) * H + r) * W + q;
            v = x[off];
          }
          d[i * A + j] = v;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < A * A; ++i) d[i] = 0.0f;
    }
    float tmp[A * A];
#pragma unroll
    for (int j = 0; j < A; ++j) Wino<M>::template bt<A, A>(d + j, tmp + j);       // columns
    float v[A * A];
#pragma unroll
    for (int i = 0; i < A; ++i) Wino<M>::template bt<1, 1>(tmp + i * A, v + i * A);  // rows
    float* dst = V + t * p.c_stride + c;
#pragma unroll
    for (int q = 0; q < A * A; ++q) dst[q * plane] = v[q];
  }
}

// Version 2 (default; bench/NOTES.md experiment 4): a thread takes one tile and CPT consecutive
// channels, and the lanes of a warp cover CW channels (CW / CPT lanes) of 32 * CPT / CW tiles, so
// with CW = 32 each V store instruction of a warp writes whole 128-byte lines (one line per tile
// and position) instead of 32-byte quarters spread over 4 lines.  The window loads use per-tile
// row / column masks (no per-element 64-bit index arithmetic).  Same arithmetic, same bits.
#ifndef MW_IN_CPT
#define MW_IN_CPT 2
#endif
#ifndef MW_IN_CW
#define MW_IN_CW 32
#endif

// d = alpha x alpha window of channel c at (r0, q0); zeros outside the image or where !valid.
template <int A, bool NHWC>
__device__ __forceinline__ void load_window(const float* x, const TileCoord& tc, int c, int r0, int q0,
                                            int C, int H, int W, bool valid, float* d) {
  unsigned cm = 0;
#pragma unroll
  for (int j = 0; j < A; ++j) cm |= (static_cast<unsigned>(q0 + j) < static_cast<unsigned>(W) ? 1u : 0u) << j;
  if (!valid) cm = 0;
  const long long row_stride = NHWC ? static_cast<long long>(W) * C : W;
  const long long col_stride = NHWC ? C : 1;
  const float* base = NHWC
      ? x + ((static_cast<long long>(tc.n) * H + r0) * W + q0) * C + c
      : x + ((static_cast<long long>(tc.n) * C + c) * H + r0) * W + q0;
#pragma unroll
  for (int i = 0; i < A; ++i) {
    const unsigned m = static_cast<unsigned>(r0 + i) < static_cast<unsigned>(H) ? cm : 0u;
    const float* row = base + i * row_stride;
#pragma unroll
    for (int j = 0; j < A; ++j) d[i * A + j] = (m >> j) & 1u ? __ldg(row + j * col_stride) : 0.0f;
  }
}

template <int M, bool NHWC, int CPT, int CW>
__device__ __forceinline__ void input_transform_task_v2(const Params& p, const float* x, int group,
                                                        int index) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int LPT = CW / CPT;            // lanes per tile
  static_assert(CW % CPT == 0 && (LPT & (LPT - 1)) == 0 && LPT <= 32, "lane map");
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = index * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + CW - 1) / CW;
  const int items = tpg * ncg * LPT;
  const long long t_base = static_cast<long long>(group) * tpg;
  const long long plane = p.tiles_padded * p.c_stride;   // V stride between positions
  const int C = static_cast<int>(p.C), H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  const int pad = static_cast<int>(p.pad);
  const int cs = static_cast<int>(p.c_stride);
  const bool vec = CPT > 1 && (c0 % CPT) == 0 && ((c1 - c0) % CPT) == 0;   // whole aligned groups
  float* V = reinterpret_cast<float*>(p.V);

  for (int w = threadIdx.x; w < items; w += blockDim.x) {
    const int li = w & (LPT - 1);
    const int rest = w / LPT;
    const int cg = rest / tpg;
    const int tl = rest - cg * tpg;
    const int cb = c0 + cg * CW + li * CPT;
    if (cb >= c1) continue;
    const long long t = t_base + tl;
    const bool t_ok = t < p.tiles;
    const TileCoord tc = tile_coord(p, t_ok ? t : 0);
    const int r0 = tc.th * M - pad;
    const int q0 = tc.tw * M - pad;
    float v[CPT][AA];
#pragma unroll
    for (int ci = 0; ci < CPT; ++ci) {
      const int c = cb + ci;
      float d[AA];
      load_window<A, NHWC>(x, tc, c < C ? c : 0, r0, q0, C, H, W, t_ok && c < C && c < c1, d);
      float tmp[AA];
#pragma unroll
      for (int j = 0; j < A; ++j) Wino<M>::template bt<A, A>(d + j, tmp + j);       // columns
#pragma unroll
      for (int i = 0; i < A; ++i) Wino<M>::template bt<1, 1>(tmp + i * A, v[ci] + i * A);  // rows
    }
    float* dst = V + t * cs + cb;
    if (vec) {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        if constexpr (CPT == 4) {
          *reinterpret_cast<float4*>(dst + q * plane) = make_float4(v[0][q], v[1][q], v[2][q], v[3][q]);
        } else if constexpr (CPT == 2) {
          *reinterpret_cast<float2*>(dst + q * plane) = make_float2(v[0][q], v[1][q]);
        } else {
          dst[q * plane] = v[0][q];
        }
      }
    } else {
#pragma unroll
      for (int ci = 0; ci < CPT; ++ci) {
        if (cb + ci < c1) {
#pragma unroll
          for (int q = 0; q < AA; ++q) dst[q * plane + ci] = v[ci][q];
        }
      }
    }
  }
}

// Per-thread private slots in shared memory (bench/NOTES.md experiment 8): slot q of a thread
// at byte address base + q * NT * 4, base = its 4-byte column: conflict-free, no barrier needed
// (a thread reads back only what it wrote).  Explicit st/ld.shared so that the compiler can
// neither forward the value in a register nor drop the store.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void sts_f32(unsigned a, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(a), "f"(v));
}
__device__ __forceinline__ float lds_f32(unsigned a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(a));
  return v;
}

// Megakernel input transform under the 128-register cap (bench/NOTES.md experiment 9): the CPT 1,
// CW 32 lane map (a warp = one tile x 32 consecutive channels, one window per thread, same loads
// and arithmetic as input_transform_task_v2<.., 1, 32>), but the 36 results of the warp go through
// a warp-private shared-memory buffer buf[q][32] and V is written with 16-byte stores: lane l
// stores channels 4 (l & 7) .. +3 of position 4 i + (l >> 3), i = 0..8, so each store instruction
// of a warp writes 4 whole 128-byte lines (9 store instructions per warp-item instead of 36), and
// the stored registers come from LDS.128, aligned by construction.  sbuf: 8 warps x alpha^2 x 32
// floats.  The loop is warp-uniform (items is a multiple of 32), so lanes past c1 take part in the
// __syncwarp()s and compute zeros that are never stored.
template <int M, bool NHWC, int NT>
__device__ __forceinline__ void input_transform_task_xpose(const Params& p, const float* x, int group,
                                                           int index, float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  static_assert(AA % 4 == 0, "positions in groups of 4");
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = index * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + 31) >> 5;
  const int items = tpg * ncg * 32;
  const long long t_base = static_cast<long long>(group) * tpg;
  const long long plane = p.tiles_padded * p.c_stride;   // V stride between positions
  const int C = static_cast<int>(p.C), H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  const int pad = static_cast<int>(p.pad);
  const int cs = static_cast<int>(p.c_stride);
  const bool vec = (c0 & 3) == 0;                         // 16-byte aligned channel quads
  float* V = reinterpret_cast<float*>(p.V);
  const int lane = threadIdx.x & 31;
  const int quad = lane & 7, qsub = lane >> 3;
  float* buf = sbuf + (threadIdx.x >> 5) * (AA * 32);
  float* swr = buf + lane;                                 // buf[q][lane]
  const float4* srd = reinterpret_cast<const float4*>(buf + qsub * 32 + quad * 4);   // buf[4 i + qsub][4 quad]

  for (int w = threadIdx.x; w < items; w += NT) {
    const int rest = w >> 5;
    const int cg = rest / tpg;
    const int tl = rest - cg * tpg;
    const int cw = c0 + cg * 32;                          // first channel of the warp
    const int c = cw + lane;
    const long long t = t_base + tl;
    const bool t_ok = t < p.tiles;
    const TileCoord tc = tile_coord(p, t_ok ? t : 0);
    const int r0 = tc.th * M - pad;
    const int q0 = tc.tw * M - pad;
    {
      float d[AA];
      load_window<A, NHWC>(x, tc, c < C ? c : 0, r0, q0, C, H, W, t_ok && c < C && c < c1, d);
      float tmp[AA];
#pragma unroll
      for (int j = 0; j < A; ++j) Wino<M>::template bt<A, A>(d + j, tmp + j);       // columns
      float v[AA];
#pragma unroll
      for (int i = 0; i < A; ++i) Wino<M>::template bt<1, 1>(tmp + i * A, v + i * A);  // rows
#pragma unroll
      for (int q = 0; q < AA; ++q) swr[q * 32] = v[q];
    }
    __syncwarp();
    const int cq = cw + quad * 4;                         // this lane's channel quad
    float* dst = V + t * cs + cq + qsub * plane;
    if (vec && cq + 4 <= c1) {
      // All LDS first: V is a generic pointer, so ptxas may not hoist a shared load above an
      // earlier store through it (it could alias shared memory).
      float4 f[AA / 4];
#pragma unroll
      for (int i = 0; i < AA / 4; ++i) f[i] = srd[i * 32];
#pragma unroll
      for (int i = 0; i < AA / 4; ++i) *reinterpret_cast<float4*>(dst + 4 * i * plane) = f[i];
    } else if (cq < c1) {
#pragma unroll
      for (int i = 0; i < AA / 4; ++i) {
        const float4 f = srd[i * 32];
        float* o = dst + 4 * i * plane;
        o[0] = f.x;
        if (cq + 1 < c1) o[1] = f.y;
        if (cq + 2 < c1) o[2] = f.z;
        if (cq + 3 < c1) o[3] = f.w;
      }
    }
    __syncwarp();
  }
}

template <int M, bool NHWC>
__device__ __forceinline__ void input_transform_default(const Params& p, const float* x, int group, int index) {
#ifdef MW_XFORM_V1
  input_transform_task<M, NHWC>(p, x, group, index);
#else
  input_transform_task_v2<M, NHWC, MW_IN_CPT, MW_IN_CW>(p, x, group, index);
#endif
}

// Shared floats the staged transforms need: alpha^2 x 8 channels x 32 tiles.
template <int M>
struct StageSize {
  static constexpr int value = (M + 2) * (M + 2) * 8 * 32;
};

// Tile-major window load + transform of one (tile, channel): v = B^T d B.
template <int M>
__device__ __forceinline__ void input_window_transform_nchw(const Params& p, const float* x, long long t,
                                                            int c, float* v) {
  constexpr int A = M + 2;
  const int H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  float d[A * A];
  if (c < p.C && t < p.tiles) {
    const TileCoord tc = tile_coord(p, t);
    const int r0 = tc.th * M - static_cast<int>(p.pad);
    const int q0 = tc.tw * M - static_cast<int>(p.pad);
    const float* plane = x + (static_cast<long long>(tc.n) * p.C + c) * H * W;
#pragma unroll
    for (int i = 0; i < A; ++i) {
      const int r = r0 + i;
      const bool row_in = r >= 0 && r < H;
      const float* row = plane + static_cast<long long>(r) * W;
#pragma unroll
      for (int j = 0; j < A; ++j) {
        const int q = q0 + j;
        d[i * A + j] = (row_in && q >= 0 && q < W) ? row[q] : 0.0f;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < A * A; ++i) d[i] = 0.0f;
  }
  float tmp[A * A];
#pragma unroll
  for (int j = 0; j < A; ++j) Wino<M>::template bt<A, A>(d + j, tmp + j);
#pragma unroll
  for (int i = 0; i < A; ++i) Wino<M>::template bt<1, 1>(tmp + i * A, v + i * A);
}

// NCHW input task through shared memory (sbuf: StageSize<M>::value floats).
// Block-uniform loop over sub-chunks of 32 tiles x 8 channels.
template <int M>
__device__ __forceinline__ void input_transform_task_staged(const Params& p, const float* x, int group,
                                                            int index, float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = index * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int n_oct = (c1 - c0 + 7) >> 3;
  const int n_ts = tpg >> 5;                  // tpg is a multiple of 64
  const long long t_base = static_cast<long long>(group) * tpg;
  const long long plane = p.tiles_padded * p.c_stride;
  float* V = reinterpret_cast<float*>(p.V);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;   // warp = channel of the octet

  for (int sub = 0; sub < n_ts * n_oct; ++sub) {
    const int oct = sub / n_ts;
    const long long t_sub = t_base + static_cast<long long>(sub - oct * n_ts) * 32;
    const int cc0 = c0 + oct * 8;             // first channel of the octet
    {
      const int c = cc0 + warp;
      if (c < c1) {
        float v[AA];
        input_window_transform_nchw<M>(p, x, t_sub + lane, c, v);
#pragma unroll
        for (int q = 0; q < AA; ++q) sbuf[(q * 8 + warp) * 32 + lane] = v[q];
      }
    }
    __syncthreads();
    // Write out: element e -> (position q, tile, half of the octet); 4 channels each.
    for (int e = threadIdx.x; e < AA * 64; e += blockDim.x) {
      const int q = e >> 6;
      const int tile = (e >> 1) & 31;
      const int half = e & 1;
      const int cc = cc0 + half * 4;
      if (cc >= c1) continue;
      const float* s = sbuf + (q * 8 + half * 4) * 32 + tile;
      float* dst = V + q * plane + (t_sub + tile) * p.c_stride + cc;
      if (cc + 4 <= c1 && (cc & 3) == 0) {
        *reinterpret_cast<float4*>(dst) = make_float4(s[0], s[32], s[64], s[96]);
      } else {
        for (int i = 0; i < 4 && cc + i < c1; ++i) dst[i] = s[i * 32];
      }
    }
    __syncthreads();
  }
}

}  // namespace mw
