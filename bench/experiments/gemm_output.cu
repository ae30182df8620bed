// Probe (docs/experiments.md 118): the GEMM and output-transform tasks of a small-C layer as one
// task, so that M never leaves the SM.  A task is (16 tiles, 32 output channels): for each of the
// 36 positions one warp multiplies V[p][16 tiles][C] by U^T[p][32 channels][C] as 3xTF32 on
// mma.sync m16n8k8 (the megakernel GEMM tile's fragment order, split and 16-term partial sums, so
// M has the GEMM task's bits), parks the 16 x 32 products in shared memory, and after a block
// barrier every thread transforms two (tile, channel) pairs with the output task's
// output_tile_values and stores them to NCHW y.  V and U are read straight from global memory
// (a position's A and B fragments are two and four float4 a k tile), U transposed ([36][K][C]) so
// that a B fragment is one float4.  Persistent blocks, two an SM (the megakernel's residency).
// Compiles with -I at megawino's cuda folder.
#include "gemm.cuh"
#include "output_transform.cuh"

namespace {

constexpr int GO_TILES = 16;                    // one m16 block of tiles
constexpr int GO_CHANNELS = 32;                 // four n8 blocks of output channels
constexpr int GO_PAIR_STRIDE = 20;              // tiles of one channel in shared memory, padded
constexpr int GO_POSITION = GO_CHANNELS * GO_PAIR_STRIDE;
constexpr int GO_NT = GO_CHANNELS / 8;

__device__ __forceinline__ float4 load_or_zero(const float* p, bool valid) {
  return valid ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0.f, 0.f, 0.f, 0.f);
}

}  // namespace

// C_TILES: C / 16 (C = c_stride, a multiple of 16).  tiles_h * tiles_w tiles an image; y is NCHW
// with out_h, out_w multiples of 4 (the probe's shapes).
template <int C_TILES>
__device__ __forceinline__ void gemm_output_kernel(const float* __restrict__ V, const float* __restrict__ Ut,
                                                   float* __restrict__ y, int K, int out_h, int out_w,
                                                   int tiles_w, int tiles_per_image, long long T) {
  using namespace mw;
  extern __shared__ __align__(16) float go_smem[];
  constexpr int C = 16 * C_TILES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int k_blocks = K / GO_CHANNELS;
  const long long groups = (T + GO_TILES - 1) / GO_TILES;
  const long long tasks = groups * k_blocks;
  for (long long task = blockIdx.x; task < tasks; task += gridDim.x) {
    const long long row0 = (task / k_blocks) * GO_TILES;
    const int k0 = static_cast<int>(task % k_blocks) * GO_CHANNELS;
    const bool row_g = row0 + g < T, row_g8 = row0 + g + 8 < T;
    for (int p = warp; p < 36; p += BLOCK_THREADS / 32) {
      const float* Vp = V + (static_cast<long long>(p) * T + row0) * C + 4 * t4;
      const float* Up = Ut + (static_cast<long long>(p) * K + k0) * C + 4 * t4;
      float acc[GO_NT][4];
#pragma unroll
      for (int nt = 0; nt < GO_NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
#pragma unroll
      for (int kt = 0; kt < C_TILES; ++kt) {
        const float4 a0 = load_or_zero(Vp + g * C + 16 * kt, row_g);
        const float4 a8 = load_or_zero(Vp + (g + 8) * C + 16 * kt, row_g8);
        float4 b[GO_NT];
#pragma unroll
        for (int nt = 0; nt < GO_NT; ++nt) b[nt] = __ldg(reinterpret_cast<const float4*>(Up + (8 * nt + g) * C + 16 * kt));
        float part[GO_NT][4];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          unsigned a_big[1][4], a_small[1][4], b_big[GO_NT][2], b_small[GO_NT][2];
          split_a_step(a0, a8, q, a_big[0], a_small[0]);
#pragma unroll
          for (int nt = 0; nt < GO_NT; ++nt) {
            split_tf32(q == 0 ? b[nt].x : b[nt].z, b_big[nt][0], b_small[nt][0]);
            split_tf32(q == 0 ? b[nt].y : b[nt].w, b_big[nt][1], b_small[nt][1]);
          }
          if (q == 0) three_products<true>(part, a_big, a_small, b_big, b_small, mma_tf32, mma_tf32_zero);
          else three_products<false>(part, a_big, a_small, b_big, b_small, mma_tf32, mma_tf32_zero);
        }
#pragma unroll
        for (int nt = 0; nt < GO_NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[nt][e] = __fadd_rn(acc[nt][e], part[nt][e]);
      }
      float* Mp = go_smem + p * GO_POSITION;
#pragma unroll
      for (int nt = 0; nt < GO_NT; ++nt) {
        const int ch = 8 * nt + 2 * t4;
        Mp[ch * GO_PAIR_STRIDE + g] = acc[nt][0];
        Mp[(ch + 1) * GO_PAIR_STRIDE + g] = acc[nt][1];
        Mp[ch * GO_PAIR_STRIDE + g + 8] = acc[nt][2];
        Mp[(ch + 1) * GO_PAIR_STRIDE + g + 8] = acc[nt][3];
      }
    }
    __syncthreads();
    for (int pair = threadIdx.x; pair < GO_TILES * GO_CHANNELS; pair += BLOCK_THREADS) {
      const int ch = pair / GO_TILES, tile = pair % GO_TILES;
      const long long t = row0 + tile;
      if (t < T) {
        float mm[36], o[16];
#pragma unroll
        for (int q = 0; q < 36; ++q) mm[q] = go_smem[q * GO_POSITION + ch * GO_PAIR_STRIDE + tile];
        output_tile_values<4>(mm, o);
        const int n = static_cast<int>(t / tiles_per_image), r = static_cast<int>(t % tiles_per_image);
        const int oy0 = (r / tiles_w) * 4, ox0 = (r % tiles_w) * 4;
        float* dst = y + ((static_cast<long long>(n) * K + k0 + ch) * out_h + oy0) * out_w + ox0;
#pragma unroll
        for (int i = 0; i < 4; ++i)
          *reinterpret_cast<float4*>(dst + i * out_w) = make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
      }
    }
    __syncthreads();
  }
}

#define GO_KERNEL(C_TILES)                                                                                  \
  extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS, 2)                                       \
      gemm_output_c##C_TILES(const float* V, const float* Ut, float* y, int K, int out_h, int out_w,        \
                             int tiles_w, int tiles_per_image, long long T) {                              \
    gemm_output_kernel<C_TILES>(V, Ut, y, K, out_h, out_w, tiles_w, tiles_per_image, T);                    \
  }
GO_KERNEL(2)
GO_KERNEL(4)

// The shared memory a block takes.
constexpr int GO_SMEM_BYTES = 36 * GO_POSITION * sizeof(float);
static_assert(GO_SMEM_BYTES <= 113 * 1024, "two blocks an SM");
