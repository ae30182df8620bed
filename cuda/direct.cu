// Direct-convolution kernel entry point, one instantiation per compile.
// The tile parameters are compile-time constants passed as -D defines by
// megawino/direct/config.py (defaults below so that the file compiles standalone:
//   nvcc -arch=sm_90 -cubin -Xptxas -v -I cuda cuda/direct.cu).
#include "direct_conv.cuh"

#ifndef MW_DIRECT_BM
#define MW_DIRECT_BM 128
#endif
#ifndef MW_DIRECT_BN
#define MW_DIRECT_BN 128
#endif
#ifndef MW_DIRECT_BK
#define MW_DIRECT_BK 8
#endif
#ifndef MW_DIRECT_TM
#define MW_DIRECT_TM 8
#endif
#ifndef MW_DIRECT_TN
#define MW_DIRECT_TN 8
#endif
#ifndef MW_DIRECT_NHWC
#define MW_DIRECT_NHWC 0
#endif
#ifndef MW_DIRECT_MINBLOCKS
#define MW_DIRECT_MINBLOCKS 1
#endif
#ifndef MW_SOURCE_HASH
#define MW_SOURCE_HASH none
#endif

using MwDirectTile = mw_direct::Tile<MW_DIRECT_BM, MW_DIRECT_BN, MW_DIRECT_BK, MW_DIRECT_TM,
                                     MW_DIRECT_TN, MW_DIRECT_NHWC != 0>;

// Scalar arguments (not a struct) so that CuPy can pass them: pointers as CuPy
// arrays, every int as numpy.int32, in exactly this order (megawino.direct.launch).
extern "C" __global__ void __launch_bounds__(MwDirectTile::THREADS, MW_DIRECT_MINBLOCKS)
mw_direct_conv(const float* __restrict__ x, const float* __restrict__ wt,
               const int2* __restrict__ table, float* __restrict__ y,
               int C, int H, int W, int K, int R, int S, int OH, int OW, int M, int stride, int pad,
               int ktiles, int ldw, int vec_x) {
    mw_direct::Params p;
    p.x = x; p.wt = wt; p.table = table; p.y = y;
    p.C = C; p.H = H; p.W = W; p.K = K; p.R = R; p.S = S;
    p.OH = OH; p.OW = OW; p.M = M;
    p.stride = stride; p.pad = pad;
    p.ktiles = ktiles; p.ldw = ldw; p.vec_x = vec_x;
    mw_direct::conv_block<MW_DIRECT_BM, MW_DIRECT_BN, MW_DIRECT_BK, MW_DIRECT_TM, MW_DIRECT_TN,
                          MW_DIRECT_NHWC != 0>(p);
}
