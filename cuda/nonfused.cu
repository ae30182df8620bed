// The non-fused path: one kernel per task type (FTrans, ITrans, GEMM, OTrans), generated from
// megawino/task_types.py into generated_nonfused.cuh from the same device functions as the
// megakernel, one task per block, launched in type order.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/nonfused.cu
// Its GEMM kernel keeps the split BF16x3 tile at 64 columns: at 128 (MW_SPLIT_WIDE, gemm.cuh) its
// build spills under the 128-register cap, where the megakernel's does not; both widths give the same bits.
#ifndef MW_SPLIT_WIDE
#define MW_SPLIT_WIDE 0
#endif
#include "generated_nonfused.cuh"
