// The pointwise path: a 1x1, stride-1, unpadded convolution is one GEMM per image, run on the
// Winograd GEMM's tiles (cuda/gemm.cuh PointwiseMainloop) straight on the user's tensors, planned by
// megawino/direct/pointwise.py:
//   NCHW: y[n] [K][H W] = w [K][C] @ x[n] [C][H W]   (rows K, columns H W, batch N)
//   NHWC: y [N H W][K]  = x [N H W][C] @ wt [C][K]   (rows N H W, columns K, batch 1)
// Block (row tile, column tile, batch index); rows past `rows` and columns past `cols` are
// predicated off, so no operand needs padding.
// Builds standalone:  nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/pointwise.cu
#include "gemm.cuh"

namespace mw {

template <int ROWS>
__device__ __forceinline__ void pointwise_tile(const float* a, const float* b, float* y, int rows, int cols,
                                               int channels, long long a_batch, long long b_batch,
                                               long long y_batch) {
  GemmSmem& smem = gemm_smem();
  const long long batch = blockIdx.z;
  const long long row0 = static_cast<long long>(blockIdx.x) * ROWS;
  const int col0 = static_cast<int>(blockIdx.y) * GEMM_BN;
  PointwiseMainloop::tile<ROWS, true>(smem, a + batch * a_batch, b + batch * b_batch, y + batch * y_batch, row0, col0,
                                     cols, channels, cols, rows);
}

}  // namespace mw

// Two row-tile heights, so that layers with 64 output rows do not compute a padded half tile.
extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS, 2)
mw_pointwise_128(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int rows,
                 int cols, int channels, long long a_batch, long long b_batch, long long y_batch) {
  mw::pointwise_tile<128>(a, b, y, rows, cols, channels, a_batch, b_batch, y_batch);
}

extern "C" __global__ void __launch_bounds__(mw::BLOCK_THREADS, 2)
mw_pointwise_64(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y, int rows,
                int cols, int channels, long long a_batch, long long b_batch, long long y_batch) {
  mw::pointwise_tile<64>(a, b, y, rows, cols, channels, a_batch, b_batch, y_batch);
}
