// FILTER task: a range of (c, k) pairs q of U (megawino.core.tasks Layout.u_shape):
// U = G g G^T for real pairs, zeros for padding pairs (c >= C or k >= K).  The fp32 layout
// U[alpha2][c_stride][k_stride] has q = c * k_stride + k; the split one (MW_U_SPLIT)
// U[alpha2][2][k_stride][u_c_stride] has q = k * u_c_stride + s, the TF32 big and small parts
// in two planes, s the stored channel position (u_channel_order).
// Mirrors megawino/core/stages/filter_transform.py.  Consecutive threads take
// consecutive pairs, so the U stores are coalesced.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "tensor_core.cuh"

namespace mw {

template <int M>
__device__ __forceinline__ void filter_transform_task(const Params& p, const float* w, int index) {
  constexpr int A = M + 2;
  const long long pairs = p.u_c_stride * p.k_stride;
  const long long q0 = static_cast<long long>(index) * p.filter_pairs_per_task;
  const long long q1 = min(pairs, q0 + p.filter_pairs_per_task);
  const int C = static_cast<int>(p.C), K = static_cast<int>(p.K);
  float* U = reinterpret_cast<float*>(p.U);
  for (long long q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
#if MW_U_SPLIT
    const int u_c_stride = static_cast<int>(p.u_c_stride);
    const int k = static_cast<int>(q / u_c_stride);
    const int c = u_channel_order(static_cast<int>(q - static_cast<long long>(k) * u_c_stride));
#else
    const int k_stride = static_cast<int>(p.k_stride);
    const int c = static_cast<int>(q / k_stride);
    const int k = static_cast<int>(q - static_cast<long long>(c) * k_stride);
#endif
    float u[A * A];
    if (c < C && k < K) {
      const float* src = w + (static_cast<long long>(k) * C + c) * 9;
      float g[9];
#pragma unroll
      for (int i = 0; i < 9; ++i) g[i] = src[i];
      float tmp[A * 3];
#pragma unroll
      for (int s = 0; s < 3; ++s) Wino<M>::template g<3, 3>(g + s, tmp + s);        // columns
#pragma unroll
      for (int i = 0; i < A; ++i) Wino<M>::template g<1, 1>(tmp + i * 3, u + i * A);  // rows
    } else {
#pragma unroll
      for (int i = 0; i < A * A; ++i) u[i] = 0.0f;
    }
#if MW_U_SPLIT
#pragma unroll
    for (int i = 0; i < A * A; ++i) {
      unsigned big, small;
      split_tf32(u[i], big, small);
      U[(2 * i) * pairs + q] = __uint_as_float(big);
      U[(2 * i + 1) * pairs + q] = __uint_as_float(small);
    }
#else
#pragma unroll
    for (int i = 0; i < A * A; ++i) U[i * pairs + q] = u[i];
#endif
  }
}

}  // namespace mw
