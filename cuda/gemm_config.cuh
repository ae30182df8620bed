// What every GEMM mainloop shares (cuda/gemm.cuh): the tile sizes, the block's shared memory
// (GemmSmem, which the megakernel's transforms reuse as scratch), what the host reads of it, and
// the cp.async ring.  Block tile 128 rows x 64 columns (64-row chunks take a 64 x 64 tile; the
// split BF16x3 tile up to 128 columns), 256 threads, a ring of 16-byte copies (L1 bypassed: .cg)
// of GEMM_STAGES k tiles of GEMM_BK, or WGMMA_STAGES of WGMMA_BK for the warpgroup-MMA tiles.
#pragma once

#include "generated_tasks.cuh"
#include "params.cuh"
#include "ptx.cuh"

namespace mw {

constexpr int GEMM_BM = 128;
constexpr int GEMM_BN = GEMM_TILE_COLS;
constexpr int GEMM_BK = 16;
constexpr int GEMM_STAGES = 3;
constexpr bool U_PAIRED = MW_U_PAIRED;   // for pragmas, which take no macros

static_assert(GEMM_BLOCK_ROWS % 64 == 0, "GEMM tasks come in 64-row chunks");
static_assert(CHANNEL_ALIGN % 4 == 0 && K_ALIGN % 4 == 0, "16-byte copies need 4-float alignment");
static_assert(GEMM_BK * GEMM_BN / 4 == BLOCK_THREADS, "one B chunk per thread");

#if MW_GEMM_WGMMA
// The warpgroup-MMA tile's ring: WGMMA_BK k per stage (GEMM_BK-term sub-tiles, each summed on its
// own as in the mma.sync tile), so that a block meets at its barriers once per 32 k.  The
// non-fused module's GEMM kernel runs alone, so its ring may take the shared memory the
// megakernel leaves to the L1: 4 stages instead of 3.
constexpr int WGMMA_BK = 32;
constexpr int WGMMA_STAGES = MW_NONFUSED_MODULE ? 4 : 3;
#endif

// Shared memory of the GEMM tile: 3 stages of padded 128-row A and 16 x 64 B (B rows of 72
// floats under 3xTF32, whose unpadded stages need less), so that the block's shared-memory
// footprint, and with it the L1 / shared split the kernels are tuned under, is that of the padded
// layouts.
// The warpgroup-MMA tile: the split B of a stage (big and small parts) the tensor cores read,
// then its WGMMA_STAGES stages, A and B each, so that tiles of fewer k tiles than stages touch
// only the first stages (mw_gemm_smem_bytes_by_k_tiles).
// The split-operand tile (MW_SPLIT_OPERANDS): SPLIT_STAGES stages of hi and lo parts of 128 x
// WGMMA_BK A and 64 x WGMMA_BK B in BF16; its build's pointwise kernels run the mma.sync tile.
constexpr int MMA_SYNC_SMEM_FLOATS =
    GEMM_STAGES * (GEMM_BM * (GEMM_BK + 4) + GEMM_BK * (GEMM_BN + (MW_GEMM_TF32X3 || MW_GEMM_BF16X3 ? 8 : 0)));
#if MW_SPLIT_OPERANDS
constexpr int SPLIT_STAGES = 4;
constexpr int SPLIT_STAGE_FLOATS = (GEMM_BM + GEMM_BN) * WGMMA_BK;   // two BF16 parts per float
#endif
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
// The split B buffer: both parts of a stage, or (MW_U_PAIRED) the small parts only, the big ones
// going over the stage.
constexpr int WGMMA_SPLIT_FLOATS = (MW_U_PAIRED ? 1 : 2) * WGMMA_BK * GEMM_BN;
constexpr int WGMMA_STAGE_FLOATS = GEMM_BM * WGMMA_BK + WGMMA_BK * GEMM_BN;
#endif
struct GemmSmem {
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
  float floats[WGMMA_SPLIT_FLOATS + WGMMA_STAGES * WGMMA_STAGE_FLOATS];
#elif MW_SPLIT_OPERANDS
  // + 512 bytes: the split tile's stages start 512-byte aligned (their swizzle).
  float floats[SPLIT_STAGES * SPLIT_STAGE_FLOATS + 128 > MMA_SYNC_SMEM_FLOATS ? SPLIT_STAGES * SPLIT_STAGE_FLOATS + 128
                                                                               : MMA_SYNC_SMEM_FLOATS];
#else
  float floats[MMA_SYNC_SMEM_FLOATS];
#endif
};

// The kernels that run GEMM tiles keep GemmSmem in dynamic shared memory (the wgmma tile's is
// over the 48 KB a static array may take); every launch passes mw_gemm_smem_bytes
// (megawino.gpu.nvrtc.GemmSmemKernel).
extern "C" __device__ int mw_gemm_smem_bytes = static_cast<int>(sizeof(GemmSmem));

// The transforms' scratch (their sbuf: alpha^2 floats a thread), which the megakernel's take from
// GemmSmem.
constexpr int TRANSFORM_SCRATCH_FLOATS = (MW_M + 2) * (MW_M + 2) * BLOCK_THREADS;
static_assert(TRANSFORM_SCRATCH_FLOATS * sizeof(float) <= sizeof(GemmSmem),
              "the megakernel's transforms keep alpha^2 floats per thread in the GEMM's shared memory");
// The shared memory a launch needs whose GEMM tiles have k_tiles k tiles of mw_gemm_k_per_tile
// (c_stride / k per tile, rounded up; entry min(k_tiles, 4) - 1): the 3xTF32 warpgroup-MMA ring
// touches only the stages its tiles fill, and what a launch does not take is the L1's
// (megawino.gpu.nvrtc.gemm_smem_bytes); every other tile takes all of GemmSmem.
__host__ __device__ constexpr int gemm_smem_bytes_for(int k_tiles) {
#if MW_GEMM_WGMMA && MW_GEMM_TF32X3
  if (k_tiles >= WGMMA_STAGES) return static_cast<int>(sizeof(GemmSmem));
  const int ring = WGMMA_SPLIT_FLOATS + k_tiles * WGMMA_STAGE_FLOATS;
  return static_cast<int>(sizeof(float)) * (ring > TRANSFORM_SCRATCH_FLOATS ? ring : TRANSFORM_SCRATCH_FLOATS);
#else
  (void)k_tiles;
  return static_cast<int>(sizeof(GemmSmem));
#endif
}
// The ring's k per stage and its depth (the non-fused module's may be deeper than the megakernel's).
#if MW_GEMM_WGMMA
extern "C" __device__ int mw_gemm_k_per_tile = WGMMA_BK;
extern "C" __device__ int mw_gemm_stages = WGMMA_STAGES;
#else
extern "C" __device__ int mw_gemm_k_per_tile = GEMM_BK;
extern "C" __device__ int mw_gemm_stages = GEMM_STAGES;
#endif
extern "C" __device__ int mw_gemm_smem_bytes_by_k_tiles[4] = {gemm_smem_bytes_for(1), gemm_smem_bytes_for(2),
                                                             gemm_smem_bytes_for(3), gemm_smem_bytes_for(4)};
__device__ __forceinline__ GemmSmem& gemm_smem() {
#if MW_U_PAIRED
  // The paired build's swizzled stages start 1024-byte aligned (the 128-byte swizzle's period).
  extern __shared__ __align__(1024) unsigned char mw_dynamic_smem[];
#else
  extern __shared__ __align__(128) unsigned char mw_dynamic_smem[];
#endif
  return *reinterpret_cast<GemmSmem*>(mw_dynamic_smem);
}

// The cp.async ring every mainloop runs (STAGES deep): stages 0 .. STAGES - 2 in flight first,
// then per k tile: wait for it, one barrier (stage kt visible to all, the stage the next copy
// overwrites no longer read), prepare(stage), the copy STAGES - 1 tiles ahead, and
// multiply(stage).  prepare runs before the copy is issued because a fence in it would wait for
// that copy.
template <int STAGES, class LoadStage, class Prepare, class Multiply>
__device__ __forceinline__ void cp_async_pipeline(int k_tiles, LoadStage load_stage, Prepare prepare,
                                                  Multiply multiply) {
  // Rolled in the paired build, whose registers its 4-stage ring needs.
#pragma unroll(U_PAIRED ? 1 : STAGES - 1)
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int stage = kt % STAGES;
    prepare(stage);
    const int nk = kt + STAGES - 1;
    if (nk < k_tiles) load_stage(nk, nk % STAGES);
    cp_async_commit();
    multiply(stage);
  }
  cp_async_wait<0>();
  __syncthreads();   // shared memory free for the next tile / task
}

}  // namespace mw
