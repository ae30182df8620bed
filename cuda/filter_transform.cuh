// FILTER task: a range of (c, k) pairs q = c * k_stride + k of U[alpha2][c_stride][k_stride]:
// U = G g G^T for real pairs, zeros for padding pairs (c >= C or k >= K).
// Mirrors megawino/core/stages/filter_transform.py.  Consecutive threads take
// consecutive pairs, so the U stores are coalesced.  Split operands (MW_SPLIT_OPERANDS) keep U
// transposed, [alpha2][k_stride][c_stride] in split BF16 rows: there pair q is k * c_stride + c.
// The paired format (MW_U_PAIRED) keeps U transposed too, pair q at row k, stored position
// q - k * c_stride, whose channel is paired_channel of it within its 16.  Plans with GEMM_OUTPUT
// tasks (p.u_transposed) keep it transposed in channel order: pair q is k * c_stride + c.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "split_operand.cuh"

namespace mw {

template <int M>
__device__ __forceinline__ void filter_transform_task(const Params& p, const float* w, int index) {
  constexpr int A = M + 2;
  const long long pairs = p.c_stride * p.k_stride;
  const long long q0 = static_cast<long long>(index) * p.filter_pairs_per_task;
  const long long q1 = min(pairs, q0 + p.filter_pairs_per_task);
  const int C = static_cast<int>(p.C), K = static_cast<int>(p.K);
  const int c_stride = static_cast<int>(p.c_stride);
  const int k_stride = static_cast<int>(p.k_stride);
  const bool transposed = MW_SPLIT_OPERANDS || MW_U_PAIRED || p.u_transposed != 0;
  float* U = reinterpret_cast<float*>(p.U);
  for (long long q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
    const int row = static_cast<int>(q / (transposed ? c_stride : k_stride));
    const int col = static_cast<int>(q - static_cast<long long>(row) * (transposed ? c_stride : k_stride));
    const int k = transposed ? row : col;
#if MW_U_PAIRED
    const int c = p.u_transposed ? col : (col & ~15) + paired_channel(col & 15);
#else
    const int c = transposed ? col : row;
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
#if MW_SPLIT_OPERANDS
#pragma unroll
    for (int i = 0; i < A * A; ++i) store_operand(U + i * pairs + static_cast<long long>(k) * c_stride, c_stride, c, u[i]);
#else
#pragma unroll
    for (int i = 0; i < A * A; ++i) U[i * pairs + q] = u[i];
#endif
  }
}

}  // namespace mw
