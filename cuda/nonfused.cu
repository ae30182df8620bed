// The non-fused path: one kernel per task type (FTrans, ITrans, GEMM, OTrans), generated from
// megawino/task_types.py into generated_nonfused.cuh from the same device functions as the
// megakernel, one task per block, launched in type order.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/nonfused.cu
// The GEMM kernel here runs alone, so its warpgroup-MMA ring may take the shared memory that the
// megakernel leaves to the L1 for its transforms: 4 stages instead of 3 (the same bits).
#ifndef MW_WGMMA_STAGES
#define MW_WGMMA_STAGES 4
#endif
#include "generated_nonfused.cuh"
