"""The pointwise path on the models' 1x1 layers (GPU): every 1x1 stride-1 convolution of the
models of bench/models.py, timed as megawino's ``pointwise`` plan (prepared weights), the direct
path, and PyTorch's cuDNN convolution in IEEE fp32 and in its default TF32 (``cudnn.benchmark``
on), median of CUDA-event timings in one process, with each path's relative L2 error against a
float64 product on the GPU.

    python3 bench/pointwise.py --json bench/results/h100-pointwise.json
    python3 bench/pointwise.py --models resnet50 --batches 64

Per model and batch it prints the layer table and the sums over the model's layers (each shape
weighted by how many layers have it): the share of 1x1 time the pointwise path would save.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from common import geomean, git_commit, json_clean, set_fp32_precision  # noqa: E402
from models import MODELS, build_model  # noqa: E402

DEFAULT_BATCHES = {"resnet50": (1, 64), "densenet161": (16,), "yolov3": (1, 16)}


def pointwise_shapes(name: str) -> collections.Counter:
    """(C, K, H, W) -> number of the model's 1x1 stride-1 unpadded convolutions of that shape,
    from one batch-1 forward with hooks."""
    import torch
    model = build_model(name).eval().cuda()
    resolution = MODELS[name][1]
    shapes = collections.Counter()

    def hook(module, args, _output):
        if module.kernel_size == (1, 1) and module.stride == (1, 1) and module.padding == (0, 0):
            _, c, h, w = args[0].shape
            shapes[(c, module.out_channels, h, w)] += 1

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.inference_mode():
        model(torch.randn(1, 3, resolution, resolution, device="cuda"))
    for handle in handles:
        handle.remove()
    return shapes


def bench_shape(n, c, k, h, w, reps: int) -> dict:
    import cupy as cp
    import numpy as np
    import torch
    import torch.nn.functional as F
    from megawino import LayerSpec, runtime
    from megawino.direct.pointwise import check_pointwise
    from megawino.gpu.timing import gpu_rel_l2, rotated_inputs, time_cuda
    spec = LayerSpec(n, c, k, h, w, 1, 1, 1, 0)
    row = {"shape": spec.shape_string, "N": n, "C": c, "K": k, "H": h, "W": w}
    try:
        check_pointwise(spec)
    except ValueError as err:
        row["skipped"] = str(err)
        return row
    rng = np.random.default_rng(0)
    xs, wd = rotated_inputs(spec, rng, budget_bytes=1 << 30)
    xs = [x + 0.25 for x in xs]
    out = cp.empty(spec.output_shape, dtype=cp.float32)
    ref = cp.einsum("kc,nchw->nkhw", wd.reshape(k, c).astype(cp.float64), xs[0].astype(cp.float64))
    wt = torch.from_dlpack(wd)
    for algo in ("pointwise", "direct"):
        p = runtime.plan(spec, algo=algo)
        p(xs[0], wd, out=out, weight_token=("bench", algo))
        row[f"{algo}_err"] = gpu_rel_l2(out, ref)
        row[f"{algo}_us"] = time_cuda(lambda x, p=p, algo=algo: p(x, wd, out=out, weight_token=("bench", algo)),
                                      xs, reps=reps)
    for label, precision in (("cudnn_fp32", "ieee"), ("cudnn_tf32", "tf32")):
        set_fp32_precision(precision)
        xts = [torch.from_dlpack(x) for x in xs]
        row[f"{label}_err"] = gpu_rel_l2(cp.from_dlpack(F.conv2d(xts[0], wt)), ref)
        row[f"{label}_us"] = time_cuda(lambda x: F.conv2d(x, wt), xts, reps=reps)
    set_fp32_precision("ieee")
    return row


def print_table(rows, totals):
    from rich.console import Console
    from rich.table import Table
    table = Table(title="1x1 stride-1 layers: pointwise path vs cuDNN (us, median)")
    for col in ("model", "batch", "shape", "layers", "pointwise", "direct", "cuDNN fp32", "cuDNN TF32",
                "vs fp32", "err pointwise", "err fp32"):
        table.add_column(col, justify="right")
    for r in rows:
        if "skipped" in r:
            table.add_row(r["model"], str(r["batch"]), r["shape"], str(r["layers"]), "skipped", "", "", "", "", "", "")
            continue
        table.add_row(r["model"], str(r["batch"]), r["shape"], str(r["layers"]), f"{r['pointwise_us']:.1f}",
                      f"{r['direct_us']:.1f}", f"{r['cudnn_fp32_us']:.1f}", f"{r['cudnn_tf32_us']:.1f}",
                      f"{r['cudnn_fp32_us'] / r['pointwise_us']:.2f}", f"{r['pointwise_err']:.1e}",
                      f"{r['cudnn_fp32_err']:.1e}")
    Console().print(table)
    for t in totals:
        print(f"{t['model']} b{t['batch']}: 1x1 time pointwise {t['pointwise_us']:.0f} us vs cuDNN fp32 "
              f"{t['cudnn_fp32_us']:.0f} us (x{t['ratio']:.2f}; best-of per layer x{t['best_of_ratio']:.2f}); "
              f"geomean per shape x{t['geomean']:.2f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_BATCHES), help="comma-separated model names")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default: per model)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    for name in names:
        if name not in MODELS:
            ap.error(f"unknown model {name!r} (choose from {', '.join(MODELS)})")
    import torch
    torch.backends.cudnn.benchmark = True
    rows, totals = [], []
    for name in names:
        shapes = pointwise_shapes(name)
        batches = [int(b) for b in args.batches.split(",")] if args.batches else DEFAULT_BATCHES.get(name, (16,))
        for batch in batches:
            model_rows = []
            for (c, k, h, w), count in sorted(shapes.items()):
                row = {"model": name, "batch": batch, "layers": count, **bench_shape(batch, c, k, h, w, args.reps)}
                model_rows.append(row)
            timed = [r for r in model_rows if "skipped" not in r]
            if timed:
                ours = sum(r["layers"] * r["pointwise_us"] for r in timed)
                theirs = sum(r["layers"] * r["cudnn_fp32_us"] for r in timed)
                best = sum(r["layers"] * min(r["pointwise_us"], r["cudnn_fp32_us"]) for r in timed)
                totals.append({"model": name, "batch": batch, "pointwise_us": ours, "cudnn_fp32_us": theirs,
                               "ratio": theirs / ours, "best_of_ratio": theirs / best,
                               "geomean": geomean(r["cudnn_fp32_us"] / r["pointwise_us"] for r in timed)})
            rows += model_rows
    print_table(rows, totals)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_clean({"git_commit": git_commit(BENCH_DIR.parent), "gpu": torch.cuda.get_device_name(),
                                                    "rows": rows, "totals": totals}), indent=1))


if __name__ == "__main__":
    main()
