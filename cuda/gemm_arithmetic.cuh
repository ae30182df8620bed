// The GEMM's fp32-grade arithmetics on the tensor cores, as operators every MMA family uses:
// each fp32 operand is split into a big (hi) and a small (lo) part the tensor cores take, and
// x * y is carried by lo*hi + hi*lo + hi*hi (lo*lo dropped), summed from zero over a 16-term
// k tile, then added to the fp32 accumulator with one round-to-nearest FADD.  3xTF32 issues the
// k tile's small products (lo*hi, hi*lo of both k8 steps) before its big ones: the tensor cores
// cut every MMA's sum toward zero at the sum's magnitude, and the small products' sums are 2^-11
// of it, so only the two big-product MMAs cut at full size (four in step order): the cuts all
// shrink the outputs, and the shrink adds up over a network's layers.
//   Tf32x3: two TF32 parts (about 2^-21 relative per product: fp32-level error);
//   Bf16x3: two BF16 parts (about 2^-16 relative: the TF32-grade mode).
// The FFMA family needs none of this: one __fmaf_rn per k.
#pragma once

#include "ptx.cuh"

namespace mw {

struct Tf32x3 {
  // x = big + small, both TF32 bit patterns (low 13 mantissa bits zero): big rounds x to nearest
  // (ties away, as cvt.rna.tf32.f32, in two integer ops: x is finite), small = x - big (exact in
  // fp32) truncated.  big*big + big*small + small*big carry x*y to about 2^-21 relative
  // (small*small is dropped).
  static __device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
    big = Tf32x3::big(x);
    small = __float_as_uint(x - __uint_as_float(big)) & 0xFFFFE000u;
  }

  // The big part alone (the big products recompute it rather than keep it in registers).
  static __device__ __forceinline__ unsigned big(float x) { return (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u; }

  // The A operand of k8 step q from a thread's two float4 of one k tile (rows g and g + 8, k
  // 4 t4 .. 4 t4 + 3): columns t4 and t4 + 4 are k 4 t4 + 2 q and 4 t4 + 2 q + 1, split in two
  // TF32 parts in m16n8k8 fragment order.
  static __device__ __forceinline__ void split_a_step(const float4& r0, const float4& r8, int q, unsigned (&big)[4],
                                                      unsigned (&small)[4]) {
    split(q == 0 ? r0.x : r0.z, big[0], small[0]);
    split(q == 0 ? r8.x : r8.z, big[1], small[1]);
    split(q == 0 ? r0.y : r0.w, big[2], small[2]);
    split(q == 0 ? r8.y : r8.w, big[3], small[3]);
  }
  static __device__ __forceinline__ void big_a_step(const float4& r0, const float4& r8, int q, unsigned (&b)[4]) {
    b[0] = big(q == 0 ? r0.x : r0.z);
    b[1] = big(q == 0 ? r8.x : r8.z);
    b[2] = big(q == 0 ? r0.y : r0.w);
    b[3] = big(q == 0 ? r8.y : r8.w);
  }
};

struct Bf16x3 {
  // hi and lo BF16 pairs of (x0, x1), packed as the mma.sync fragments take them: hi rounded to
  // nearest-even, lo the remainder rounded.
  static __device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
    hi = pack_bf16x2(x0, x1);
    lo = pack_bf16x2(x0 - __uint_as_float(hi << 16), x1 - __uint_as_float(hi & 0xFFFF0000u));
  }

  // (hi, lo) BF16 parts of one x, hi in the low half: the split operands the transforms store
  // (cuda/split_operand.cuh; megawino.core.abi.split_bf16).
  static __device__ __forceinline__ unsigned split(float x) {
    const unsigned short hi = bf16_rn(x);
    const unsigned short lo = bf16_rn(x - bf16_value(hi));
    return static_cast<unsigned>(hi) | (static_cast<unsigned>(lo) << 16);
  }
};

// part (+)= a_small * b_big + a_big * b_small for a warp's MT x NT mma.sync blocks (the small
// products of one k8 step, issued before any big one: see the head of this file).
template <bool ZERO, int MT, int NT, class Mma, class MmaZero>
__device__ __forceinline__ void small_products(float (&part)[MT * NT][4], const unsigned (&a_big)[MT][4],
                                               const unsigned (&a_small)[MT][4], const unsigned (&b_big)[NT][2],
                                               const unsigned (&b_small)[NT][2], Mma mma, MmaZero mma_zero) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if constexpr (ZERO) mma_zero(part[mt * NT + nt], a_small[mt], b_big[nt]);
      else mma(part[mt * NT + nt], a_small[mt], b_big[nt]);
    }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma(part[mt * NT + nt], a_big[mt], b_small[nt]);
}

// part += a_big * b_big for a warp's MT x NT mma.sync blocks.
template <int MT, int NT, class Mma>
__device__ __forceinline__ void big_products(float (&part)[MT * NT][4], const unsigned (&a_big)[MT][4],
                                             const unsigned (&b_big)[NT][2], Mma mma) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma(part[mt * NT + nt], a_big[mt], b_big[nt]);
}

// BF16x3: part (+)= a_small * b_big + a_big * b_small + a_big * b_big for a warp's MT x NT mma.sync
// blocks, product by product, so that MT * NT independent MMAs separate two that accumulate into
// the same registers; ZERO starts part from zero (mma_zero), else it adds to it (mma).
template <bool ZERO, int MT, int NT, class Mma, class MmaZero>
__device__ __forceinline__ void split_products(float (&part)[MT * NT][4], const unsigned (&a_big)[MT][4],
                                               const unsigned (&a_small)[MT][4], const unsigned (&b_big)[NT][2],
                                               const unsigned (&b_small)[NT][2], Mma mma, MmaZero mma_zero) {
  small_products<ZERO>(part, a_big, a_small, b_big, b_small, mma, mma_zero);
  big_products(part, a_big, b_big, mma);
}

// The 3xTF32 products of a 16-term k tile of one warpgroup MMA (two k8 steps; the operands are
// registers or shared-memory descriptors): d = the small products of both steps from zero, then
// the big products.
template <class Mma, class D, class A, class B>
__device__ __forceinline__ void tf32x3_products(Mma mma, D& d, const A (&a_big)[2], const A (&a_small)[2],
                                                const B (&b_big)[2], const B (&b_small)[2]) {
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    mma(d, a_small[q], b_big[q], q);
    mma(d, a_big[q], b_small[q], 1);
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) mma(d, a_big[q], b_big[q], 1);
}

// BF16x3: the same three products of one warpgroup MMA (the operands are registers or
// shared-memory descriptors): d (+)= a_small * b_big + a_big * b_small + a_big * b_big,
// accumulate == 0 starting d from zero.
template <class Mma, class D, class A, class B>
__device__ __forceinline__ void split_products(Mma mma, D& d, const A& a_big, const A& a_small, const B& b_big,
                                               const B& b_small, int accumulate) {
  mma(d, a_small, b_big, accumulate);
  mma(d, a_big, b_small, 1);
  mma(d, a_big, b_big, 1);
}

// acc += part, one round-to-nearest FADD per element: the 16-term partial sums every tile adds.
template <int ROWS>
__device__ __forceinline__ void add_partial_sums(float (&acc)[ROWS][4], const float (&part)[ROWS][4]) {
#pragma unroll
  for (int j = 0; j < ROWS; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = __fadd_rn(acc[j][e], part[j][e]);
}
template <int N>
__device__ __forceinline__ void add_partial_sums(float (&acc)[N], const float (&part)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = __fadd_rn(acc[i], part[i]);
}

}  // namespace mw
