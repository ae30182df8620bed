// The persistent Winograd megakernel: every block loops taking tickets
// (scheduler.cuh) and running the task's device function (run_task: generated_dispatch.cuh).
// Compile-time variants: MW_M (2 or 4), MW_NHWC (0 or 1), MW_GEMM_TF32X3 (0 or 1), MW_TRACE
// (defined or not).
// Layer sizes are runtime parameters (params.cuh), so one build serves every layer.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/megakernel.cu
// Two resident blocks per SM (one works while the other waits on a counter or a barrier) cap a
// thread at 128 registers: the input transform takes one NHWC channel per thread and the output
// transform parks its second channel in the GEMM's shared memory (free during a transform task)
// to fit that cap without spills.
#include "generated_tasks.cuh"
#include "params.cuh"
#include "scheduler.cuh"
#include "generated_dispatch.cuh"


extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS, 2)
mw_megakernel(const mw::Params* __restrict__ params, const float* x, const float* w, float* y,
              int* report) {
  using namespace mw;
  GemmSmem& smem = gemm_smem();
  __shared__ SchedSlot slot;
  __shared__ int s_last;
  // The tasks read Params from shared memory: each ticket's acquire invalidates the SM's L1, so
  // global reads of it would go to L2 at every task.
  __shared__ __align__(128) Params s_params;
  for (int i = threadIdx.x; i < static_cast<int>(sizeof(Params) / 8); i += blockDim.x)
    reinterpret_cast<long long*>(&s_params)[i] = reinterpret_cast<const long long*>(params)[i];
  __syncthreads();
  const Params& p = s_params;
  if (threadIdx.x == 0) slot.ticket = -1;
  for (;;) {
    // The next ticket's atomic is issued before the finished task's release, so its round trip
    // overlaps the release's wait for the task's stores.
    if (threadIdx.x == 0) {
      const SchedTake take = sched_take(p);
      if (slot.ticket >= 0) sched_signal(p, slot);
      sched_fetch(p, take, slot);
    }
    __syncthreads();
    if (slot.ticket < 0) break;
    run_task(p, x, w, y, smem, slot.rec[REC_TYPE], slot.rec[REC_GROUP], slot.rec[REC_INDEX]);
    __syncthreads();
  }
  sched_exit(p, &s_last, report);
}
