// The persistent Winograd megakernel: every block loops taking tickets
// (scheduler.cuh) and running the task's device function.
// Compile-time variants: MW_M (2 or 4), MW_NHWC (0 or 1), MW_TRACE (defined or not);
// MW_STAGED_NCHW (off by default) selects the shared-memory-staged NCHW transforms,
// measured slower in the megakernel (bench/NOTES.md, experiment 2).
// Layer sizes are runtime parameters (params.cuh), so one build serves every layer.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/megakernel.cu
// Block shape (bench/NOTES.md experiments 4-6): MW_MEGA_MIN_BLOCKS resident blocks of 256 threads
// per SM.  1: up to 255 registers, so the transforms use the header defaults (CW 32,
// 2 channels per thread, as the non-fused kernels) without spills.  2 (default; 1 measured slower on the
// big layers, NOTES.md experiment 6): the 128-register cap, under
// which 2 channels per thread spill, so one channel per thread (input CW 32, output CW 8).
// Same arithmetic per element either way, so the results stay bitwise equal.
#ifndef MW_MEGA_MIN_BLOCKS
#define MW_MEGA_MIN_BLOCKS 2
#endif
// MW_MEGA_XFORM_SMEM (bit mask, default 2 at 2 blocks/SM; bench/NOTES.md experiments 8-9): the
// transforms use the GEMM's shared memory (free during a transform task) to fit the 128-register
// cap without spills.  Bit 1 (default), output: 2 channels per thread, CW 32, like the non-fused
// kernel; all 36 float2 M loads first, then the second channel parked in per-thread shared-memory
// slots (measured 7-13% faster megakernel on vgg16.conv1_2 / yolov3.res1 / resnet50.conv2_x).
// Bit 0 (opt-in, measured no gain): input one channel per thread (CW 32), results transposed
// through a per-warp shared buffer and V written as 16-byte stores.  A clear bit: the
// register-only CPT 1 transform below.
#ifndef MW_MEGA_XFORM_SMEM
#define MW_MEGA_XFORM_SMEM (MW_MEGA_MIN_BLOCKS >= 2 ? 2 : 0)
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
#else
#ifndef MW_GEMM_W_KUNROLL
#define MW_GEMM_W_KUNROLL 8   // wide GEMM tile's k loop fully unrolled (registers to spare)
#endif
#endif
#include "generated_tasks.cuh"
#include "params.cuh"
#include "scheduler.cuh"
#include "filter_transform.cuh"
#include "input_transform.cuh"
#include "gemm.cuh"
#include "output_transform.cuh"

#ifndef MW_M
#define MW_M 4
#endif
#ifndef MW_NHWC
#define MW_NHWC 0
#endif

static_assert(sizeof(mw::GemmSmem) >= sizeof(float) * mw::StageSize<MW_M>::value,
              "the staged transforms reuse the GEMM's shared memory");
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
#if MW_MEGA_XFORM_SMEM
      case TASK_INPUT:
        if constexpr ((MW_MEGA_XFORM_SMEM & 1) != 0)
          input_transform_task_xpose<MW_M, MW_NHWC != 0, BLOCK_THREADS>(p, x, group, index,
                                                                         reinterpret_cast<float*>(&smem));
        else
          input_transform_default<MW_M, MW_NHWC != 0>(p, x, group, index);
        break;
      case TASK_OUTPUT:
        if constexpr ((MW_MEGA_XFORM_SMEM & 2) != 0)
          output_transform_task_cpt2s<MW_M, MW_NHWC != 0, 32, BLOCK_THREADS>(p, y, group, index,
                                                                             reinterpret_cast<float*>(&smem));
        else
          output_transform_default<MW_M, MW_NHWC != 0>(p, y, group, index);
        break;
#elif MW_NHWC || !defined(MW_STAGED_NCHW)
      case TASK_INPUT: input_transform_default<MW_M, MW_NHWC != 0>(p, x, group, index); break;
      case TASK_OUTPUT: output_transform_default<MW_M, MW_NHWC != 0>(p, y, group, index); break;
#else
      case TASK_INPUT:
        input_transform_task_staged<MW_M>(p, x, group, index, reinterpret_cast<float*>(&smem));
        break;
      case TASK_OUTPUT:
        output_transform_task_staged<MW_M>(p, y, group, index, reinterpret_cast<float*>(&smem));
        break;
#endif
      case TASK_GEMM: gemm_task(p, smem, group, index); break;
      default: break;
    }
    __syncthreads();
    if (threadIdx.x == 0) sched_signal(p, slot);
  }
  sched_exit(p, &s_last);
}
