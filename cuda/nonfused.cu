// The non-fused path: four kernels (FTrans, ITrans, GEMM, OTrans) built from the
// same device functions as the megakernel, one task per block, launched in this
// order.  Task ids of one type are contiguous (megawino.tasks.build_graph), so
// block b runs task first_task + b.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/nonfused.cu
#include "generated_tasks.cuh"
#include "params.cuh"
#include "filter_transform.cuh"
#include "input_transform.cuh"
#include "gemm.cuh"
#include "output_transform.cuh"

namespace mw {
__device__ __forceinline__ const int* task_record(const Params& p, int first_task) {
  return reinterpret_cast<const int*>(p.records) +
         static_cast<long long>(first_task + static_cast<int>(blockIdx.x)) * REC_FIELDS;
}
}  // namespace mw

extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS)
mw_filter_kernel(const mw::Params* __restrict__ params, const float* w, int first_task) {
  const int* rec = mw::task_record(*params, first_task);
  mw::filter_transform_task<MW_M>(*params, w, rec[mw::REC_INDEX]);
}

extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS)
mw_input_kernel(const mw::Params* __restrict__ params, const float* x, int first_task) {
  const int* rec = mw::task_record(*params, first_task);
  __shared__ __align__(16) float sbuf[(MW_M + 2) * (MW_M + 2) * mw::BLOCK_THREADS];
  mw::input_transform_task<MW_M, MW_NHWC != 0, 2>(*params, x, rec[mw::REC_GROUP], rec[mw::REC_INDEX], sbuf);
}

// Two resident blocks per SM, as in the megakernel, so both paths run the GEMM tile under the
// same 128-register cap.
extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS, 2)
mw_gemm_kernel(const mw::Params* __restrict__ params, int first_task) {
  __shared__ __align__(16) mw::GemmSmem smem;
  const int* rec = mw::task_record(*params, first_task);
  mw::gemm_task(*params, smem, rec[mw::REC_GROUP], rec[mw::REC_INDEX]);
}

extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS)
mw_output_kernel(const mw::Params* __restrict__ params, float* y, int first_task) {
  const int* rec = mw::task_record(*params, first_task);
  mw::output_transform_registers<MW_M, MW_NHWC != 0>(*params, y, rec[mw::REC_GROUP], rec[mw::REC_INDEX]);
}
