"""Timing table of the 18 'winograd' suite layers (batch 64 by default): megakernel
vs own non-fused path, and the GEMM stage alone (the non-fused GEMM kernel).

    PYTHONPATH=$PWD python3 bench/experiments/gpu_timing.py [--batch 64] [--reps 20]

Median of CUDA-event timings after warm-up; random normal inputs; accuracy of the
megakernel checked against cuDNN float32 (TF32 off) through PyTorch when present.
Prints one line per layer and writes JSON to --json if given.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path


import megawino  # noqa: E402
from megawino.core import suite  # noqa: E402
from megawino.core.tasks import TaskType  # noqa: E402
from megawino.gpu.timing import time_cuda  # noqa: E402


def events_median(fn, warmup=3, reps=20):
    """Median microseconds of ``fn()``: megawino.gpu.timing's method (CUDA events, queued
    behind a spin kernel); the inputs are the caller's (no rotation here)."""
    return time_cuda(lambda _: fn(), [None], warmup, reps)


def baseline_best(path):
    """layer short name (e.g. 'resnet50.conv2') -> best fp32 us, from baseline-h100.md."""
    best = {}
    try:
        text = Path(path).read_text()
    except OSError:
        return best
    for line in text.splitlines():
        m = re.match(r"\|\s*(\S+) \(.*\*\*(\d+)\*\*", line)
        if m:
            best[m.group(1)] = float(m.group(2))
    return best


def short(name):
    name = name.replace("_x", "").replace("block", "b")
    return name


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", default="")
    ap.add_argument("--baseline", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--torch-check", action="store_true")
    ap.add_argument("--layout", default="NCHW", choices=("NCHW", "NHWC"))
    args = ap.parse_args(argv)
    import cupy as cp
    specs = suite.select_specs(suite.load_suite(suite="winograd", batch=args.batch, layout=args.layout),
                               args.layers)
    best = baseline_best(args.baseline) if args.baseline else {}
    rows = []
    rng = cp.random.default_rng(0)
    for spec in specs:
        x = rng.standard_normal(spec.input_shape, dtype=cp.float32)
        w = rng.standard_normal(spec.weight_shape, dtype=cp.float32)
        y = cp.empty(spec.output_shape, dtype=cp.float32)
        mega = megawino.plan(spec)
        nf = megawino.plan(spec, algo="nonfused")
        mega(x, w, out=y)
        y_nf = nf(x, w)
        same = bool((y_nf == y).all())
        t_mega = events_median(lambda: mega(x, w, out=y, check=False), reps=args.reps)
        mega.check()
        t_nf = events_median(lambda: nf(x, w, out=y_nf, check=False), reps=args.reps)
        t_gemm = events_median(lambda: nf.launch_stage(TaskType.GEMM), reps=args.reps)
        stage_us = {}
        for t, arr in ((TaskType.FILTER, w), (TaskType.INPUT, x), (TaskType.OUTPUT, y_nf)):
            stage_us[t.name] = events_median(lambda: nf.launch_stage(t, arr), reps=max(5, args.reps // 2))
        lay = mega.task_layout
        gemm_flop = 2 * lay.alpha2 * lay.tiles_padded * lay.c_stride * lay.k_stride
        err = None
        if args.torch_check:
            try:
                import torch
                torch.backends.cudnn.allow_tf32 = False
                xt = torch.from_dlpack(x).double()
                wt = torch.from_dlpack(w).double()
                ref = torch.nn.functional.conv2d(xt, wt, padding=spec.padding)
                yt = torch.from_dlpack(y).double()
                err = float(torch.linalg.norm(yt - ref) / torch.linalg.norm(ref))
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}"
        b = best.get(short(spec.name))
        row = dict(layer=spec.name, mega_us=t_mega, nonfused_us=t_nf, gemm_us=t_gemm,
                   gemm_tflops=gemm_flop / t_gemm / 1e6, direct_tflops=spec.direct_flops / t_mega / 1e6,
                   filter_us=stage_us["FILTER"], input_us=stage_us["INPUT"], output_us=stage_us["OUTPUT"],
                   cudnn_best_us=b, speedup_vs_cudnn=(b / t_mega if b else None), bitwise_equal=same,
                   grid=mega.workers, blocks_per_sm=mega.blocks_per_sm, tasks=mega.graph.num_tasks,
                   tiles_per_group=mega.params.tiles_per_group, rel_l2_vs_fp64=err)
        rows.append(row)
        print(f"{spec.name:22s} mega {t_mega:8.1f} us  nonf {t_nf:8.1f} us (F {stage_us['FILTER']:6.1f} "
              f"I {stage_us['INPUT']:7.1f} G {t_gemm:7.1f} O {stage_us['OUTPUT']:7.1f})  "
              f"GEMM {row['gemm_tflops']:5.1f} TF/s  cuDNN {b or float('nan'):6.0f} us "
              f"x{(row['speedup_vs_cudnn'] or float('nan')):.2f}  bitwise={same} err={err}", flush=True)
        del mega, nf, x, w, y, y_nf
        cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n| layer | megakernel us | non-fused us | GEMM us | GEMM TFLOP/s | cuDNN best us | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        sp = f"{r['speedup_vs_cudnn']:.2f}" if r["speedup_vs_cudnn"] else "-"
        print(f"| {r['layer']} | {r['mega_us']:.1f} | {r['nonfused_us']:.1f} | {r['gemm_us']:.1f} | "
              f"{r['gemm_tflops']:.1f} | {r['cudnn_best_us'] or '-'} | {sp} |")
    g = [r["gemm_tflops"] for r in rows]
    print(f"GEMM TFLOP/s: median {statistics.median(g):.1f}, max {max(g):.1f}")


if __name__ == "__main__":
    main()
