#!/usr/bin/env python3
"""Probe: the GEMM and output-transform tasks of a small-C layer as one task
(bench/experiments/gemm_output.cu: M stays in shared memory), timed on the suite layers with
C <= 64 against the non-fused GEMM and output kernels of the same V and U sizes
(bench/experiments/profile_stages.py in the same device call; docs/experiments.md 118).

Checks first: x and w random, V and U from megawino.core.winograd's float64 transforms (rounded to
float32), y against a float64 direct convolution (PyTorch on the GPU), poisoned with NaN before the
run; two images of each layer and odd batch sizes.  Then CUDA-event medians at the suite's batch,
V rotated past the L2.

    python3 bench/experiments/gemm_output_probe.py --json /tmp/go.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fused_f2_probe import record_check, run_checks  # noqa: E402
TILES, CHANNELS, THREADS = 16, 32, 256
SMEM_BYTES = 36 * CHANNELS * 20 * 4


class GemmOutput:
    def __init__(self):
        import cupy
        from megawino.core.resources import cuda_dir
        self.cp = cupy
        code = (HERE / "gemm_output.cu").read_text()
        self.module = cupy.RawModule(code=code, options=("-std=c++17", f"-I{cuda_dir()}"))
        self.sms = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def __call__(self, V, Ut, y):
        N, K, out_h, out_w = y.shape
        C = V.shape[2]
        if C not in (32, 64) or K % CHANNELS or out_h % 4 or out_w % 4:
            raise ValueError(f"the probe takes C in (32, 64), K a multiple of 32, 4 | out_h, out_w; got C={C} K={K}")
        tiles_w = out_w // 4
        T = N * (out_h // 4) * tiles_w
        fn = self.module.get_function(f"gemm_output_c{C // 16}")
        fn.max_dynamic_shared_size_bytes = SMEM_BYTES
        fn((2 * self.sms,), (THREADS,), (V, Ut, y, np.int32(K), np.int32(out_h), np.int32(out_w),
                                          np.int32(tiles_w), np.int32((out_h // 4) * tiles_w), np.int64(T)),
           shared_mem=SMEM_BYTES)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="resnet50.conv2_x,vgg16.conv1_2,yolov3.res1,yolov3.res2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)

    import cupy
    import torch
    from megawino.core import winograd
    from megawino.core.spec import LayerSpec
    from megawino.gpu.timing import gpu_rel_l2, time_cuda_stats

    go = GemmOutput()
    tf = winograd.transform(4)
    rng = np.random.default_rng(0)
    result = {"argv": sys.argv[1:], "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "checks": [], "layers": []}

    def check(spec, tol=2e-6):
        x = rng.standard_normal(spec.input_shape)
        w = rng.standard_normal(spec.weight_shape)
        V = winograd.input_transform(x.transpose(0, 2, 3, 1), 1, tf, spec.out_h, spec.out_w, np.float64)
        U = winograd.filter_transform(w, tf, np.float64)
        Ut = np.ascontiguousarray(U.transpose(0, 2, 1))
        y = cupy.full(spec.output_shape, np.nan, dtype=cupy.float32)
        go(cupy.asarray(V, dtype=cupy.float32), cupy.asarray(Ut, dtype=cupy.float32), y)
        ref = torch.nn.functional.conv2d(torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda"), padding=1)
        return record_check(result, spec, gpu_rel_l2(y, cupy.asarray(ref)), tol)

    ok, specs = run_checks(check, [LayerSpec(3, 32, 64, 12, 20), LayerSpec(1, 64, 128, 8, 4),
                                   LayerSpec(5, 64, 32, 4, 8)], args.layers)
    if not ok:
        print("gemm-output probe: a check failed, no timing")
    else:
        for spec in specs:
            T = spec.N * (spec.out_h // 4) * (spec.out_w // 4)
            v_bytes = 36 * T * spec.C * 4
            sets = max(2, min(4, (8 << 30) // v_bytes))
            Vs = [cupy.asarray(rng.standard_normal((36, T, spec.C), dtype=np.float32)) for _ in range(sets)]
            Ut = cupy.asarray(rng.standard_normal((36, spec.K, spec.C), dtype=np.float32))
            y = cupy.empty(spec.output_shape, dtype=cupy.float32)
            us = time_cuda_stats(lambda V: go(V, Ut, y), Vs, reps=args.reps)["median_us"]
            traffic = v_bytes + 4 * int(np.prod(spec.output_shape))
            row = {"name": spec.name, "shape": spec.shape_string, "gemm_output_us": us, "v_sets": sets,
                   "v_plus_y_bytes": traffic, "v_plus_y_tb_per_s": traffic / us / 1e6}
            result["layers"].append(row)
            print(f"{spec.name:20} gemm+output task {us:8.1f} us  (V read once + y: {row['v_plus_y_tb_per_s']:.2f} TB/s)",
                  flush=True)
            del Vs, y
            cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
