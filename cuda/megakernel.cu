// The persistent Winograd megakernel: every block loops taking tickets
// (scheduler.cuh) and running the task's device function.
// Compile-time variants: MW_M (2 or 4), MW_NHWC (0 or 1), MW_TRACE (defined or not).
// Layer sizes are runtime parameters (params.cuh), so one build serves every layer.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/megakernel.cu
// Block shape (bench/NOTES.md experiments 4-6): MW_MEGA_MIN_BLOCKS resident blocks of 256 threads
// per SM.  1: up to 255 registers, so the transforms use the header defaults (CW 32,
// 2 channels per thread, as the non-fused kernels) without spills.  2 (default; 1 measured slower on the
// big layers, NOTES.md experiment 6): the 128-register cap, under which 2 channels per thread in
// registers spill, so the input transform takes one channel per thread (CW 32) and the output
// transform parks its second channel in shared memory (MW_MEGA_OUT_PARK below).
// Same arithmetic per element either way, so the results stay bitwise equal.
#ifndef MW_MEGA_MIN_BLOCKS
#define MW_MEGA_MIN_BLOCKS 2
#endif
// MW_MEGA_OUT_PARK (default 1 at 2 blocks/SM, else 0; bench/NOTES.md experiments 8-9): the output
// transform uses the GEMM's shared memory (free during a transform task) to fit the 128-register
// cap without spills: 2 channels per thread, CW 32, like the non-fused kernel; all 36 float2 M
// loads first, then the second channel parked in per-thread shared-memory slots
// (output_transform_task_cpt2s; measured 7-13% faster megakernel on vgg16.conv1_2 / yolov3.res1 /
// resnet50.conv2_x).  0: the register-only output_transform_default (MW_OUT_CPT / MW_OUT_CW).
#ifndef MW_MEGA_OUT_PARK
#define MW_MEGA_OUT_PARK (MW_MEGA_MIN_BLOCKS >= 2 ? 1 : 0)
#endif
// MW_MEGA_INPUT_LANES (default 1; bench/NOTES.md experiment 18): 1 = NCHW input loads with a warp
// = 2 adjacent tiles x 16 channels (about half the 128-byte lines per warp load instruction),
// two passes per 32 channels, pass A parked in a per-warp shared transpose buffer, V stored as
// whole lines (input_transform_task_lanes).  NHWC unchanged.  0: input_transform_default.
#ifndef MW_MEGA_INPUT_LANES
#define MW_MEGA_INPUT_LANES 1
#endif
#if MW_MEGA_MIN_BLOCKS >= 2
#ifndef MW_IN_CPT
#define MW_IN_CPT 1
#endif
#ifndef MW_OUT_CPT
#define MW_OUT_CPT 1
#endif
#ifndef MW_OUT_CW
#define MW_OUT_CW 8
#endif
#endif
#include "generated_tasks.cuh"
#include "params.cuh"
#include "scheduler.cuh"
#include "filter_transform.cuh"
#include "input_transform.cuh"
#include "gemm.cuh"
#include "output_transform.cuh"

static_assert(sizeof(mw::GemmSmem) >= sizeof(float) * (MW_M + 2) * (MW_M + 2) * mw::BLOCK_THREADS,
              "the megakernel transforms keep alpha^2 floats per thread in the GEMM's shared memory");

extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS, MW_MEGA_MIN_BLOCKS)
mw_megakernel(const mw::Params* __restrict__ params, const float* x, const float* w, float* y) {
  using namespace mw;
  __shared__ __align__(16) GemmSmem smem;
  __shared__ SchedSlot slot;
  __shared__ int s_last;
  const Params& p = *params;
  for (;;) {
    if (threadIdx.x == 0) sched_fetch(p, slot);
    __syncthreads();
    if (slot.ticket < 0) break;
    const int type = slot.rec[REC_TYPE], group = slot.rec[REC_GROUP], index = slot.rec[REC_INDEX];
    switch (type) {
      case TASK_FILTER: filter_transform_task<MW_M>(p, w, index); break;
#if MW_MEGA_INPUT_LANES
      case TASK_INPUT:
        input_transform_mega_lanes<MW_M, MW_NHWC != 0, BLOCK_THREADS>(p, x, group, index,
                                                                      reinterpret_cast<float*>(&smem));
        break;
#else
      case TASK_INPUT: input_transform_default<MW_M, MW_NHWC != 0>(p, x, group, index); break;
#endif
#if MW_MEGA_OUT_PARK
      case TASK_OUTPUT:
        output_transform_task_cpt2s<MW_M, MW_NHWC != 0, 32, BLOCK_THREADS>(p, y, group, index,
                                                                           reinterpret_cast<float*>(&smem));
        break;
#else
      case TASK_OUTPUT: output_transform_default<MW_M, MW_NHWC != 0>(p, y, group, index); break;
#endif
      case TASK_GEMM: gemm_task(p, smem, group, index); break;
      default: break;
    }
    __syncthreads();
    if (threadIdx.x == 0) sched_signal(p, slot);
  }
  sched_exit(p, &s_last);
}
