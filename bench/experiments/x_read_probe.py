"""Where the input transform's second read of x comes from (docs/experiments.md 86): three probe
kernels on one layer's x (NCHW float32), to run under ncu for their DRAM bytes:

* ``stream``: every float of x read once, coalesced (the floor: x's size);
* ``windows``: the NCHW input task's loads exactly (cuda/input_transform.cuh input_transform_nchw:
  a warp item is 2 tiles x 16 channel planes per pass, 6 rows of a float4 and two scalars each,
  128 tiles x C channels a block, channel groups outermost), summed into one float per item;
* ``windows_stores``: the same plus the task's V stores (36 floats a tile and channel, written as
  the transform writes them), so that their traffic runs through the L2 beside the loads.

    ncu --metrics dram__bytes_read.sum,dram__bytes_write.sum python3 bench/experiments/x_read_probe.py
"""
import argparse

import numpy as np

SOURCE = r"""
extern "C" __global__ void stream(const float4* x, long long n4, float* out) {
  float s = 0.f;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
    const float4 v = __ldg(x + i);
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 1234.5f) out[0] = s;   // keeps the loads
}

template <bool STORE>
__device__ void windows(const float* x, float* V, float* out, int C, int H, int W, int tiles_w, int per_image,
                        long long tiles, int tiles_per_block) {
  const int lane = threadIdx.x & 31, s = lane >> 4, k = lane & 15;
  const int npair = tiles_per_block / 2, ncg = (C + 31) / 32;
  const long long t_base = (long long)blockIdx.x * tiles_per_block;
  const long long plane = tiles * C;
  for (int wi = threadIdx.x >> 5; wi < npair * ncg; wi += blockDim.x / 32) {
    const int cg = wi / npair, tp = wi - cg * npair;
    const long long t = t_base + 2 * tp + s;
    if (t >= tiles) continue;
    const int n = (int)(t / per_image), rest = (int)(t - (long long)n * per_image);
    const int th = rest / tiles_w, tw = rest - th * tiles_w;
    const int r0 = 4 * th - 1, q0 = 4 * tw - 1;
    float acc = 0.f;
    for (int pass = 0; pass < 2; ++pass) {
      const int c = cg * 32 + 16 * pass + k;
      if (c >= C) continue;
      const float* base = x + (((long long)n * C + c) * H + r0) * W + q0;
      float d[36];
#pragma unroll
      for (int i = 0; i < 6; ++i) {
        const bool row_ok = (unsigned)(r0 + i) < (unsigned)H;
        const float* row = base + (long long)i * W;
        const float4 mid = row_ok ? __ldg(reinterpret_cast<const float4*>(row + 1)) : make_float4(0.f, 0.f, 0.f, 0.f);
        d[6 * i + 0] = row_ok && q0 >= 0 ? __ldg(row) : 0.f;
        d[6 * i + 1] = mid.x; d[6 * i + 2] = mid.y; d[6 * i + 3] = mid.z; d[6 * i + 4] = mid.w;
        d[6 * i + 5] = row_ok && q0 + 5 < W ? __ldg(row + 5) : 0.f;
      }
#pragma unroll
      for (int q = 0; q < 36; ++q) {
        acc += d[q];
        if (STORE) V[q * plane + t * C + c] = d[q];
      }
    }
    if (acc == 1234.5f) out[0] = acc;
  }
}
extern "C" __global__ void windows_loads(const float* x, float* V, float* out, int C, int H, int W, int tiles_w,
                                         int per_image, long long tiles, int tiles_per_block) {
  windows<false>(x, V, out, C, H, W, tiles_w, per_image, tiles, tiles_per_block);
}
extern "C" __global__ void windows_stores(const float* x, float* V, float* out, int C, int H, int W, int tiles_w,
                                          int per_image, long long tiles, int tiles_per_block) {
  windows<true>(x, V, out, C, H, W, tiles_w, per_image, tiles, tiles_per_block);
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="64,64,224,224", help="N,C,H,W of x (default vgg16.conv1_2's)")
    ap.add_argument("--tiles-per-block", type=int, default=128)
    ap.add_argument("--blocks-per-sm", type=int, default=2,
                    help="resident blocks per SM, held there by unused shared memory (the input kernel's 2)")
    args = ap.parse_args()
    import cupy as cp
    n, c, h, w = (int(v) for v in args.shape.split(","))
    if h % 4 or w % 4:
        raise ValueError("the probe takes H and W that are multiples of 4 (whole F(4x4) tiles, float4 rows)")
    x = cp.random.default_rng(0).standard_normal((n, c, h, w), dtype=cp.float32)
    tiles_h, tiles_w = h // 4, w // 4
    tiles = n * tiles_h * tiles_w
    out = cp.zeros(1, cp.float32)
    mod = cp.RawModule(code=SOURCE, options=("--std=c++17",), name_expressions=None)
    mod.get_function("stream")((1056,), (256,), (x, np.int64(x.size // 4), out))
    blocks = (tiles + args.tiles_per_block - 1) // args.tiles_per_block
    targs = (np.int32(c), np.int32(h), np.int32(w), np.int32(tiles_w), np.int32(tiles_h * tiles_w),
             np.int64(tiles), np.int32(args.tiles_per_block))
    smem = (228 * 1024) // args.blocks_per_sm - 2048   # a third block per SM would not fit
    kernels = {name: mod.get_function(name) for name in ("windows_loads", "windows_stores")}
    for kernel in kernels.values():
        kernel.max_dynamic_shared_size_bytes = smem
    kernels["windows_loads"]((blocks,), (256,), (x, out, out) + targs, shared_mem=smem)
    V = cp.empty((36, tiles, c), cp.float32)
    kernels["windows_stores"]((blocks,), (256,), (x, V, out) + targs, shared_mem=smem)
    cp.cuda.Device().synchronize()
    print(f"x {x.nbytes / 1e9:.2f} GB, V {V.nbytes / 1e9:.2f} GB, {blocks} blocks of {args.tiles_per_block} tiles")


if __name__ == "__main__":
    main()
