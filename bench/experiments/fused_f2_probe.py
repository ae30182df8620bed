#!/usr/bin/env python3
"""Probe: a fused Winograd F(2x2, 3x3) kernel (bench/experiments/fused_f2.cu: V and M stay on the
SM, 3xTF32 on mma.sync) on the suite layers with C <= 64, against the megakernel and PyTorch's
fp32 and TF32 convolutions in the same run (docs/experiments.md 77, 115).

Checks first: relative L2 error against a float64 convolution (PyTorch on the GPU) on odd shapes
and on two images of each layer, outputs poisoned with NaN before each run.  Then CUDA-event
medians at the suite's batch, inputs rotated past the L2.

    python3 bench/experiments/fused_f2_probe.py --k-slice 32 --json /tmp/fused.json   # the fastest build
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import numpy as np

from megawino.core.resources import cuda_dir

HERE = pathlib.Path(__file__).resolve().parent
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
TILES = 64


def filter_slices(w: np.ndarray, k_slice: int = 16) -> np.ndarray:
    """U of weights w [K][C][3][3] as the kernel reads it: [K / k_slice][16][k_slice][C] float32."""
    K, C = w.shape[:2]
    u = np.einsum("ia,kcab,jb->ijkc", G, w.astype(np.float64), G)      # [4][4][K][C]
    u = u.reshape(16, K // k_slice, k_slice, C).transpose(1, 0, 2, 3)
    return np.ascontiguousarray(u, dtype=np.float32)


class Fused:
    def __init__(self, defines=(), cluster: bool = False, k_slice: int = 16):
        import cupy
        self.cp = cupy
        self.code = (HERE / "fused_f2.cu").read_text()
        self.k_slice, self.threads, self.blocks_per_sm = k_slice, 16 * k_slice, 32 // k_slice
        self.defines = (f"-DFUSED_K_SLICE={k_slice}", *defines)
        self.cluster = cluster
        self.functions = {}
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def function(self, K: int):
        """The kernel for K output channels: with ``cluster``, a build whose clusters have one CTA
        per K slice (FUSED_CLUSTER = K / k_slice)."""
        size = K // self.k_slice if self.cluster else 1
        if size not in self.functions:
            mod = self.cp.RawModule(code=self.code, options=("-std=c++17", f"-I{cuda_dir()}", f"-DFUSED_CLUSTER={size}",
                                                             *self.defines))
            fn = mod.get_function("fused_f2")
            fn.max_dynamic_shared_size_bytes = self.smem_bytes(64)
            self.functions[size] = (mod, fn)
        return self.functions[size][1]

    def smem_bytes(self, C: int) -> int:
        """U slice, then a chunk's V (rows of 64 tiles padded to 72) or, over it, half a strip's M,
        then the strip's tile table (two 64-bit offsets and a 32-bit mask a tile)."""
        return 4 * (16 * self.k_slice * C + max(16 * 8 * (TILES + 8), 16 * self.k_slice * TILES // 2)) + TILES * 20

    def check_shape(self, N, C, K, H, W):
        if C % 32 or C > 64 or K % self.k_slice or max(C, K) * H * W >= 2 ** 31:
            raise ValueError(f"the fused probe takes C in (32, 64) and K a multiple of {self.k_slice}, got C={C} K={K}")
        if self.cluster and (8 % (K // self.k_slice) or self.blocks_per_sm * self.sms % (K // self.k_slice)):
            raise ValueError(f"the cluster build takes K / {self.k_slice} in (1, 2, 4, 8), got K={K}")

    def __call__(self, x, u, y):
        N, C, H, W = x.shape
        K = y.shape[1]
        self.check_shape(N, C, K, H, W)
        smem = self.smem_bytes(C)
        self.function(K)((self.blocks_per_sm * self.sms,), (self.threads,), (x, u, y, np.int32(N), np.int32(C), np.int32(K), np.int32(H), np.int32(W)),
                shared_mem=smem)


def record_check(result: dict, spec, err: float, tol: float) -> bool:
    """Whether a check's relative L2 error against float64 is finite and under ``tol``, recorded in
    ``result`` and printed."""
    ok = bool(math.isfinite(err) and err < tol)
    result["checks"].append({"shape": spec.shape_string, "rel_l2_vs_f64": err, "ok": ok})
    print(f"check {spec.shape_string:28} rel. L2 vs float64 {err:.2e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def run_checks(check, odd_shapes, layers: str):
    """(ok, specs): the suite layers ``layers`` names, and whether ``check`` passed on every odd
    shape and on each of those layers at batch 2 (all run, so every result is recorded)."""
    from megawino.core.suite import load_suite, select_specs
    ok = all([check(shape) for shape in odd_shapes])
    specs = select_specs(load_suite(suite="winograd", batch=64), layers)
    for spec in specs:
        ok &= check(spec.with_(N=2))
    return ok, specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="resnet50.conv2_x,vgg16.conv1_2,yolov3.res1,yolov3.res2")
    ap.add_argument("--define", action="append", default=[], help="a -D option for fused_f2.cu (repeatable)")
    ap.add_argument("--cluster", action="store_true", help="one CTA a K slice, clusters sharing V")
    ap.add_argument("--k-slice", type=int, default=16, choices=(16, 32), help="output channels a block")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)

    import cupy
    import torch
    from megawino import runtime
    from megawino.core.spec import LayerSpec
    from megawino.gpu.timing import gpu_rel_l2, rotated_inputs, time_cuda_stats

    fused = Fused(args.define, args.cluster, args.k_slice)
    T = lambda a: torch.as_tensor(a, device="cuda")   # noqa: E731 (zero-copy view of a CuPy array)
    rng = np.random.default_rng(0)
    result = {"argv": sys.argv[1:], "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "checks": [], "layers": []}

    def check(spec, tol=3e-6):
        x = rng.standard_normal(spec.input_shape, dtype=np.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=np.float32)
        y = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)
        fused(cupy.asarray(x), cupy.asarray(filter_slices(w, fused.k_slice)), y)
        ref = torch.nn.functional.conv2d(torch.as_tensor(x, device="cuda").double(),
                                         torch.as_tensor(w, device="cuda").double(), padding=1)
        err = gpu_rel_l2(y, cupy.asarray(ref))   # a zero-copy view of PyTorch's float64 output
        return record_check(result, spec, err, tol)

    ok, specs = run_checks(check, [LayerSpec(3, 32, 64, 11, 13), LayerSpec(1, 64, 128, 7, 5),
                                   LayerSpec(2, 64, 32, 2, 3)], args.layers)
    if not ok:
        print("fused probe: a check failed, no timing")
    else:
        torch.backends.cudnn.benchmark = True
        for spec in specs:
            xs, w = rotated_inputs(spec, rng)
            u = cupy.asarray(filter_slices(cupy.asnumpy(w), fused.k_slice))
            y = cupy.empty(spec.output_shape, dtype=cupy.float32)
            row = {"name": spec.name, "shape": spec.shape_string}
            row["fused_us"] = time_cuda_stats(lambda x: fused(x, u, y), xs,
                                              reps=args.reps)["median_us"]
            plan = runtime.plan(spec)
            row["megakernel_us"] = time_cuda_stats(lambda x: plan(x, w, out=y, check=False), xs, reps=args.reps,
                                                   check=plan.check)["median_us"]
            tw = T(w)
            for name, tf32, fmt in (("torch_fp32", False, torch.contiguous_format),
                                    ("torch_tf32_nchw", True, torch.contiguous_format),
                                    ("torch_tf32_nhwc", True, torch.channels_last)):
                torch.backends.cudnn.allow_tf32 = tf32
                txs = [T(x).contiguous(memory_format=fmt) for x in xs]
                wf = tw.contiguous(memory_format=fmt)
                with torch.no_grad():
                    row[f"{name}_us"] = time_cuda_stats(lambda x: torch.nn.functional.conv2d(x, wf, padding=1), txs,
                                                        reps=args.reps)["median_us"]
            torch.backends.cudnn.allow_tf32 = True
            row["torch_tf32_us"] = min(row["torch_tf32_nchw_us"], row["torch_tf32_nhwc_us"])
            for key in ("megakernel", "torch_fp32", "torch_tf32"):
                row[f"x_{key}"] = row[f"{key}_us"] / row["fused_us"]
            result["layers"].append(row)
            print(f"{spec.name:20} fused {row['fused_us']:8.1f} us  megakernel {row['megakernel_us']:8.1f}  "
                  f"PyTorch fp32 {row['torch_fp32_us']:8.1f}  TF32 {row['torch_tf32_us']:8.1f}  "
                  f"x megakernel {row['x_megakernel']:.2f}  x TF32 {row['x_torch_tf32']:.2f}", flush=True)
            del xs, txs, y
            cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
