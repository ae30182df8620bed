// The non-fused path: one kernel per task type (FTrans, ITrans, GEMM, OTrans), generated from
// megawino/task_types.py into generated_nonfused.cuh from the same device functions as the
// megakernel, one task per block, launched in type order.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/nonfused.cu
// Its GEMM kernel runs alone, so its warpgroup-MMA ring may take the shared memory the
// megakernel leaves to the L1 (4 stages instead of 3), and its U is in the paired format, whose B
// rows the GEMM copies whole (params.cuh MW_NONFUSED_MODULE); the bits are the megakernel's.
#define MW_NONFUSED_MODULE 1
#include "generated_nonfused.cuh"
