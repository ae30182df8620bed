// The runtime parameter struct mw::Params is generated from megawino/core/abi.py into
// generated_tasks.cuh (with the scheduler's state layout, the task record, the trace row and
// the constants both sides share: BLOCK_THREADS, LANE_CHANNELS): one definition, shared
// with the host, which fills it as an int64 array.
#pragma once

#include "generated_tasks.cuh"

// Compile-time variants of the Winograd modules (megawino.gpu.nvrtc.compile_options always passes
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
// MW_GEMM_BF16X3=1 (with MW_GEMM_TF32X3=0): the TF32-grade arithmetic, three BF16 products.
#ifndef MW_GEMM_BF16X3
#define MW_GEMM_BF16X3 0
#endif
#if MW_GEMM_BF16X3 && MW_GEMM_TF32X3
#error "MW_GEMM_BF16X3 and MW_GEMM_TF32X3 are two arithmetics: set one"
#endif
// The Winograd GEMM's 3xTF32 or BF16x3 products run on the wgmma family (cuda/gemm_wgmma.cuh,
// cuda/gemm_wgmma_split.cuh) where the build targets sm_90a (NVRTC -arch=sm_90a defines
// __CUDA_ARCH_FEAT_SM90_ALL), else on the mma.sync family: every other architecture (sm_80,
// sm_86, sm_89, sm_100, and sm_90 without the "a") compiles no wgmma instruction.
// -DMW_GEMM_WGMMA=0 keeps mma.sync on sm_90a too: the GPU tests build it to check that the two
// families give the same bits on the one GPU they run on.
#ifndef MW_GEMM_WGMMA
#if (MW_GEMM_TF32X3 || MW_GEMM_BF16X3) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MW_GEMM_WGMMA 1
#else
#define MW_GEMM_WGMMA 0
#endif
#endif
#if MW_GEMM_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "MW_GEMM_WGMMA=1: the wgmma family needs the sm_90a target (-arch=sm_90a)"
#endif
// The BF16x3 warpgroup-MMA build keeps V and U as split BF16 operands (hi and lo parts, written
// by the transforms: cuda/split_operand.cuh, megawino.core.abi.split_bf16), so that its GEMM
// multiplies straight from shared memory; every other build keeps them float32.
#define MW_SPLIT_OPERANDS (MW_GEMM_BF16X3 && MW_GEMM_WGMMA)
// The non-fused module (nonfused.cu defines MW_NONFUSED_MODULE 1), whose GEMM kernel runs alone,
// keeps U in the "float32_u_paired" format (megawino.core.abi) where its GEMM is 3xTF32 on
// warpgroup MMAs: transposed, each 16 channels of a row in the A fragments' pairing order
// (paired_channel, generated), so that its GEMM copies B rows whole and each thread splits its
// own 16-byte chunks (cuda/gemm_wgmma.cuh); its ring is deeper too (cuda/gemm_config.cuh).
#ifndef MW_NONFUSED_MODULE
#define MW_NONFUSED_MODULE 0
#endif
#define MW_U_PAIRED (MW_NONFUSED_MODULE && MW_GEMM_WGMMA && MW_GEMM_TF32X3)

namespace mw {
// Tile id minus row of V and M for the tiles of ``group``: the buffers hold buffer_groups groups,
// group g in slot g mod buffer_groups (megawino.core.tasks.Layout.ring_shift).
__device__ __forceinline__ long long ring_shift(const Params& p, int group) {
  const int slots = static_cast<int>(p.buffer_groups);
  return static_cast<long long>(group / slots) * slots * p.tiles_per_group;
}

// Whether a transform loop reads the Params fields it derives addresses from again in every
// iteration (reread: a volatile load, which the compiler neither hoists nor merges), instead of
// keeping the derived values live across the loop body: the builds without wgmma (every GPU but
// sm_90a, and the FFMA build) spill those values under the megakernel's 128-register cap
// otherwise; the wgmma builds hold them without spilling, so a reread would only add loads.
constexpr bool REREAD_PARAMS = !MW_GEMM_WGMMA;
template <class T>
__device__ __forceinline__ T reread(const T& field) {
  return *static_cast<const volatile T*>(&field);
}
}  // namespace mw

// Diagnostic builds (an A/B harness's -DMW_GEMM_FREE=1|2, -DMW_TRANSFORMS_FREE; never the
// runtime's): cuda/diagnostics.cuh, included from here only.
#if defined(MW_GEMM_FREE) || defined(MW_TRANSFORMS_FREE)
#include "diagnostics.cuh"
#endif
