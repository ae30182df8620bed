"""cuBLAS on the Winograd GEMM stage's batched shapes (alpha2 x (tiles x C)(C x K), the heuristic's
padding) through torch.bmm, TF32 off and on, operands rotated so that the L2 holds none of them:
CUDA-event medians, TFLOP/s of the fp32 GEMM, and a sample's error against float64 (which says
TF32 was on). Beside bench/compare.py's GEMM columns, it gives what NVIDIA's own library does per
tensor-core product on these shapes.

    python3 bench/experiments/cublas_tf32_gemm.py --json /tmp/tf32.json
"""
import argparse
import json
import sys
from pathlib import Path

try:
    import megawino  # noqa: F401
except ImportError:       # run from a checkout without installing
    sys.path.append(str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layers (default: all)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch
    from megawino.core.suite import load_suite, select_specs
    from megawino.core.task_sizes import default_params
    from megawino.core.tasks import Layout
    from megawino.gpu.timing import rotation_sets
    rows = []
    for spec in select_specs(load_suite(suite="winograd", batch=None), args.layers):
        lay = Layout(spec, default_params(spec))
        a2, tp, cs, ks = lay.alpha2, lay.tiles_padded, lay.c_stride, lay.k_stride
        sets = rotation_sets(4 * a2 * (tp * cs + cs * ks + tp * ks), min_sets=1, budget_bytes=4 << 30)
        gen = torch.Generator(device="cuda").manual_seed(0)
        ops = [(torch.randn(a2, tp, cs, device="cuda", generator=gen), torch.randn(a2, cs, ks, device="cuda", generator=gen),
                torch.empty(a2, tp, ks, device="cuda")) for _ in range(sets)]
        row = {"layer": spec.name, "C": spec.C, "alpha2": a2, "tiles_padded": tp, "c_stride": cs, "k_stride": ks, "sets": sets}
        for name, tf32 in (("sgemm", False), ("tf32", True)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for i in range(3):
                torch.bmm(ops[i % sets][0], ops[i % sets][1], out=ops[i % sets][2])
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps)]
            for i in range(args.reps):
                a, b, c = ops[i % sets]
                starts[i].record()
                torch.bmm(a, b, out=c)
                ends[i].record()
            torch.cuda.synchronize()
            times = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))
            a, b, c = ops[0]
            torch.bmm(a, b, out=c)
            n = min(tp, 1024)
            ref = a[0, :n].double() @ b[0].double()
            row[f"{name}_us"] = times[len(times) // 2]
            row[f"{name}_tflops"] = 2 * a2 * tp * cs * ks / row[f"{name}_us"] / 1e6
            row[f"{name}_rel_err"] = float((c[0, :n].double() - ref).norm() / ref.norm())
        torch.backends.cuda.matmul.allow_tf32 = False
        rows.append(row)
        print(json.dumps(row), flush=True)
        del ops
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
