// INPUT task (group g, channel chunk): V[:, tiles of g, chunk] = B^T d B for each
// (tile, channel) of the task, d the alpha x alpha input window at rows
// th*m - pad + [0, alpha), cols tw*m - pad + [0, alpha), zero outside the image.
// Padding tiles (t >= tiles) and padding channels (c >= C) get zeros.
// Mirrors megawino/stages/input_transform.py.
//
// Both layouts: input_transform_default (input_transform_task_v2, lane map below).
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

template <int M, bool NHWC>
__device__ __forceinline__ void input_transform_default(const Params& p, const float* x, int group, int index) {
  input_transform_task_v2<M, NHWC, MW_IN_CPT, MW_IN_CW>(p, x, group, index);
}

}  // namespace mw
