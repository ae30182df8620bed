// INPUT task (group g, index -> tile slice and channel chunk, transform_slice below):
// V[:, tiles of the slice, chunk] = B^T d B for each
// (tile, channel) of the task, d the alpha x alpha input window at rows
// th*m - pad + [0, alpha), cols tw*m - pad + [0, alpha), zero outside the image.
// Padding tiles (t >= tiles) and padding channels (c >= C) get zeros.
// Mirrors megawino/stages/input_transform.py.
//
// Both layouts: input_transform_default (input_transform_task_v2, lane map below).
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

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

// The tiles and the chunk of a transform task: index = chunk * parts + part, parts =
// tiles_per_group / tiles_per_task (megawino.tasks.Layout.input_slices / output_slices).
struct TransformSlice {
  long long t_base;   // first tile
  int tiles;          // tiles covered (a multiple of megawino.tasks.TRANSFORM_MIN_TILES)
  int chunk;          // channel chunk
};
__device__ __forceinline__ TransformSlice transform_slice(const Params& p, int group, int index,
                                                          long long tiles_per_task) {
  const int tiles = static_cast<int>(tiles_per_task);
  const int parts = static_cast<int>(p.tiles_per_group) / tiles;
  TransformSlice s;
  s.chunk = index / parts;
  s.tiles = tiles;
  s.t_base = static_cast<long long>(group) * p.tiles_per_group + static_cast<long long>(index - s.chunk * parts) * tiles;
  return s;
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

// MW_IN_VEC4 (bench/NOTES.md 29): an NCHW F(4x4) window whose columns q0 + 1 .. q0 + 4 start a
// 16-byte-aligned run inside the image (padding 1, W % 4 == 0: every tile of the suite's large
// layers) reads each row as one float4 and two scalars instead of six scalars.  The same floats
// land in d, so the bits do not change.
#ifndef MW_IN_VEC4
#define MW_IN_VEC4 1
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
  if constexpr (!NHWC && A == 6 && MW_IN_VEC4) {
    const bool vec = (W & 3) == 0 && (reinterpret_cast<unsigned long long>(base + 1) & 15ull) == 0 &&
                     (cm & 0x1Eu) == 0x1Eu;
    if (vec) {
#pragma unroll
      for (int i = 0; i < A; ++i) {
        const float* row = base + i * row_stride;
        if (static_cast<unsigned>(r0 + i) < static_cast<unsigned>(H)) {
          const float4 mid = __ldg(reinterpret_cast<const float4*>(row + 1));
          d[i * A + 0] = cm & 1u ? __ldg(row) : 0.0f;
          d[i * A + 1] = mid.x;
          d[i * A + 2] = mid.y;
          d[i * A + 3] = mid.z;
          d[i * A + 4] = mid.w;
          d[i * A + 5] = (cm >> 5) & 1u ? __ldg(row + 5) : 0.0f;
        } else {
#pragma unroll
          for (int j = 0; j < A; ++j) d[i * A + j] = 0.0f;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < A; ++i) {
    const unsigned m = static_cast<unsigned>(r0 + i) < static_cast<unsigned>(H) ? cm : 0u;
    const float* row = base + i * row_stride;
#pragma unroll
    for (int j = 0; j < A; ++j) d[i * A + j] = (m >> j) & 1u ? __ldg(row + j * col_stride) : 0.0f;
  }
}

// v = B^T d B of channel c's window at (r0, q0) (zeros where !valid): the one input transform
// of every lane map.
template <int M, bool NHWC>
__device__ __forceinline__ void transform_window(const float* x, const TileCoord& tc, int c, int r0, int q0,
                                                 int C, int H, int W, bool valid, float* v) {
  constexpr int A = M + 2;
  float d[A * A];
  load_window<A, NHWC>(x, tc, c, r0, q0, C, H, W, valid, d);
  float tmp[A * A];
#pragma unroll
  for (int j = 0; j < A; ++j) Wino<M>::template bt<A, A>(d + j, tmp + j);       // columns
#pragma unroll
  for (int i = 0; i < A; ++i) Wino<M>::template bt<1, 1>(tmp + i * A, v + i * A);  // rows
}

template <int M, bool NHWC, int CPT, int CW>
__device__ __forceinline__ void input_transform_task_v2(const Params& p, const float* x, int group,
                                                        int index) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int LPT = CW / CPT;            // lanes per tile
  static_assert(CW % CPT == 0 && (LPT & (LPT - 1)) == 0 && LPT <= 32, "lane map");
  const TransformSlice slice = transform_slice(p, group, index, p.input_tiles_per_task);
  const int tpg = slice.tiles;
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = slice.chunk * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + CW - 1) / CW;
  const int items = tpg * ncg * LPT;
  const long long t_base = slice.t_base;
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
      transform_window<M, NHWC>(x, tc, c < C ? c : 0, r0, q0, C, H, W, t_ok && c < C && c < c1, v[ci]);
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

// Megakernel NCHW input with a narrower load lane map (opt-in MW_MEGA_INPUT_LANES,
// bench/NOTES.md experiment 18).  A warp item is 2 consecutive tiles t0, t0 + 1 (horizontally
// adjacent unless the pair wraps a tile row) x 32 channels cw..cw+31, done in two passes of one
// channel per thread (the CPT 1 register cost): lane l = (tile t0 + s, s = l >> 4; k = l & 15)
// takes channel cw + k in pass A and cw + 16 + k in pass B.  Each window load instruction of a
// warp then reads 16 channel planes at two column offsets M floats apart (about 16-18 distinct
// 128-byte lines instead of 32), like the non-fused CPT 2 kernel's loads.
// Pass A's 36 results go to a per-warp shared buffer buf[q][lane] (AA x 32 floats: 8 warps x
// 4.6 KB for m = 4, inside the GEMM's shared memory), pass B's stay in registers.  Per position q
// the lane reads its xor-16 partner's pass-A value a = buf[q][l ^ 16] (the other tile, channel
// cw + k) and stores two whole 128-byte lines (as the default CPT 1 / CW 32 map does):
//   line (q, t0): lane l writes channel cw + (l ^ 16): lo lanes their own pass-B value, hi lanes a;
//   line (q, t1): lane l writes channel cw + l:        lo lanes a, hi lanes their own pass-B value.
// No shuffles; per q one LDS, two FSEL, two STG.  The V stores are st.global (st_global), so
// ptxas knows they cannot alias the shared buffer and issues the LDS ahead of them (with generic
// stores it keeps each LDS behind the previous store, bench/NOTES.md experiment 9).  Pass B sits
// behind a warp-uniform branch (skipped when none of its channels is stored), which keeps ptxas
// from hoisting its 36 loads into pass A's transform (SASS: each pass issues its 36 loads, then
// transforms; without the branch the two windows share load scoreboards and the peak is 123 live
// registers instead of 121).  Whole 32-channel items store unpredicated; a partial item (c1 - cw
// < 32, not in the suite's default mappings) takes the predicated copy.  Same load_window /
// Wino<M>::bt calls per (tile, channel) as input_transform_task_v2: same bits.  The loop is
// warp-uniform (whole warp per item; lanes past c1 compute zeros that are never stored); NT
// threads per block; a task's tile count is even (a multiple of tasks.TRANSFORM_MIN_TILES).
template <int M, int NT>
__device__ __forceinline__ void input_transform_task_lanes(const Params& p, const float* x, int group,
                                                           int index, float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  const TransformSlice slice = transform_slice(p, group, index, p.input_tiles_per_task);
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = slice.chunk * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + 31) >> 5;
  const int npair = slice.tiles >> 1;
  const int items = npair * ncg;                          // warp items
  const long long t_base = slice.t_base;
  const long long plane = p.tiles_padded * p.c_stride;   // V stride between positions
  const int C = static_cast<int>(p.C), H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  const int pad = static_cast<int>(p.pad);
  const int cs = static_cast<int>(p.c_stride);
  float* V = reinterpret_cast<float*>(p.V);
  const int lane = threadIdx.x & 31;
  const int s = lane >> 4, k = lane & 15;
  const bool hi = s != 0;
  float* buf = sbuf + (threadIdx.x >> 5) * (AA * 32);

  for (int wi = threadIdx.x >> 5; wi < items; wi += NT / 32) {
    const int cg = wi / npair;
    const int tp = wi - cg * npair;
    const int cw = c0 + cg * 32;                           // first channel of the warp item
    const long long t0 = t_base + 2 * tp;                  // first tile of the pair
    const long long t = t0 + s;                            // this lane's tile
    const bool t_ok = t < p.tiles;
    const TileCoord tc = tile_coord(p, t_ok ? t : 0);
    const int r0 = tc.th * M - pad;
    const int q0 = tc.tw * M - pad;
    {   // pass A: channel cw + k, parked in the warp's buffer
      const int c = cw + k;
      float va[AA];
      transform_window<M, false>(x, tc, c < C ? c : 0, r0, q0, C, H, W, t_ok && c < C && c < c1, va);
#pragma unroll
      for (int q = 0; q < AA; ++q) buf[q * 32 + lane] = va[q];
    }
    float v[AA];
    if (cw + 16 < c1) {   // pass B: channel cw + 16 + k, kept in registers
      const int c = cw + 16 + k;
      transform_window<M, false>(x, tc, c < C ? c : 0, r0, q0, C, H, W, t_ok && c < C && c < c1, v);
    } else {              // no channel of pass B is stored
#pragma unroll
      for (int q = 0; q < AA; ++q) v[q] = 0.0f;
    }
    __syncwarp();
    float* dst0 = V + t0 * cs + cw + (lane ^ 16);          // line (q, t0)
    float* dst1 = V + (t0 + 1) * cs + cw + lane;           // line (q, t0 + 1)
    if (cw + 32 <= c1) {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float a = buf[q * 32 + (lane ^ 16)];
        st_global(dst0 + q * plane, hi ? a : v[q]);
        st_global(dst1 + q * plane, hi ? v[q] : a);
      }
    } else {
      const bool ok0 = cw + (lane ^ 16) < c1, ok1 = cw + lane < c1;
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float a = buf[q * 32 + (lane ^ 16)];
        if (ok0) st_global(dst0 + q * plane, hi ? a : v[q]);
        if (ok1) st_global(dst1 + q * plane, hi ? v[q] : a);
      }
    }
    __syncwarp();
  }
}

// The megakernel's input task with MW_MEGA_INPUT_LANES: the lane map above for NCHW; NHWC keeps
// input_transform_default (its CW 32 loads already read whole lines).
template <int M, bool NHWC, int NT>
__device__ __forceinline__ void input_transform_mega_lanes(const Params& p, const float* x, int group, int index,
                                                           float* sbuf) {
  if constexpr (NHWC) {
    input_transform_task_v2<M, true, MW_IN_CPT, MW_IN_CW>(p, x, group, index);
  } else {
    input_transform_task_lanes<M, NT>(p, x, group, index, sbuf);
  }
}

template <int M, bool NHWC>
__device__ __forceinline__ void input_transform_default(const Params& p, const float* x, int group, int index) {
  input_transform_task_v2<M, NHWC, MW_IN_CPT, MW_IN_CW>(p, x, group, index);
}

}  // namespace mw
