// OUTPUT task (group g, index -> tile slice and K chunk, transform_slice): y = A^T M A for the
// real tiles of the slice, writes masked to out_h x out_w.  Mirrors
// megawino/core/stages/output_transform.py.  Every lane map gives a warp LANE_CHANNELS channels, so
// each M load of a warp is whole 128-byte lines: the registers and parked maps a thread one tile
// and OUTPUT_CPT consecutive channels, the staged map (NCHW rows without float4 stores) one tile
// and one channel.  All run output_tile_values, so their bits agree by construction.
#pragma once

#include "generated_tasks.cuh"
#include "input_transform.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

constexpr int OUTPUT_CPT = 2;                             // channels per thread
constexpr int OUTPUT_LPT = LANE_CHANNELS / OUTPUT_CPT;    // lanes per tile
static_assert((OUTPUT_LPT & (OUTPUT_LPT - 1)) == 0 && OUTPUT_LPT <= 32, "lane map");

// o = A^T m A of one channel's alpha^2 values: the one output transform of every lane map.
template <int M>
__device__ __forceinline__ void output_tile_values(const float* mm, float* o) {
  constexpr int A = M + 2;
  float tmp[M * A];
#pragma unroll
  for (int b = 0; b < A; ++b) Wino<M>::template at<A, A>(mm + b, tmp + b);       // columns
#pragma unroll
  for (int i = 0; i < M; ++i) Wino<M>::template at<1, 1>(tmp + i * A, o + i * M);  // rows
}

// One output channel of one tile: y = A^T m A, stored with the edge masks (a float4 per row
// when NCHW rows allow).
template <int M, bool NHWC>
__device__ __forceinline__ void output_store_channel(const Params& p, float* y, const float* mm,
                                                     const TileCoord& tc, int k) {
  const int K = static_cast<int>(p.K);
  const int out_h = static_cast<int>(p.out_h), out_w = static_cast<int>(p.out_w);
  const bool vec_rows = !NHWC && M == 4 && (out_w % 4) == 0;
  const int oy0 = tc.th * M, ox0 = tc.tw * M;
  float o[M * M];
  output_tile_values<M>(mm, o);
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const int oy = oy0 + i;
    if (oy >= out_h) continue;
    if (vec_rows) {
      float* row = y + ((static_cast<long long>(tc.n) * K + k) * out_h + oy) * out_w + ox0;
      *reinterpret_cast<float4*>(row) =
          make_float4(o[i * M + 0], o[i * M + 1 % M], o[i * M + 2 % M], o[i * M + 3 % M]);
    } else {
#pragma unroll
      for (int j = 0; j < M; ++j) {
        const int ox = ox0 + j;
        if (ox >= out_w) continue;
        const long long off = NHWC
            ? ((static_cast<long long>(tc.n) * out_h + oy) * out_w + ox) * K + k
            : ((static_cast<long long>(tc.n) * K + k) * out_h + oy) * out_w + ox;
        y[off] = o[i * M + j];
      }
    }
  }
}

// What an output task covers: tpg tiles from t_base (its slice of the group), channels [k0, k1)
// in nkg groups of LANE_CHANNELS, and items = tpg * nkg * OUTPUT_LPT lane slots; M's stride
// between positions; vec: every lane slot holds OUTPUT_CPT real channels, aligned for one load.
struct OutputItems {
  int tpg, K, k0, k1, nkg, items, ks;
  long long t_base, plane, row_shift;   // row of M = tile id - row_shift
  bool vec;
};
__device__ __forceinline__ OutputItems output_items(const Params& p, int group, int index) {
  OutputItems o;
  const TransformSlice slice = transform_slice(p, group, index, p.output_tiles_per_task);
  o.tpg = slice.tiles;
  const int per = static_cast<int>(p.output_k_per_task);
  o.K = static_cast<int>(p.K);
  o.k0 = slice.chunk * per;
  o.k1 = min(o.K, o.k0 + per);
  o.nkg = (o.k1 - o.k0 + LANE_CHANNELS - 1) / LANE_CHANNELS;
  o.items = o.tpg * o.nkg * OUTPUT_LPT;
  o.ks = static_cast<int>(p.k_stride);
  o.t_base = slice.t_base;
  o.plane = p.buffer_tiles * p.k_stride;
  o.row_shift = ring_shift(p, group);
  o.vec = (o.k0 % OUTPUT_CPT) == 0 && ((o.k1 - o.k0) % OUTPUT_CPT) == 0;
  return o;
}

// Lane slot w of an output task: its first channel kb and its tile t.
__device__ __forceinline__ void output_item(int w, int tpg, int k0, long long t_base, int& kb, long long& t) {
  const int li = w & (OUTPUT_LPT - 1);
  const int rest = w / OUTPUT_LPT;
  const int kg = rest / tpg;
  const int tl = rest - kg * tpg;
  kb = k0 + kg * LANE_CHANNELS + li * OUTPUT_CPT;
  t = t_base + tl;
}

// body(kb, t, src) for every lane slot of an output task that lands on a real tile and channel:
// kb its first channel, t its tile, src = &M[position 0][t][kb].  Both lane maps loop through this.
template <class Body>
__device__ __forceinline__ void for_each_output_item(const Params& p, const OutputItems& o, Body&& body) {
  const float* Mb = reinterpret_cast<const float*>(p.Mbuf) - o.row_shift * o.ks;   // indexed by tile id
  for (int w = threadIdx.x; w < o.items; w += blockDim.x) {
    int kb;
    long long t;
    output_item(w, o.tpg, o.k0, o.t_base, kb, t);
    if (kb >= o.k1 || t >= p.tiles) continue;
    body(kb, t, Mb + t * o.ks + kb);
  }
}

// Both channels of a lane slot in registers (the non-fused kernel, up to 255 registers).
template <int M, bool NHWC>
__device__ __forceinline__ void output_transform_registers(const Params& p, float* y, int group, int index) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int CPT = OUTPUT_CPT;
  const OutputItems o = output_items(p, group, index);

  for_each_output_item(p, o, [&](int kb, long long t, const float* src) {
    float mm[CPT][AA];
    if (o.vec) {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float2 f = *reinterpret_cast<const float2*>(src + q * o.plane);
        mm[0][q] = f.x; mm[1][q] = f.y;
      }
    } else {
#pragma unroll
      for (int ci = 0; ci < CPT; ++ci)
#pragma unroll
        for (int q = 0; q < AA; ++q) mm[ci][q] = kb + ci < o.k1 ? src[q * o.plane + ci] : 0.0f;
    }
    const TileCoord tc = tile_coord(p, t);
#pragma unroll
    for (int ci = 0; ci < CPT; ++ci) {
      if (kb + ci < o.k1) output_store_channel<M, NHWC>(p, y, mm[ci], tc, kb + ci);
    }
  });
}

// NCHW, the megakernel: a warp takes one tile and LANE_CHANNELS channels, one per lane (whole
// 128-byte lines of M per load), and the 8 warps' outputs of a round (8 consecutive tiles: a
// task's tile count is a multiple of 16) are staged in sbuf and written out by pixel, so that a
// warp's stores cover output rows of 8 tiles of one channel instead of 32 channel planes.
// Staging: channel c at c * STAGE_CHANNEL_PITCH, tile r of the round at r * M * M, its output row i
// (F(4x4)) at 16-byte chunk i ^ ((r >> 1) & 3), so that both the lanes' float4 stores and the
// write-out's reads of 8 tiles x 4 columns are free of bank conflicts.
// output_transform_task takes this path where the parked path's stores would be scalars.
template <int M>
__device__ __forceinline__ int staged_offset(int r, int i, int j) {
  return r * M * M + (M == 4 ? (i ^ ((r >> 1) & 3)) * 4 + j : i * M + j);
}

template <int M>
__device__ __forceinline__ void output_transform_staged(const Params& p, float* y, int group, int index,
                                                        float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int MM = M * M;
  constexpr int ROUND_TILES = BLOCK_THREADS / 32;              // one per warp
  constexpr int ROUND_PIXELS = ROUND_TILES * MM;                // of one channel
  constexpr int STAGE_CHANNEL_PITCH = ROUND_PIXELS + 4;
  static_assert(LANE_CHANNELS == 32 && TRANSFORM_MIN_TILES % ROUND_TILES == 0, "rounds of whole warp items");
  static_assert(BLOCK_THREADS % ROUND_PIXELS == 0 && MM % 4 == 0, "a thread writes one pixel of some channels");
  static_assert(LANE_CHANNELS * STAGE_CHANNEL_PITCH <= AA * BLOCK_THREADS, "staging fits the transform scratch");
  const OutputItems o = output_items(p, group, index);
  const int items = o.tpg * o.nkg;                                                   // warp items
  const float* Mb = reinterpret_cast<const float*>(p.Mbuf) - o.row_shift * o.ks;   // indexed by tile id
  const int out_h = static_cast<int>(p.out_h), out_w = static_cast<int>(p.out_w);
  const long long y_plane = static_cast<long long>(out_h) * out_w;
  // %tid.x through thread_index in the builds that reread Params (REREAD_PARAMS), so that the
  // staging offsets derived from it are not hoisted out of the ticket loop (and spilled).
  unsigned tid = threadIdx.x;
  if constexpr (REREAD_PARAMS) tid = static_cast<unsigned>(thread_index());
  const int lane = tid & 31, warp = tid >> 5;
  // The pixel this thread writes out of every round: output row pixel_row of the round's tile
  // pixel_tile, column pixel_col.
  const int pixel = threadIdx.x % ROUND_PIXELS;
  const int pixel_row = pixel / (ROUND_TILES * M), pixel_tile = (pixel / M) % ROUND_TILES, pixel_col = pixel % M;
  const float* const staged = sbuf + staged_offset<M>(pixel_tile, pixel_row, pixel_col);

  for (int base = 0; base < items; base += ROUND_TILES) {
    // A round's warp items share their channel chunk and cover ROUND_TILES consecutive tiles.
    const int kg = base / o.tpg;
    const long long t_round = o.t_base + (base - kg * o.tpg);
    const int k_round = o.k0 + kg * LANE_CHANNELS;
    {
      const long long t = t_round + warp;
      const int k = k_round + lane;
      if (t < p.tiles && k < o.k1) {
        const float* src = Mb + t * o.ks + k;
        float mm[AA], out[MM];
#pragma unroll
        for (int q = 0; q < AA; ++q) mm[q] = src[q * o.plane];
        output_tile_values<M>(mm, out);
        float* const dst = sbuf + lane * STAGE_CHANNEL_PITCH;
#pragma unroll
        for (int i = 0; i < MM / 4; ++i)
          *reinterpret_cast<float4*>(dst + staged_offset<M>(warp, i * 4 / M, 0)) =
              make_float4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
      }
    }
    __syncthreads();
    const long long t = t_round + pixel_tile;
    if (t < p.tiles) {
      const TileCoord tc = tile_coord(p, t);
      const int oy = tc.th * M + pixel_row, ox = tc.tw * M + pixel_col;
      if (oy < out_h && ox < out_w) {
        float* const yp = y + ((static_cast<long long>(tc.n) * o.K + k_round) * out_h + oy) * out_w + ox;
        for (int c = static_cast<int>(threadIdx.x) / ROUND_PIXELS; c < LANE_CHANNELS && k_round + c < o.k1;
             c += BLOCK_THREADS / ROUND_PIXELS)
          yp[c * y_plane] = staged[c * STAGE_CHANNEL_PITCH];
      }
    }
    __syncthreads();   // the staging read: the next round may overwrite it
  }
}

// The second channel of a lane slot parked in shared memory, so that only one channel's alpha^2
// values are live in registers (the megakernel, under its 128-register cap).  Slot q of a thread
// is at byte smem_addr(sbuf) + 4 * (q * BLOCK_THREADS + threadIdx.x): conflict-free, and no
// barrier is needed since a thread reads back only what it wrote.  All alpha^2 float2 loads come
// before the parking stores, else ptxas sinks each load next to its store and serialises them.
// sbuf: alpha^2 * BLOCK_THREADS floats.
template <int M, bool NHWC>
__device__ __forceinline__ void output_transform_parked(const Params& p, float* y, int group, int index,
                                                        float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  const OutputItems o = output_items(p, group, index);
  const unsigned sa = smem_addr(sbuf) + threadIdx.x * 4u;

  for_each_output_item(p, o, [&](int kb, long long t, const float* src) {
    float mm[AA];
    if (o.vec) {
      float hi[AA];
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float2 f = *reinterpret_cast<const float2*>(src + q * o.plane);
        mm[q] = f.x;
        hi[q] = f.y;
      }
#pragma unroll
      for (int q = 0; q < AA; ++q) sts_f32(sa + q * (BLOCK_THREADS * 4), hi[q]);
    } else {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        mm[q] = src[q * o.plane];
        sts_f32(sa + q * (BLOCK_THREADS * 4), kb + 1 < o.k1 ? src[q * o.plane + 1] : 0.0f);
      }
    }
    const TileCoord tc = tile_coord(p, t);
    output_store_channel<M, NHWC>(p, y, mm, tc, kb);
    if (kb + 1 < o.k1) {
#pragma unroll
      for (int q = 0; q < AA; ++q) mm[q] = lds_f32(sa + q * (BLOCK_THREADS * 4));
      output_store_channel<M, NHWC>(p, y, mm, tc, kb + 1);
    }
  });
}

// The OUTPUT task of the megakernel: NCHW rows that take no float4 stores (F(2x2), or out_w not a
// multiple of 4) go through the staging; float4 rows and NHWC channels are stored straight, which
// the staging's barriers would only slow.
template <int M, bool NHWC>
__device__ __forceinline__ void output_transform_task(const Params& p, float* y, int group, int index,
                                                      float* sbuf) {
#ifdef MW_TRANSFORMS_FREE   // a diagnostic build (cuda/diagnostics.cuh)
  return;
#endif
  if constexpr (!NHWC) {
    if (M != 4 || p.out_w % 4 != 0) {
      output_transform_staged<M>(p, y, group, index, sbuf);
      return;
    }
  }
  output_transform_parked<M, NHWC>(p, y, group, index, sbuf);
}

}  // namespace mw
