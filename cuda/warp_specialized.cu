// The warp-specialized batched GEMM (cuda/gemm_warp_specialized.cuh) as one extern "C" kernel:
// grid = the SMs, mw_ws_threads threads, mw_ws_smem_bytes of dynamic shared memory; U given as its
// big and small TF32 parts.  Builds standalone (-DWS_CONSUMER_WARPGROUPS=3 for 192-row tiles):
//   nvcc -arch=sm_90a -cubin -Xptxas -v -I cuda cuda/warp_specialized.cu
// Other targets compile a kernel that only reports it cannot run (the report word's all ones).
#include "gemm_warp_specialized.cuh"

extern "C" __global__ void __launch_bounds__(mw::WS_THREADS, 1)
mw_gemm_warp_specialized_kernel(const float* __restrict__ V, const float* __restrict__ U_big,
                                const float* __restrict__ U_small, float* __restrict__ M,
                                int alpha2, int rows, int c_stride, int k_stride, long long v_alpha_stride,
                                long long m_alpha_stride, unsigned* report) {
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
  const mw::ws::Problem pb{V, U_big, U_small, M, alpha2, rows, c_stride, k_stride, v_alpha_stride, m_alpha_stride};
  mw::gemm_warp_specialized(pb, report);
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) *report = 0xFFFFFFFFu;
#endif
}
