// Diagnostic builds: wrong outputs by design, set only by an A/B harness (MEGAWINO_CUDA_DEFINES),
// never by the runtime, to bound what one stage costs the megakernel by making it free.
//   -DMW_GEMM_FREE=1   GEMM tasks only write their M block; GEMM_OUTPUT tasks form no products.
//   -DMW_GEMM_FREE=2   the same, but a task of K block 0 reads its V rows once, as any GEMM must.
//   -DMW_TRANSFORMS_FREE   input and output tasks (and GEMM_OUTPUT's output phase) do nothing.
// params.cuh includes this header where one of them is set, and only then; the production headers
// hold one hook per stage (#ifdef MW_GEMM_FREE / MW_TRANSFORMS_FREE) that calls in here or returns.
#pragma once

#include "generated_tasks.cuh"
#include "ptx.cuh"

#if defined(MW_GEMM_FREE) && MW_GEMM_FREE != 1 && MW_GEMM_FREE != 2
#error "MW_GEMM_FREE is 1 or 2"
#endif

namespace mw {
namespace diagnostics {

#ifdef MW_GEMM_FREE
// A GEMM task (cuda/gemm.cuh gemm_task) that writes its M block [k0, k1) of rows [t0, t0 + rows)
// (and, MW_GEMM_FREE=2, reads its V rows once from K block 0's task) without multiplying.
__device__ __forceinline__ void gemm_task_free(const float* Vp, float* Mp, long long t0, int rows, int kb, int k0,
                                               int k1, int c_stride, int k_stride) {
  const int tid = thread_index(), cols4 = (k1 - k0) / 4;
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (MW_GEMM_FREE >= 2 && kb == 0) {
    const float4* V4 = reinterpret_cast<const float4*>(Vp + t0 * c_stride);
    for (int i = tid; i < rows * c_stride / 4; i += BLOCK_THREADS) {
      const float4 v = V4[i];
      sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
    }
  }
  for (int i = tid; i < rows * cols4; i += BLOCK_THREADS) {
    const int r = i / cols4, c = i - r * cols4;
    reinterpret_cast<float4*>(Mp + (t0 + r) * k_stride + k0)[c] = sum;
  }
}

// The products of a GEMM_OUTPUT step (cuda/gemm_output.cuh) without multiplying: MW_GEMM_FREE=2,
// K block 0 reads the step's V rows (position p's at V + p * position_rows * c_stride + row) and
// parks a sum per position in shared memory.
template <int ALPHA2, int POSITION_FLOATS>
__device__ __forceinline__ void gemm_output_products_free(const float* V, long long position_rows, long long row,
                                                          int c_stride, int index, float* smem) {
  const int tid = thread_index(), lane = tid & 31, warp = tid >> 5;
  if (MW_GEMM_FREE >= 2 && index == 0) {
    for (int pos = warp; pos < ALPHA2; pos += BLOCK_THREADS / 32) {
      const float4* V4 = reinterpret_cast<const float4*>(V + (static_cast<long long>(pos) * position_rows + row) * c_stride);
      float sum = 0.f;
      for (int i = lane; i < GEMM_OUTPUT_TILES * c_stride / 4; i += 32) {
        const float4 v = V4[i];
        sum += v.x + v.y + v.z + v.w;
      }
      smem[pos * POSITION_FLOATS + lane] = sum;
    }
  }
}
#endif  // MW_GEMM_FREE

}  // namespace diagnostics
}  // namespace mw
