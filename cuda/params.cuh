// The runtime parameter struct mw::Params is generated from megawino/abi.py into
// generated_tasks.cuh (with the scheduler's state layout, the task record, the trace row and
// the constants both sides share: BLOCK_THREADS, LANE_CHANNELS): one definition, shared
// with the host, which fills it as an int64 array.
#pragma once

#include "generated_tasks.cuh"

// Compile-time variants of the Winograd modules (megawino.nvrtc.compile_options always passes
// them; these defaults serve standalone nvcc builds): F(MW_M x MW_M, 3x3), NHWC or NCHW tensors,
// the GEMM's products as 3xTF32 (1) or FFMA (0).
#ifndef MW_M
#define MW_M 4
#endif
#ifndef MW_NHWC
#define MW_NHWC 0
#endif
#ifndef MW_GEMM_TF32X3
#define MW_GEMM_TF32X3 1
#endif
