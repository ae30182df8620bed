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

// The entry point mw_direct_conv, its arguments in megawino.core.abi.DIRECT_KERNEL_ARGS order
// (megawino.direct.kernel.launch passes them so).
#include "generated_direct.cuh"
