// OUTPUT task (group g, K chunk): y = A^T M A for the real tiles of g, writes
// masked to out_h x out_w.  Mirrors megawino/stages/output_transform.py.
// Both layouts: output_transform_default (output_transform_task_v2, lane map below); the
// megakernel at 2 blocks/SM: output_transform_task_cpt2s (shared-memory parking).
#pragma once

#include "generated_tasks.cuh"
#include "input_transform.cuh"
#include "params.cuh"

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

// y = A^T m A of one (tile, channel): o[i * M + j] = output row i, column j.  The one place the
// output arithmetic lives (both store paths below call it).
template <int M>
__device__ __forceinline__ void output_channel_values(const float* mm, float* o) {
  constexpr int A = M + 2;
  float tmp[M * A];
#pragma unroll
  for (int b = 0; b < A; ++b) Wino<M>::template at<A, A>(mm + b, tmp + b);       // columns
#pragma unroll
  for (int i = 0; i < M; ++i) Wino<M>::template at<1, 1>(tmp + i * A, o + i * M);  // rows
}

// One output channel of one tile: y = A^T m A, stored with the edge masks (a float4 per row
// when NCHW rows allow).  Shared by both lane maps, so their bits agree by construction.
template <int M, bool NHWC>
__device__ __forceinline__ void output_store_channel(const Params& p, float* y, const float* mm,
                                                     const TileCoord& tc, int k) {
  const int K = static_cast<int>(p.K);
  const int out_h = static_cast<int>(p.out_h), out_w = static_cast<int>(p.out_w);
  const bool vec_rows = !NHWC && M == 4 && (out_w % 4) == 0;
  const int oy0 = tc.th * M, ox0 = tc.tw * M;
  float o[M * M];
  output_channel_values<M>(mm, o);
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

template <int M, bool NHWC, int CPT, int CW>
__device__ __forceinline__ void output_transform_task_v2(const Params& p, float* y, int group,
                                                         int index) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int LPT = CW / CPT;
  static_assert(CW % CPT == 0 && (LPT & (LPT - 1)) == 0 && LPT <= 32, "lane map");
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.output_k_per_task);
  const int K = static_cast<int>(p.K);
  const int k0 = index * per;
  const int k1 = min(K, k0 + per);
  const int nkg = (k1 - k0 + CW - 1) / CW;
  const int items = tpg * nkg * LPT;
  const long long t_base = static_cast<long long>(group) * tpg;
  const long long plane = p.tiles_padded * p.k_stride;
  const int ks = static_cast<int>(p.k_stride);
  const bool vec = CPT > 1 && (k0 % CPT) == 0 && ((k1 - k0) % CPT) == 0;
  const float* Mb = reinterpret_cast<const float*>(p.Mbuf);

  for (int w = threadIdx.x; w < items; w += blockDim.x) {
    const int li = w & (LPT - 1);
    const int rest = w / LPT;
    const int kg = rest / tpg;
    const int tl = rest - kg * tpg;
    const int kb = k0 + kg * CW + li * CPT;
    const long long t = t_base + tl;
    if (kb >= k1 || t >= p.tiles) continue;
    const float* src = Mb + t * ks + kb;
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
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.output_k_per_task);
  const int K = static_cast<int>(p.K);
  const int k0 = index * per;
  const int k1 = min(K, k0 + per);
  const int nkg = (k1 - k0 + CW - 1) / CW;
  const int items = tpg * nkg * LPT;
  const long long t_base = static_cast<long long>(group) * tpg;
  const long long plane = p.tiles_padded * p.k_stride;
  const int ks = static_cast<int>(p.k_stride);
  const bool vec = (k0 % CPT) == 0 && ((k1 - k0) % CPT) == 0;
  const float* Mb = reinterpret_cast<const float*>(p.Mbuf);
  const unsigned sa = smem_addr(sbuf) + threadIdx.x * 4u;

  for (int w = threadIdx.x; w < items; w += blockDim.x) {
    const int li = w & (LPT - 1);
    const int rest = w / LPT;
    const int kg = rest / tpg;
    const int tl = rest - kg * tpg;
    const int kb = k0 + kg * CW + li * CPT;
    const long long t = t_base + tl;
    if (kb >= k1 || t >= p.tiles) continue;
    const float* src = Mb + t * ks + kb;
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
  }
}

// Megakernel NCHW output with a store lane map over 4 horizontally adjacent tiles (opt-in
// MW_MEGA_OUTPUT_LANES, bench/NOTES.md experiment 21).  A warp item is 4 consecutive tiles
// t0..t0+3 (adjacent unless the run wraps a tile row; tiles_per_group is a multiple of 64, so a
// run never leaves its group) x 32 output channels cw..cw+31.  Lane l = (side = l >> 4,
// x = l & 15; x = 8 h + i) takes channels cw + 2x, cw + 2x + 1 (float2 M loads: each load
// instruction reads 2 whole 128-byte lines, as output_transform_task_cpt2s) of tile t0 + side
// (passes 0 + 1: 72 values, transformed, the results parked in a per-warp shared buffer) and then
// of tile t0 + 2 + side (passes 2 + 3: the 2 x MM results stay in registers).
// The y stores go by rows: store instruction (j, row r), j = 0..3, covers the 8 channels
// S_j = {16 (j & 1) + 2 i + (j >> 1): i = 0..7} x all 4 tiles, so each of its 8 planes gets one
// 4 x 16 = 64-byte run of row r (about 8 distinct 128-byte lines per warp store instead of 16 with
// the 2-tile x 16-channel map of output_transform_task_cpt2s).  Lane l writes channel
// 16 (j & 1) + 2 i + (j >> 1) of tile 2 + side when h == (j & 1): that is its own channel
// 2x + (j >> 1) of its registers (the register index j >> 1 is a compile-time constant: one select
// per value), else of tile side, from the buffer.  So each lane stores each of its 4 register
// (tile, channel) rows exactly once and no shuffles are needed.  Buffer: buf[side][r][pos][M],
// pos(c) = (c >> 1) + 16 (c & 1) (even channels, then odd: the STS.128 / LDS.128 of a quarter warp
// touch 8 consecutive 16-byte slots, conflict-free), 2 x 32 x MM floats + a 4-entry tile table
// per warp (8 warps x 4.2 KB for m = 4, inside the GEMM's shared memory).  The table: lanes 0..3
// write tile t0 + u's y offset (tile, row 0, column 0, channel 0), rows inside the image (0 when
// the tile is not real) and columns inside the image (one tile_coord per lane); each store group
// reads its entry with one LDS.128.  y stores are st.global (ptxas may then issue the LDS ahead of
// them, bench/NOTES.md experiments 9, 18) with the mask as a predicate inside the asm: float4
// rows when m = 4 and out_w % 4 == 0, else masked scalars (as output_store_channel).  Same
// output_channel_values per (tile, channel) as output_store_channel, same masks (oy < out_h,
// ox < out_w, t < tiles, k < k1): same bits.  Loads are unpredicated: a padding tile is read from
// M's padding rows (t < tiles_padded), a channel past k1 reads k1 - 1 (rounded down to even for
// float2 loads); those values are never stored (predicated loads made ptxas rebuild each 64-bit
// address with IMAD.WIDE, ~5.5 instructions per load instead of 2).  k0 or k1 - k0 odd: scalar
// loads of the same channels (as cpt2s).  The loop is warp-uniform (the whole warp per item).
template <bool V>
struct BoolTag {   // (no <type_traits> under NVRTC)
  static constexpr bool value = V;
};
template <int M>
struct OutLanes {
  static constexpr int MM = M * M;
  static constexpr int TILE = MM * 32;           // floats per parked tile
  static constexpr int WARP = 2 * TILE + 16;     // floats per warp (+ the tile table)
};

// Predicated st.global (the predicate inside the asm: no branch around each store).
__device__ __forceinline__ void st_global_v4_if(bool ok, float* ptr, float a, float b, float c, float d) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %0, 0; @p st.global.v4.f32 [%1], {%2, %3, %4, %5}; }"
               ::"r"(static_cast<int>(ok)), "l"(ptr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ void st_global_if(bool ok, float* ptr, float v) {
  asm volatile("{ .reg .pred p; setp.ne.b32 p, %0, 0; @p st.global.f32 [%1], %2; }"
               ::"r"(static_cast<int>(ok)), "l"(ptr), "f"(v) : "memory");
}

template <int M, int NT>
__device__ __forceinline__ void output_transform_task_lanes(const Params& p, float* y, int group,
                                                            int index, float* sbuf) {
  constexpr int A = M + 2;
  constexpr int AA = A * A;
  constexpr int MM = M * M;
  constexpr int TILE = OutLanes<M>::TILE;
  const int tpg = static_cast<int>(p.tiles_per_group);
  const int per = static_cast<int>(p.output_k_per_task);
  const int K = static_cast<int>(p.K);
  const int k0 = index * per;
  const int k1 = min(K, k0 + per);
  const int nkg = (k1 - k0 + 31) >> 5;
  const int nquad = tpg >> 2;
  const int items = nquad * nkg;                          // warp items
  const int t_base = group * tpg;
  const int t_end = min(static_cast<int>(p.tiles), t_base + tpg);
  const long long plane = p.tiles_padded * p.k_stride;
  const int ks = static_cast<int>(p.k_stride);
  const int out_h = static_cast<int>(p.out_h), out_w = static_cast<int>(p.out_w);
  const long long hw = static_cast<long long>(out_h) * out_w;
  const bool vec_rows = M == 4 && (out_w % 4) == 0;
  const bool vec = (k0 % 2) == 0 && ((k1 - k0) % 2) == 0;   // float2 M loads
  const int kv = (k1 - 1) & ~1;                            // last even channel below k1
  const float* Mb = reinterpret_cast<const float*>(p.Mbuf);
  const int lane = threadIdx.x & 31;
  const int side = lane >> 4, x = lane & 15, h = x >> 3, i8 = x & 7;
  float* buf = sbuf + (threadIdx.x >> 5) * OutLanes<M>::WARP;

  for (int wi = threadIdx.x >> 5; wi < items; wi += NT / 32) {
    const int kg = wi / nquad;
    const int tq = wi - kg * nquad;
    const int cw = k0 + kg * 32;                           // first channel of the warp item
    const int t0 = t_base + 4 * tq;                        // first tile of the run
    if (t0 >= t_end) continue;                             // no real tile (warp-uniform)
    // Channels cw + 2x, cw + 2x + 1 of tile t0 + dt + side: all 72 loads before any transform.
    auto load = [&](int dt, float* lo, float* hi) {
      const float* src = Mb + static_cast<long long>(t0 + dt + side) * ks;
      if (vec) {
        src += min(cw + 2 * x, kv);
#pragma unroll
        for (int q = 0; q < AA; ++q) {
          const float2 f = *reinterpret_cast<const float2*>(src + q * plane);
          lo[q] = f.x;
          hi[q] = f.y;
        }
      } else {
        const int c0 = min(cw + 2 * x, k1 - 1), c1 = min(cw + 2 * x + 1, k1 - 1);
#pragma unroll
        for (int q = 0; q < AA; ++q) {
          lo[q] = src[q * plane + c0];
          hi[q] = src[q * plane + c1];
        }
      }
    };
    {   // passes 0 + 1 -> buf[side][r][pos(2x + e)]
      float mm[2][AA];
      load(0, mm[0], mm[1]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float o[MM];
        output_channel_values<M>(mm[e], o);
        float* dst = buf + side * TILE + (16 * e + x) * M;
#pragma unroll
        for (int r = 0; r < M; ++r) {
          if constexpr (M == 4) {
            *reinterpret_cast<float4*>(dst + r * 32 * M) = make_float4(o[r * M], o[r * M + 1 % M],
                                                                       o[r * M + 2 % M], o[r * M + 3 % M]);
          } else {
            *reinterpret_cast<float2*>(dst + r * 32 * M) = make_float2(o[r * M], o[r * M + 1]);
          }
        }
      }
    }
    float oreg[2][MM];   // passes 2 + 3: channels 2x, 2x + 1 of tile t0 + 2 + side
    {
      float mm[2][AA];
      load(2, mm[0], mm[1]);
      output_channel_values<M>(mm[0], oreg[0]);
      output_channel_values<M>(mm[1], oreg[1]);
    }
    {   // the tile table
      const int u = t0 + (lane & 3);
      const TileCoord tc = tile_coord(p, u);
      const long long off = static_cast<long long>(tc.n) * K * hw +
                            static_cast<long long>(tc.th * M) * out_w + tc.tw * M;
      if (lane < 4) {
        *reinterpret_cast<int4*>(buf + 2 * TILE + 4 * lane) =
            make_int4(static_cast<int>(off), static_cast<int>(off >> 32),
                      u < t_end ? out_h - tc.th * M : 0, out_w - tc.tw * M);
      }
    }
    __syncwarp();
    // The store phase, one copy per row kind (float4 rows / masked scalars): no per-row branch.
    auto store_phase = [&](auto vec_tag) {
      constexpr bool VEC = decltype(vec_tag)::value;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool reg = h == (j & 1);                     // own register row (tile 2 + side)
        const int tau = reg ? 2 + side : side;
        const int4 e4 = *reinterpret_cast<const int4*>(buf + 2 * TILE + 4 * tau);
        const long long tbase = static_cast<long long>(static_cast<unsigned>(e4.x)) |
                                (static_cast<long long>(e4.y) << 32);
        const int nrow = e4.z, ncol = e4.w;
        const int ch = cw + 16 * (j & 1) + 2 * i8 + (j >> 1);
        const bool ok = ch < k1;
        float* dst = y + tbase + static_cast<long long>(ch) * hw;
        const float* park = buf + side * TILE + (8 * (j & 1) + i8 + 16 * (j >> 1)) * M;
        float v[M][M];   // the lane's M rows: all M shared reads first, then the stores
#pragma unroll
        for (int r = 0; r < M; ++r) {
          if constexpr (M == 4) {
            const float4 f = *reinterpret_cast<const float4*>(park + r * 32 * M);
            v[r][0] = f.x; v[r][1 % M] = f.y; v[r][2 % M] = f.z; v[r][3 % M] = f.w;
          } else {
            const float2 f = *reinterpret_cast<const float2*>(park + r * 32 * M);
            v[r][0] = f.x; v[r][1] = f.y;
          }
        }
#pragma unroll
        for (int r = 0; r < M; ++r) {
#pragma unroll
          for (int e = 0; e < M; ++e) v[r][e] = reg ? oreg[j >> 1][r * M + e] : v[r][e];
          const bool row_ok = ok && r < nrow;
          float* row = dst + r * out_w;
          if constexpr (VEC) {
            st_global_v4_if(row_ok, row, v[r][0], v[r][1 % M], v[r][2 % M], v[r][3 % M]);
          } else {
#pragma unroll
            for (int e = 0; e < M; ++e) st_global_if(row_ok && e < ncol, row + e, v[r][e]);
          }
        }
      }
    };
    if (M == 4 && vec_rows) {
      store_phase(BoolTag<M == 4>());
    } else {
      store_phase(BoolTag<false>());
    }
    __syncwarp();
  }
}

// The megakernel's output task with MW_MEGA_OUTPUT_LANES: the lane map above for NCHW; NHWC keeps
// output_transform_task_cpt2s (its y stores are channel-contiguous already).
template <int M, bool NHWC, int NT>
__device__ __forceinline__ void output_transform_mega_lanes(const Params& p, float* y, int group, int index,
                                                            float* sbuf) {
  if constexpr (NHWC) {
    output_transform_task_cpt2s<M, true, 32, NT>(p, y, group, index, sbuf);
  } else {
    output_transform_task_lanes<M, NT>(p, y, group, index, sbuf);
  }
}

template <int M, bool NHWC>
__device__ __forceinline__ void output_transform_default(const Params& p, float* y, int group, int index) {
  output_transform_task_v2<M, NHWC, MW_OUT_CPT, MW_OUT_CW>(p, y, group, index);
}

}  // namespace mw
