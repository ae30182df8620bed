// INPUT task (group g, index -> tile slice and channel chunk, transform_slice below):
// V[:, tiles of the slice, chunk] = B^T d B for each (tile, channel) of the task, d the
// alpha x alpha input window at rows th*m - pad + [0, alpha), cols tw*m - pad + [0, alpha),
// zero outside the image.  Padding tiles (t >= tiles) and padding channels (c >= C) get zeros.
// Mirrors megawino/core/stages/input_transform.py.  Every lane map runs the same load_window /
// Wino<M>::bt calls per (tile, channel), so all produce the same bits.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"
#include "split_operand.cuh"

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
// tiles_per_group / tiles_per_task (megawino.core.tasks.Layout.input_slices / output_slices).
struct TransformSlice {
  long long t_base;   // first tile
  int tiles;          // tiles covered (a multiple of megawino.core.tasks.TRANSFORM_MIN_TILES)
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

// d = alpha x alpha window of channel c at (r0, q0); zeros outside the image or where !valid.
// Per-tile row / column masks keep 64-bit index arithmetic out of the per-element loads.  An
// NCHW F(4x4) window whose columns q0 + 1 .. q0 + 4 are a 16-byte-aligned run inside the image
// reads each row as one float4 and two scalars, which loads the same floats in fewer instructions.
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
  if constexpr (!NHWC && A == 6) {
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

// NHWC: a thread takes one tile and CPT consecutive channels, a warp LANE_CHANNELS channels of
// 32 * CPT / LANE_CHANNELS tiles, so each window load and V store of a warp is whole 128-byte lines.
template <int M, int CPT>
__device__ __forceinline__ void input_transform_nhwc(const Params& p, const float* x, int group, int index) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int LPT = LANE_CHANNELS / CPT;   // lanes per tile
  static_assert((CPT == 1 || CPT == 2) && (LPT & (LPT - 1)) == 0 && LPT <= 32, "lane map");
  const TransformSlice slice = transform_slice(p, group, index, p.input_tiles_per_task);
  const int tpg = slice.tiles;
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = slice.chunk * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + LANE_CHANNELS - 1) / LANE_CHANNELS;
  const int items = tpg * ncg * LPT;
  const long long t_base = slice.t_base;
  long long plane = p.buffer_tiles * p.c_stride;   // V stride between positions
  const int C = static_cast<int>(p.C), H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  const int pad = static_cast<int>(p.pad);
  const int cs = static_cast<int>(p.c_stride);
  const bool vec = CPT > 1 && (c0 % CPT) == 0 && ((c1 - c0) % CPT) == 0;   // whole aligned groups
  float* V = reinterpret_cast<float*>(p.V) - ring_shift(p, group) * p.c_stride;   // indexed by tile id (reread: REREAD_PARAMS)

  for (int w = threadIdx.x; w < items; w += blockDim.x) {
    const int li = w & (LPT - 1);
    const int rest = w / LPT;
    const int cg = rest / tpg;
    const int tl = rest - cg * tpg;
    const int cb = c0 + cg * LANE_CHANNELS + li * CPT;
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
      transform_window<M, true>(x, tc, c < C ? c : 0, r0, q0, C, H, W, t_ok && c < C && c < c1, v[ci]);
    }
    if constexpr (REREAD_PARAMS) {
      plane = reread(p.buffer_tiles) * reread(p.c_stride);
      V = reinterpret_cast<float*>(reread(p.V)) - ring_shift(p, group) * reread(p.c_stride);
    }
    float* dst = V + t * cs + cb;
    if constexpr (MW_SPLIT_OPERANDS) {
      if (CPT == 2 && vec) {
#pragma unroll
        for (int q = 0; q < AA; ++q) store_operand_pair(V + q * plane + t * cs, cs, cb, v[0][q], v[CPT - 1][q]);
      } else {
#pragma unroll
        for (int ci = 0; ci < CPT; ++ci) {
          if (cb + ci < c1) {
#pragma unroll
            for (int q = 0; q < AA; ++q) store_operand(V + q * plane + t * cs, cs, cb + ci, v[ci][q]);
          }
        }
      }
    } else if (vec) {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        if constexpr (CPT == 2) {
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

// NCHW: a warp item is 2 consecutive tiles t0, t0 + 1 x 32 channels cw .. cw + 31, in two
// passes of one channel per thread (lane l: tile t0 + (l >> 4), channel cw + (l & 15) in pass A,
// cw + 16 + (l & 15) in pass B), so each window load of a warp reads 16 channel planes at two
// column offsets (about half the 128-byte lines of a warp of 32 channels) within the 128-register
// cap.  Pass A's results go to the warp's slice of sbuf (buf[q][lane]) and pass B's stay in
// registers; per position q a lane reads its xor-16 partner's pass-A value, and the warp stores
// two whole 128-byte lines:
//   line (q, t0):     lane l writes channel cw + (l ^ 16): lo lanes their pass-B value, hi lanes the partner's;
//   line (q, t0 + 1): lane l writes channel cw + l:        lo lanes the partner's, hi lanes their pass-B value.
// The V stores are st.global so that ptxas may issue the shared loads ahead of them, with the
// evict-first hint so that V does not push x's lines out of L2 before the next tiles read them;
// pass B sits behind a warp-uniform branch, which keeps ptxas from hoisting its window loads into
// pass A's transform (more live registers).  The loop is warp-uniform: lanes past c1 compute zeros
// that are never stored.  A task's tile count is even (a multiple of tasks.TRANSFORM_MIN_TILES).
// sbuf: alpha^2 * BLOCK_THREADS floats.
template <int M>
__device__ __forceinline__ void input_transform_nchw(const Params& p, const float* x, int group, int index,
                                                     float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  static_assert(LANE_CHANNELS == 32 && NCHW_INPUT_PASS_CHANNELS == 16, "a warp item is two passes of 16 channels");
  const TransformSlice slice = transform_slice(p, group, index, p.input_tiles_per_task);
  const int per = static_cast<int>(p.input_channels_per_task);
  const int c0 = slice.chunk * per;
  const int c1 = min(static_cast<int>(p.c_stride), c0 + per);
  const int ncg = (c1 - c0 + 31) >> 5;
  const int npair = slice.tiles >> 1;
  const int items = npair * ncg;                          // warp items
  const long long t_base = slice.t_base;
  const long long plane = p.buffer_tiles * p.c_stride;   // V stride between positions
  const int C = static_cast<int>(p.C), H = static_cast<int>(p.H), W = static_cast<int>(p.W);
  const int pad = static_cast<int>(p.pad);
  const int cs = static_cast<int>(p.c_stride);
  float* V = reinterpret_cast<float*>(p.V) - ring_shift(p, group) * p.c_stride;   // indexed by tile id
  const int lane = threadIdx.x & 31;
  const int s = lane >> 4, k = lane & 15;
  const bool hi = s != 0;
  float* buf = sbuf + (threadIdx.x >> 5) * (AA * 32);

  for (int wi = threadIdx.x >> 5; wi < items; wi += BLOCK_THREADS / 32) {
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
    float* const row0 = V + t0 * cs;                       // line (q, t0): channel c0_lane
    float* const row1 = V + (t0 + 1) * cs;                 // line (q, t0 + 1): channel c1_lane
    const int c0_lane = cw + (lane ^ 16), c1_lane = cw + lane;
    if constexpr (MW_SPLIT_OPERANDS) {
      // c1 is even (CHANNEL_ALIGN), so lanes l and l ^ 1 (channels c and c ^ 1) store or skip together.
      const bool ok0 = cw + 32 <= c1 || c0_lane < c1, ok1 = cw + 32 <= c1 || c1_lane < c1;
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float a = buf[q * 32 + (lane ^ 16)];
        store_operand_warp(row0 + q * plane, cs, c0_lane, hi ? a : v[q], ok0);
        store_operand_warp(row1 + q * plane, cs, c1_lane, hi ? v[q] : a, ok1);
      }
    } else if (cw + 32 <= c1) {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float a = buf[q * 32 + (lane ^ 16)];
        store_operand<true>(row0 + q * plane, cs, c0_lane, hi ? a : v[q]);
        store_operand<true>(row1 + q * plane, cs, c1_lane, hi ? v[q] : a);
      }
    } else {
      const bool ok0 = c0_lane < c1, ok1 = c1_lane < c1;
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float a = buf[q * 32 + (lane ^ 16)];
        if (ok0) store_operand<true>(row0 + q * plane, cs, c0_lane, hi ? a : v[q]);
        if (ok1) store_operand<true>(row1 + q * plane, cs, c1_lane, hi ? v[q] : a);
      }
    }
    __syncwarp();
  }
}

// The INPUT task of either layout.  NHWC_CPT: channels per thread of the NHWC map (the
// megakernel's 128-register cap fits 1 without spills; the non-fused kernel takes 2).
template <int M, bool NHWC, int NHWC_CPT>
__device__ __forceinline__ void input_transform_task(const Params& p, const float* x, int group, int index,
                                                     float* sbuf) {
#ifdef MW_TRANSFORMS_FREE   // a diagnostic build (cuda/diagnostics.cuh)
  return;
#endif
  if constexpr (NHWC) {
    input_transform_nhwc<M, NHWC_CPT>(p, x, group, index);
  } else {
    input_transform_nchw<M>(p, x, group, index, sbuf);
  }
}

}  // namespace mw
