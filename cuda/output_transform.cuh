// OUTPUT task (group g, index -> tile slice and K chunk, transform_slice): y = A^T M A for
// the real tiles of the slice, writes
// masked to out_h x out_w.  Mirrors megawino/stages/output_transform.py.
// Both layouts: output_transform_default (output_transform_task_v2, lane map below); the
// megakernel at 2 blocks/SM: output_transform_task_cpt2s (shared-memory parking).
#pragma once

#include "generated_tasks.cuh"
#include "input_transform.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

// Version 2 (default; bench/NOTES.md experiment 4): a thread takes one tile and CPT consecutive
// output channels, the lanes of a warp cover CW channels of 32 * CPT / CW tiles: with CW = 32 each
// M load instruction of a warp reads whole 128-byte lines.  NCHW rows are written as float4 when
// m = 4 and out_w % 4 == 0.  Same arithmetic, same bits.
#ifndef MW_OUT_CPT
#define MW_OUT_CPT 2
#endif
#ifndef MW_OUT_CW
#define MW_OUT_CW 32
#endif

// One output channel of one tile: y = A^T m A, stored with the edge masks (a float4 per row
// when NCHW rows allow).  Shared by both lane maps, so their bits agree by construction.
template <int M, bool NHWC>
__device__ __forceinline__ void output_store_channel(const Params& p, float* y, const float* mm,
                                                     const TileCoord& tc, int k) {
  constexpr int A = M + 2;
  const int K = static_cast<int>(p.K);
  const int out_h = static_cast<int>(p.out_h), out_w = static_cast<int>(p.out_w);
  const bool vec_rows = !NHWC && M == 4 && (out_w % 4) == 0;
  const int oy0 = tc.th * M, ox0 = tc.tw * M;
  float tmp[M * A];
#pragma unroll
  for (int b = 0; b < A; ++b) Wino<M>::template at<A, A>(mm + b, tmp + b);       // columns
  float o[M * M];
#pragma unroll
  for (int i = 0; i < M; ++i) Wino<M>::template at<1, 1>(tmp + i * A, o + i * M);  // rows
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
// in nkg groups of CW, and items = tpg * nkg * LPT lane slots (LPT lanes per tile); M's stride
// between positions.
struct OutputItems {
  int tpg, K, k0, k1, nkg, items, ks;
  long long t_base, plane;
};
template <int CW, int LPT>
__device__ __forceinline__ OutputItems output_items(const Params& p, int group, int index) {
  OutputItems o;
  const TransformSlice slice = transform_slice(p, group, index, p.output_tiles_per_task);
  o.tpg = slice.tiles;
  const int per = static_cast<int>(p.output_k_per_task);
  o.K = static_cast<int>(p.K);
  o.k0 = slice.chunk * per;
  o.k1 = min(o.K, o.k0 + per);
  o.nkg = (o.k1 - o.k0 + CW - 1) / CW;
  o.items = o.tpg * o.nkg * LPT;
  o.ks = static_cast<int>(p.k_stride);
  o.t_base = slice.t_base;
  o.plane = p.tiles_padded * p.k_stride;
  return o;
}

// Lane slot w of an output task: LPT lanes per tile, CPT channels per lane, CW channels per
// channel group; its first channel kb and its tile t.
template <int CW, int CPT, int LPT>
__device__ __forceinline__ void output_item(int w, int tpg, int k0, long long t_base, int& kb, long long& t) {
  const int li = w & (LPT - 1);
  const int rest = w / LPT;
  const int kg = rest / tpg;
  const int tl = rest - kg * tpg;
  kb = k0 + kg * CW + li * CPT;
  t = t_base + tl;
}

// body(kb, t, src) for every lane slot of an output task that lands on a real tile and channel:
// kb its first channel, t its tile, src = &M[position 0][t][kb].  Both lane maps loop through this.
template <int CW, int CPT, int LPT, class Body>
__device__ __forceinline__ void for_each_output_item(const Params& p, const OutputItems& o, Body&& body) {
  const float* Mb = reinterpret_cast<const float*>(p.Mbuf);
  for (int w = threadIdx.x; w < o.items; w += blockDim.x) {
    int kb;
    long long t;
    output_item<CW, CPT, LPT>(w, o.tpg, o.k0, o.t_base, kb, t);
    if (kb >= o.k1 || t >= p.tiles) continue;
    body(kb, t, Mb + t * o.ks + kb);
  }
}

template <int M, bool NHWC, int CPT, int CW>
__device__ __forceinline__ void output_transform_task_v2(const Params& p, float* y, int group,
                                                         int index) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int LPT = CW / CPT;
  static_assert(CW % CPT == 0 && (LPT & (LPT - 1)) == 0 && LPT <= 32, "lane map");
  const OutputItems o = output_items<CW, LPT>(p, group, index);
  const int k1 = o.k1;
  const long long plane = o.plane;
  const bool vec = CPT > 1 && (o.k0 % CPT) == 0 && ((k1 - o.k0) % CPT) == 0;

  for_each_output_item<CW, CPT, LPT>(p, o, [&](int kb, long long t, const float* src) {
    float mm[CPT][AA];
    if (vec) {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        if constexpr (CPT == 4) {
          const float4 f = *reinterpret_cast<const float4*>(src + q * plane);
          mm[0][q] = f.x; mm[1][q] = f.y; mm[2][q] = f.z; mm[3][q] = f.w;
        } else if constexpr (CPT == 2) {
          const float2 f = *reinterpret_cast<const float2*>(src + q * plane);
          mm[0][q] = f.x; mm[1][q] = f.y;
        } else {
          mm[0][q] = src[q * plane];
        }
      }
    } else {
#pragma unroll
      for (int ci = 0; ci < CPT; ++ci)
#pragma unroll
        for (int q = 0; q < AA; ++q) mm[ci][q] = kb + ci < k1 ? src[q * plane + ci] : 0.0f;
    }
    const TileCoord tc = tile_coord(p, t);
#pragma unroll
    for (int ci = 0; ci < CPT; ++ci) {
      if (kb + ci < k1) output_store_channel<M, NHWC>(p, y, mm[ci], tc, kb + ci);
    }
  });
}

// Per-thread private slots in shared memory (bench/NOTES.md experiment 8): slot q of a thread
// at byte address base + q * NT * 4, base = its 4-byte column: conflict-free, no barrier needed
// (a thread reads back only what it wrote).  Explicit st/ld.shared so that the compiler can
// neither forward the value in a register nor drop the store.
// Version 2 with 2 output channels per thread under a 128-register cap (the megakernel,
// experiment 8): the same lane map, float2 M loads, arithmetic and y stores as
// output_transform_task_v2<.., 2, CW>, but the second channel of each float2 goes straight to the
// thread's private shared-memory slots (above) and is transformed after the first,
// so only one channel's 36 values are live in registers.  sbuf: alpha^2 * NT floats.
// Experiment 9: the vec path loads all 36 float2 into registers before the 36 parking stores;
// otherwise ptxas (at the 128-register cap) sinks each load next to its STS and the loads of an
// item run one after another (SASS: 36 LD.E.64 back to back, then the STS).
template <int M, bool NHWC, int CW, int NT>
__device__ __forceinline__ void output_transform_task_cpt2s(const Params& p, float* y, int group,
                                                            int index, float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int CPT = 2;
  constexpr int LPT = CW / CPT;
  static_assert(CW % CPT == 0 && (LPT & (LPT - 1)) == 0 && LPT <= 32, "lane map");
  const OutputItems o = output_items<CW, LPT>(p, group, index);
  const int k1 = o.k1;
  const long long plane = o.plane;
  const bool vec = (o.k0 % CPT) == 0 && ((k1 - o.k0) % CPT) == 0;
  const unsigned sa = smem_addr(sbuf) + threadIdx.x * 4u;

  for_each_output_item<CW, CPT, LPT>(p, o, [&](int kb, long long t, const float* src) {
    float mm[AA];
    if (vec) {
      float hi[AA];
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        const float2 f = *reinterpret_cast<const float2*>(src + q * plane);
        mm[q] = f.x;
        hi[q] = f.y;
      }
#pragma unroll
      for (int q = 0; q < AA; ++q) sts_f32(sa + q * (NT * 4), hi[q]);
    } else {
#pragma unroll
      for (int q = 0; q < AA; ++q) {
        mm[q] = src[q * plane];
        sts_f32(sa + q * (NT * 4), kb + 1 < k1 ? src[q * plane + 1] : 0.0f);
      }
    }
    const TileCoord tc = tile_coord(p, t);
    output_store_channel<M, NHWC>(p, y, mm, tc, kb);
    if (kb + 1 < k1) {
#pragma unroll
      for (int q = 0; q < AA; ++q) mm[q] = lds_f32(sa + q * (NT * 4));
      output_store_channel<M, NHWC>(p, y, mm, tc, kb + 1);
    }
  });
}

template <int M, bool NHWC>
__device__ __forceinline__ void output_transform_default(const Params& p, float* y, int group, int index) {
  output_transform_task_v2<M, NHWC, MW_OUT_CPT, MW_OUT_CW>(p, y, group, index);
}

}  // namespace mw
