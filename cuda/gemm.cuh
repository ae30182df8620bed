// GEMM task (group g, j = position * k_blocks + K block):
//   M[p][rows of g][K block] = V[p][rows of g][:] @ U[p][:][K block]
// Mirrors megawino/core/stages/gemm.py.  float32 in and out (or, for the BF16x3 wgmma build, V
// and U as split BF16 parts); the products run as 3xTF32 on the tensor cores (MW_GEMM_TF32X3=1:
// fp32-level error at tensor-core speed), as BF16x3 (MW_GEMM_BF16X3=1: TF32-grade) or as one FFMA
// chain per element (both 0).
//
// One interface, one mainloop per MMA family (docs/kernels.md):
//   wgmma     (sm_90a)   cuda/gemm_wgmma.cuh         WgmmaTf32x3Mainloop
//                        cuda/gemm_wgmma_split.cuh   WgmmaSplitBf16x3Mainloop (split operands)
//   mma.sync  (sm_80 on) cuda/gemm_mma_sync.cuh      MmaSyncTf32x3Mainloop, MmaSyncBf16x3Mainloop
//   FFMA                 cuda/gemm_ffma.cuh          FfmaMainloop
// the mma.sync and FFMA families sharing the multistage cp.async mainloop
// (cuda/gemm_multistage.cuh) with their own warp-level fragments, every family sharing the tile
// sizes, shared memory and ring of cuda/gemm_config.cuh and the split-and-accumulate operators of
// cuda/gemm_arithmetic.cuh.  A mainloop is a struct with one static function,
//   tile<ROWS, ROW_BOUND>(sm, Vp, Up, Mp, row0, col0, col_end, c_stride, k_stride, row_end): one
//     ROWS x GEMM_BN output tile, columns >= col_end (and rows >= row_end where ROW_BOUND: the
//     pointwise kernels' unpadded tensors) predicated off;
// (the split-operand one: tile<ROWS, COLS>, 64 or 128 columns, no row bound).  gemm_task covers
// a task's rows and columns with tiles.
// Every output element is one fixed reduction over k = 0 .. c_stride-1: no split-K, no atomics,
// the same bits for every mapping, the megakernel and the non-fused kernel, and (3xTF32, FFMA)
// the wgmma and mma.sync builds.
#pragma once

#include "gemm_config.cuh"
#include "gemm_ffma.cuh"
#include "gemm_mma_sync.cuh"
#include "gemm_wgmma.cuh"
#include "gemm_wgmma_split.cuh"
#include "generated_tasks.cuh"
#include "params.cuh"

namespace mw {

// Which arithmetic this build's GEMM runs, for the host to check (megawino.gpu.nvrtc.gemm_uses_wgmma).
extern "C" __device__ int mw_gemm_wgmma = MW_GEMM_WGMMA;
// Whether U is in the paired format (megawino.gpu.nvrtc.operand_format).
extern "C" __device__ int mw_u_paired = MW_U_PAIRED;

// The mainloop of GEMM tasks, and that of the pointwise kernels (the user's float32 tensors:
// the BF16x3 wgmma build's pointwise kernels take the mma.sync family).
#if MW_SPLIT_OPERANDS
using GemmMainloop = WgmmaSplitBf16x3Mainloop;
using PointwiseMainloop = MmaSyncBf16x3Mainloop;
#else
#if MW_GEMM_WGMMA
using GemmMainloop = WgmmaTf32x3Mainloop;
#elif MW_GEMM_BF16X3
using GemmMainloop = MmaSyncBf16x3Mainloop;
#elif MW_GEMM_TF32X3
using GemmMainloop = MmaSyncTf32x3Mainloop;
#else
using GemmMainloop = FfmaMainloop;
#endif
using PointwiseMainloop = GemmMainloop;
#endif

__device__ __forceinline__ void gemm_task(const Params& p, GemmSmem& sm, int group, int index) {
  const int kb = index % static_cast<int>(p.k_blocks);
  const int k0 = kb * static_cast<int>(p.gemm_k_per_task);
  const int k1 = min(static_cast<int>(p.k_stride), k0 + static_cast<int>(p.gemm_k_per_task));
  const int pos = index / static_cast<int>(p.k_blocks);
  const int tpg = static_cast<int>(p.tiles_per_group);
  const long long t0 = static_cast<long long>(group) * tpg - ring_shift(p, group);   // first row of V and M
  const int c_stride = static_cast<int>(p.c_stride), k_stride = static_cast<int>(p.k_stride);
  const float* Vp = reinterpret_cast<const float*>(p.V) + static_cast<long long>(pos) * p.buffer_tiles * c_stride;
  const float* Up = reinterpret_cast<const float*>(p.U) + static_cast<long long>(pos) * c_stride * k_stride;
  float* Mp = reinterpret_cast<float*>(p.Mbuf) + static_cast<long long>(pos) * p.buffer_tiles * k_stride;
#ifdef MW_GEMM_FREE   // a diagnostic build (cuda/diagnostics.cuh)
  return diagnostics::gemm_task_free(Vp, Mp, t0, tpg, kb, k0, k1, c_stride, k_stride);
#endif
  // 128-row tiles, then 64-row ones (tasks come in 64-row chunks); the split-operand mainloop
  // takes 128-column tiles while more than 64 columns are left.  The loops stay here, not in a
  // function of the mainloop: such a function changes how NVVM inlines and schedules the tiles.
#if MW_SPLIT_OPERANDS
  for (int col = k0; col < k1; col += k1 - col > GEMM_BN ? 2 * GEMM_BN : GEMM_BN) {
    int r = 0;
    if (k1 - col > GEMM_BN) {
      for (; r + 128 <= tpg; r += 128)
        GemmMainloop::tile<128, 2 * GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
      for (; r < tpg; r += 64) GemmMainloop::tile<64, 2 * GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    } else {
      for (; r + 128 <= tpg; r += 128) GemmMainloop::tile<128, GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
      for (; r < tpg; r += 64) GemmMainloop::tile<64, GEMM_BN>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    }
  }
#else
  for (int col = k0; col < k1; col += GEMM_BN) {
    int r = 0;
    for (; r + 128 <= tpg; r += 128) GemmMainloop::tile<128>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
    for (; r < tpg; r += 64) GemmMainloop::tile<64>(sm, Vp, Up, Mp, t0 + r, col, k1, c_stride, k_stride);
  }
#endif
}

// The non-fused GEMM kernel runs its tasks position by position, K blocks innermost, so that one
// position's filter matrix and each V row range stay in L2 while every group uses them: block b's
// task among the GEMM ids (group-major, alpha^2 * k_blocks a group: megawino.core.tasks).  Any
// bijection gives the same bits.
__device__ __forceinline__ int gemm_position_major_block(const Params& p) {
  const int k_blocks = static_cast<int>(p.k_blocks);
  const int per_group = Wino<MW_M>::ALPHA * Wino<MW_M>::ALPHA * k_blocks;
  const int groups = static_cast<int>(gridDim.x) / per_group;
  const int b = static_cast<int>(blockIdx.x);
  const int rest = b / k_blocks;
  return (rest % groups) * per_group + (rest / groups) * k_blocks + (b - rest * k_blocks);
}

}  // namespace mw
