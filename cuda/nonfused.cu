// The non-fused path: one kernel per task type (FTrans, ITrans, GEMM, OTrans), generated from
// megawino/task_types.py into generated_nonfused.cuh from the same device functions as the
// megakernel, one task per block, launched in type order.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/nonfused.cu
#include "generated_nonfused.cuh"
