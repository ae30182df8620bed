"""Tensor-core rate of warpgroup-MMA instruction patterns, no global memory (docs/experiments.md 62).

Each block's warpgroups loop: fence, P wgmma into a zeroed partial sum (A from registers, B from
shared memory), commit, wait, then one FADD per partial-sum register into an accumulator, the
shape of the Winograd GEMM tile's k step (cuda/gemm.cuh).  Prints the TF32 (or BF16) rate per
variant, so that the tile's ceiling at a given N, products per wait and blocks per SM is known
before a kernel is written around it.

    python3 bench/experiments/wgmma_rate.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) rate(float* out, int iters) {
  __shared__ __align__(128) float b_tile[8 * 256 * 2];
  for (int i = threadIdx.x; i < 8 * 256 * 2; i += THREADS) b_tile[i] = 0.0f;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(b_tile));
  unsigned long long desc = ((unsigned long long)((addr & 0x3FFFF) >> 4)) |
      ((unsigned long long)((128 >> 4) & 0x3FFF) << 16) | ((unsigned long long)((256 >> 4) & 0x3FFF) << 32);
  unsigned a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3;
  float acc[N / 2], part[N / 2];
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int q = 0; q < P; ++q) {
      WGMMA(q == 0 ? 0 : 1);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < N / 2; ++i) { asm volatile("" : "+f"(part[i])::"memory"); acc[i] = __fadd_rn(acc[i], part[i]); }
  }
  float s = 0.0f;
  for (int i = 0; i < N / 2; ++i) s += acc[i];
  out[blockIdx.x * THREADS + threadIdx.x] = s;
}
"""


def wgmma_macro(n: int, kind: str) -> str:
    regs = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(part[{i}])' for i in range(n // 2))
    base = n // 2
    trans = "" if kind == "tf32" else ", 0"
    if kind == "tf32":
        shape, types, k = f"m64n{n}k8", "f32.tf32.tf32", 8
    else:
        shape, types, k = f"m64n{n}k16", "f32.bf16.bf16", 16   # BF16 takes a B-transpose immediate
    return (
        "#define WGMMA(FLAG) asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %" + str(base + 5) + ", 0;\\n\""
        f" \"wgmma.mma_async.sync.aligned.{shape}.{types} {{{regs}}}, "
        f"{{%{base}, %{base + 1}, %{base + 2}, %{base + 3}}}, %{base + 4}, p, 1, 1{trans};\\n}}\\n\""
        f" : {outs} : \"r\"(a0), \"r\"(a1), \"r\"(a2), \"r\"(a3), \"l\"(desc), \"r\"(FLAG))\n"
    ), k


VARIANTS = [  # (name, kind, N, products per wait, threads, min blocks per SM, blocks per SM launched)
    ("tf32 n64 x6 (today's tile), 2x256", "tf32", 64, 6, 256, 2, 2),
    ("tf32 n64 x12, 2x256", "tf32", 64, 12, 256, 2, 2),
    ("tf32 n64 x6, 1x256", "tf32", 64, 6, 256, 1, 1),
    ("tf32 n64 x6, 1x512", "tf32", 64, 6, 512, 1, 1),
    ("tf32 n128 x6, 1x256", "tf32", 128, 6, 256, 1, 1),
    ("tf32 n128 x6, 2x256", "tf32", 128, 6, 256, 2, 2),
    ("tf32 n256 x6, 1x256", "tf32", 256, 6, 256, 1, 1),
    ("bf16 n64 x3, 2x256", "bf16", 64, 3, 256, 2, 2),
    ("bf16 n64 x6, 2x256", "bf16", 64, 6, 256, 2, 2),
    ("bf16 n128 x3, 1x256", "bf16", 128, 3, 256, 1, 1),
    ("bf16 n256 x3, 1x256", "bf16", 256, 3, 256, 1, 1),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4000)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    import cupy as cp
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    rows = []
    for name, kind, n, products, threads, min_blocks, per_sm in VARIANTS:
        macro, k = wgmma_macro(n, kind)
        code = (f"#define N {n}\n#define P {products}\n#define THREADS {threads}\n#define MIN_BLOCKS {min_blocks}\n"
                + macro + SOURCE)
        mod = cp.RawModule(code=code, options=("-arch=sm_90a", "-std=c++17"))
        fn = mod.get_function("rate")
        grid = sms * per_sm
        out = cp.empty(grid * threads, dtype=cp.float32)
        fn((grid,), (threads,), (out, cp.int32(50)))
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn((grid,), (threads,), (out, cp.int32(args.iters)))
        stop.record()
        stop.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, stop) * 1e-3
        flops = 2.0 * 64 * n * k * products * (threads // 128) * grid * args.iters
        row = {"variant": name, "kind": kind, "n": n, "products_per_wait": products, "threads": threads,
               "blocks_per_sm": per_sm, "registers": fn.num_regs, "local_bytes": fn.local_size_bytes,
               "tflops": flops / seconds / 1e12}
        rows.append(row)
        print(f"{name:40s} regs {fn.num_regs:3d} local {fn.local_size_bytes:4d}  {row['tflops']:7.1f} TFLOP/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sms": sms, "iters": args.iters, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
