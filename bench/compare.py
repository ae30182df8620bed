#!/usr/bin/env python3
"""Side by side on one GPU, in one process: megawino's megakernel and non-fused path,
cuDNN float32 through PyTorch (NCHW and channels_last), PyTorch's default TF32 convolution
(the same two layouts), cuDNN's legacy algorithms WINOGRAD_NONFUSED and FFT_TILING through
ctypes, and the Winograd GEMM stage alone against cuBLAS SGEMM.

    python bench/compare.py [--suite winograd|direct] [--batch N] [--layers a,b]
                            [--reps R] [--out bench/results/<gpu>/compare.json] [--quick]

Every backend of every layer is guarded: a failure marks that column "n/a: why"
and the run goes on; the JSON is rewritten after every layer. See docs/benchmarks.md.
This file is the command line, the derived numbers, the table and the JSON; the
device-side runner (:class:`Bench`) is in compare_backends.py.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

if os.environ.get("CUPY_TF32", "0") != "0":       # must happen before CuPy is imported
    print(f"compare.py: CUPY_TF32={os.environ['CUPY_TF32']!r} overridden to 0", file=sys.stderr)
os.environ["CUPY_TF32"] = "0"

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import compare_backends  # noqa: E402
from common import (CUDNN_ALGOS, find_loaded_library, geomean, json_clean, layer_record, median,  # noqa: E402
                    ratio, results_path, short_error, tflops)
from compare_gemm import TF32X3_PEAK_TFLOPS  # noqa: E402
from megawino.gpu.nvrtc import DEFAULT_GEMM_MATH, GEMM_MATHS  # noqa: E402

# The device side is compare_backends.py; these stay reachable as compare.<name>.
NotAvailable, _entry_for = compare_backends.NotAvailable, compare_backends._entry_for

PRIMARY = {"winograd": "megakernel", "direct": "direct"}
DEFAULT_BACKENDS = ("ours", "prepared", "other_layout", "nonfused", "cudnn", "cudnn_tf32", "legacy", "gemm")
# Opt-in: the warp-specialized GEMM prototype (sm_90a) and PyTorch's TF32 bmm on the GEMM's shape.
BACKENDS = DEFAULT_BACKENDS + ("gemm_ws", "gemm_tf32")
TOLERANCE = 1e-4     # rel. L2 vs cuDNN float32 above which a layer is flagged


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=tuple(PRIMARY), default="winograd")
    p.add_argument("--batch", type=int, default=None, help="override N (default: the suite file's)")
    p.add_argument("--layers", default=None, help="comma-separated layer names (default: all)")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions (default 20; 5 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls first (default 5; 2 with --quick)")
    p.add_argument("--out", default=None,
                   help="JSON results file (folder is created; default bench/results/<gpu>/compare.json, "
                        "compare-direct.json for --suite direct)")
    p.add_argument("--quick", action="store_true", help="5 reps, first 4 layers")
    p.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW",
                   help="layout of megawino's input and output (cuDNN runs both anyway)")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help=f"subset of {','.join(BACKENDS)}")
    p.add_argument("--legacy-algos", default="winograd_nonfused,fft_tiling",
                   help=f"cuDNN legacy algorithms via ctypes (of {','.join(CUDNN_ALGOS)})")
    p.add_argument("--f64-layers", type=int, default=2,
                   help="first layers also checked against a float64 CPU direct conv (image 0)")
    p.add_argument("--suite-file", default=None, metavar="PATH",
                   help="a suite file (layers.json format; default: the suite shipped in megawino/data, or $MEGAWINO_SUITE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol", type=float, default=TOLERANCE)
    p.add_argument("--gemm-math", choices=tuple(GEMM_MATHS), default=DEFAULT_GEMM_MATH,
                   help="the Winograd GEMM's arithmetic for the megakernel and non-fused path "
                        f"(default {DEFAULT_GEMM_MATH})")
    args = p.parse_args(argv)
    if args.batch is not None and args.batch < 1:
        p.error("--batch must be >= 1")
    args.reps = args.reps if args.reps is not None else (5 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    if args.reps < 1 or args.warmup < 0:
        p.error("--reps must be >= 1 and --warmup >= 0")
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in args.backends if b not in BACKENDS]
    if bad:
        p.error(f"unknown backend(s) {bad}; choose from {','.join(BACKENDS)}")
    args.legacy_algos = [a.strip() for a in args.legacy_algos.split(",") if a.strip()]
    bad = [a for a in args.legacy_algos if a not in CUDNN_ALGOS]
    if bad:
        p.error(f"unknown cuDNN algorithm(s) {bad}; choose from {','.join(CUDNN_ALGOS)}")
    args.layer_names = [n.strip() for n in args.layers.split(",") if n.strip()] if args.layers else None
    return args


def select_specs(specs: list, names: list[str] | None, quick: bool) -> list:
    """Layers by exact name or unique substring (:func:`megawino.suite.select_specs`);
    --quick without names: the first 4."""
    from megawino.core.suite import select_specs as by_name
    if names:
        return by_name(specs, names)
    return specs[:4] if quick else list(specs)


# ---------------------------------------------------------------------------
# Pure: derived numbers, summary, table rows (CPU-tested)
# ---------------------------------------------------------------------------

def _us(entry) -> float | None:
    if isinstance(entry, dict) and entry.get("status") == "ok":
        return entry.get("median_us")
    return None


def _fastest(backends: dict, keys) -> tuple[str | None, dict]:
    """The fastest timed column of ``keys`` and every timed one's median µs."""
    present = {k: _us(backends.get(k)) for k in keys}
    present = {k: v for k, v in present.items() if v is not None}
    return (min(present, key=present.get) if present else None), present


def derive(layer: dict, primary: str) -> dict:
    """Ratios and TFLOP/s of one layer record (its ``backends`` hold median_us).  The TF32
    column's error is against cuDNN fp32, which is float64's to within fp32's 1e-6."""
    b = layer.get("backends", {})
    ours, nonfused = _us(b.get(primary)), _us(b.get("nonfused"))
    prepared = _us(b.get(primary + "_prepared"))
    other_layout = _us(b.get(primary + "_other_layout"))
    either_layout = min((t for t in (ours, other_layout) if t is not None), default=None)
    legacy_cols = {k: _us(v) for k, v in b.items()         # a wrong output does not count
                   if k.startswith("cudnn_legacy_") and (v or {}).get("correct") is not False}
    best_key, present = _fastest(b, ("cudnn_nchw", "cudnn_nhwc"))
    tf32_key, tf32 = _fastest(b, ("cudnn_tf32_nchw", "cudnn_tf32_nhwc"))
    every = {**present, **{k: v for k, v in legacy_cols.items() if v is not None}}
    any_key = min(every, key=every.get) if every else None
    flops = layer.get("direct_flops")
    g_ours, g_cublas = _us(b.get("gemm_ours")), _us(b.get("gemm_cublas"))
    gflops = (layer.get("gemm") or {}).get("flops")
    useful = (layer.get("gemm") or {}).get("useful_flops")
    return {
        "ours_us": ours,
        "cudnn_best_us": present.get(best_key), "cudnn_best_from": best_key,
        "cudnn_best_any_us": every.get(any_key), "cudnn_best_any_from": any_key,
        "ratio_cudnn_best_over_ours": ratio(present.get(best_key), ours),
        "ratio_cudnn_best_any_over_ours": ratio(every.get(any_key), ours),
        "ratio_nonfused_over_ours": ratio(nonfused, ours),
        "cudnn_tf32_us": tf32.get(tf32_key), "cudnn_tf32_from": tf32_key,
        "cudnn_tf32_rel_err": (b.get(tf32_key) or {}).get("rel_err_vs_cudnn") if tf32_key else None,
        "ratio_cudnn_tf32_over_ours": ratio(tf32.get(tf32_key), ours),
        "ours_prepared_us": prepared,
        "ratio_cudnn_best_any_over_ours_prepared": ratio(every.get(any_key), prepared),
        "ratio_cudnn_tf32_over_ours_prepared": ratio(tf32.get(tf32_key), prepared),
        "ours_other_layout_us": other_layout,
        "ours_either_layout_us": either_layout,
        "ratio_cudnn_best_any_over_ours_either_layout": ratio(every.get(any_key), either_layout),
        "ratio_cudnn_tf32_over_ours_either_layout": ratio(tf32.get(tf32_key), either_layout),
        "tflops_ours": tflops(flops, ours),
        "tflops_nonfused": tflops(flops, nonfused),
        "tflops_cudnn_best": tflops(flops, present.get(best_key)),
        "gemm_tflops_ours": tflops(gflops, g_ours),
        "gemm_tflops_cublas": tflops(gflops, g_cublas),
        "gemm_efficiency_vs_cublas": ratio(g_cublas, g_ours),
        # The GEMM stage against the 3xTF32 tensor peak (useful multiply-adds: tiles x C x K).
        **{f"gemm_{k}_fraction_of_3xtf32_peak": ratio(tflops(useful, _us(b.get(key))), TF32X3_PEAK_TFLOPS)
           for k, key in (("ours", "gemm_ours"), ("ws", "gemm_ws"), ("cublas", "gemm_cublas"), ("cublas_tf32", "gemm_cublas_tf32"))},
    }


def build_summary(layers: list[dict], primary: str, tol: float = TOLERANCE) -> dict:
    """Suite-level numbers from per-layer records (each with ``derived``)."""
    d = [l.get("derived") or derive(l, primary) for l in layers]
    beats = [l["name"] for l, x in zip(layers, d)
             if x["ratio_nonfused_over_ours"] is not None and x["ratio_nonfused_over_ours"] > 1]
    both = sum(x["ratio_nonfused_over_ours"] is not None for x in d)
    tf32_ratios = [x.get("ratio_cudnn_tf32_over_ours") for x in d]
    tf32_errs = [e for e in (x.get("cudnn_tf32_rel_err") for x in d)
                 if isinstance(e, (int, float)) and math.isfinite(e)]
    errs = {l["name"]: (l.get("backends", {}).get(primary) or {}).get("rel_err_vs_cudnn") for l in layers}
    finite = {k: v for k, v in errs.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    bad = [k for k, v in errs.items()
           if isinstance(v, (int, float)) and not (math.isfinite(v) and v <= tol)]
    na: dict[str, int] = {}
    for l in layers:
        for key, entry in l.get("backends", {}).items():
            if not (isinstance(entry, dict) and entry.get("status") == "ok"):
                na[key] = na.get(key, 0) + 1
    return {
        "primary": primary,
        "layers": len(layers),
        "layers_timed": sum(x["ours_us"] is not None for x in d),
        f"{primary}_beats_nonfused": {"count": len(beats), "of": both, "layers": beats},
        f"geomean_cudnn_best_over_{primary}": geomean(x["ratio_cudnn_best_over_ours"] for x in d),
        f"geomean_cudnn_best_any_over_{primary}": geomean(x["ratio_cudnn_best_any_over_ours"] for x in d),
        f"geomean_nonfused_over_{primary}": geomean(x["ratio_nonfused_over_ours"] for x in d),
        f"geomean_cudnn_tf32_over_{primary}": geomean(tf32_ratios),
        f"geomean_cudnn_best_any_over_{primary}_prepared": geomean(
            x.get("ratio_cudnn_best_any_over_ours_prepared") for x in d),
        f"geomean_cudnn_tf32_over_{primary}_prepared": geomean(x.get("ratio_cudnn_tf32_over_ours_prepared") for x in d),
        f"geomean_cudnn_best_any_over_{primary}_either_layout": geomean(
            x.get("ratio_cudnn_best_any_over_ours_either_layout") for x in d),
        f"geomean_cudnn_tf32_over_{primary}_either_layout": geomean(
            x.get("ratio_cudnn_tf32_over_ours_either_layout") for x in d),
        f"{primary}_beats_cudnn_tf32": {"count": sum(r is not None and r > 1 for r in tf32_ratios),
                                         "of": sum(r is not None for r in tf32_ratios)},
        "max_cudnn_tf32_rel_err": max(tf32_errs) if tf32_errs else None,
        "median_gemm_efficiency_vs_cublas": median(x["gemm_efficiency_vs_cublas"] for x in d
                                                   if x["gemm_efficiency_vs_cublas"] is not None),
        "max_rel_err_vs_cudnn": max(finite.values()) if finite else None,
        "layers_over_tolerance": bad,
        "tolerance": tol,
        "not_ok_counts": na,
    }


def _ms(us):
    return "n/a" if us is None else f"{us / 1e3:.3f}"


def _num(v, fmt="{:.2f}"):
    return "n/a" if v is None else fmt.format(v)


TABLE_COLUMNS = ("layer", "ours ms", "nonfused ms", "cuDNN best ms", "wino-nf ms", "ours TF/s",
                 "cuDNN TF/s", "cudnn/ours", "any/ours", "nf/ours", "GEMM TF/s", "cuBLAS TF/s",
                 "GEMM eff", "rel err", "TF32 ms", "tf32/ours", "TF32 err", "prepared ms", "tf32/prep",
                 "other layout ms", "tf32/either")


def table_rows(layers: list[dict], primary: str) -> list[list[str]]:
    """Rows (strings) for TABLE_COLUMNS, then a geomean row."""
    rows, cols = [], {k: [] for k in ("ours_us", "nonfused", "cudnn_best_us", "wino", "tflops_ours",
                                     "tflops_cudnn_best", "ratio_cudnn_best_over_ours",
                                     "ratio_cudnn_best_any_over_ours", "ratio_nonfused_over_ours",
                                     "gemm_tflops_ours", "gemm_tflops_cublas",
                                     "gemm_efficiency_vs_cublas", "err", "cudnn_tf32_us",
                                     "ratio_cudnn_tf32_over_ours", "cudnn_tf32_rel_err", "ours_prepared_us",
                                     "ratio_cudnn_tf32_over_ours_prepared", "ours_other_layout_us",
                                     "ratio_cudnn_tf32_over_ours_either_layout")}
    for l in layers:
        b, x = l.get("backends", {}), l.get("derived") or derive(l, primary)
        vals = dict({k: None for k in cols}, **x, nonfused=_us(b.get("nonfused")),   # None: an older record
                    wino=_us(b.get("cudnn_legacy_winograd_nonfused")),
                    err=(b.get(primary) or {}).get("rel_err_vs_cudnn"))
        for k in cols:
            v = vals.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v):
                cols[k].append(v)
        err = vals["err"]
        best = _ms(x["cudnn_best_us"]) + (f" ({x['cudnn_best_from'][6:]})" if x["cudnn_best_from"] else "")
        rows.append([l["name"], _ms(x["ours_us"]), _ms(vals["nonfused"]), best, _ms(vals["wino"]),
                     _num(x["tflops_ours"]), _num(x["tflops_cudnn_best"]),
                     _num(x["ratio_cudnn_best_over_ours"]), _num(x["ratio_cudnn_best_any_over_ours"]),
                     _num(x["ratio_nonfused_over_ours"]), _num(x["gemm_tflops_ours"], "{:.1f}"),
                     _num(x["gemm_tflops_cublas"], "{:.1f}"), _num(x["gemm_efficiency_vs_cublas"]),
                     err if isinstance(err, str) else _num(err, "{:.1e}"), _ms(vals["cudnn_tf32_us"]),
                     _num(vals["ratio_cudnn_tf32_over_ours"]), _num(vals["cudnn_tf32_rel_err"], "{:.1e}"),
                     _ms(vals["ours_prepared_us"]), _num(vals["ratio_cudnn_tf32_over_ours_prepared"]),
                     _ms(vals["ours_other_layout_us"]), _num(vals["ratio_cudnn_tf32_over_ours_either_layout"])])
    g = {k: geomean(v) for k, v in cols.items()}
    rows.append(["geomean", _ms(g["ours_us"]), _ms(g["nonfused"]), _ms(g["cudnn_best_us"]), _ms(g["wino"]),
                 _num(g["tflops_ours"]), _num(g["tflops_cudnn_best"]),
                 _num(g["ratio_cudnn_best_over_ours"]), _num(g["ratio_cudnn_best_any_over_ours"]),
                 _num(g["ratio_nonfused_over_ours"]), _num(g["gemm_tflops_ours"], "{:.1f}"),
                 _num(g["gemm_tflops_cublas"], "{:.1f}"), _num(g["gemm_efficiency_vs_cublas"]),
                 _num(g["err"], "{:.1e}"), _ms(g["cudnn_tf32_us"]),
                 _num(g["ratio_cudnn_tf32_over_ours"]), _num(g["cudnn_tf32_rel_err"], "{:.1e}"),
                 _ms(g["ours_prepared_us"]), _num(g["ratio_cudnn_tf32_over_ours_prepared"]),
                 _ms(g["ours_other_layout_us"]), _num(g["ratio_cudnn_tf32_over_ours_either_layout"])])
    return rows


def print_table(layers: list[dict], primary: str, title: str) -> None:
    rows = table_rows(layers, primary)
    try:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=title, show_lines=False)
        for i, c in enumerate(TABLE_COLUMNS):
            t.add_column(c.replace("ours", primary) if i else c, justify="left" if i == 0 else "right",
                         min_width=20 if i == 0 else None)
        for i, r in enumerate(rows):
            t.add_row(*r, style="bold" if i == len(rows) - 1 else None)
        Console(width=320).print(t)
    except Exception:       # rich missing or failing: plain text
        print(title)
        print(" | ".join(TABLE_COLUMNS))
        for r in rows:
            print(" | ".join(r))


def write_json(path: Path, doc: dict) -> None:
    """Atomic write (tmp + rename) of standard JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(json_clean(doc), fh, indent=1, allow_nan=False)
        fh.write("\n")
    os.replace(tmp, path)


class Bench(compare_backends.Bench):
    """The device-side runner (bench/compare_backends.py), finding libcudnn through
    this module's ``find_loaded_library`` (the tests replace it here)."""

    def cudnn_library(self) -> str | None:
        return find_loaded_library()


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def import_megawino():
    """megawino, from the install or else from this checkout."""
    try:
        import cupy  # noqa: F401
    except Exception:
        pass
    try:
        import megawino
    except ImportError:
        sys.path.append(str(REPO_ROOT))
        import megawino
    return megawino


def main(argv=None) -> int:
    args = parse_args(argv)
    import_megawino()
    from megawino.core.suite import load_suite
    specs = select_specs(load_suite(args.suite_file, suite=args.suite, batch=args.batch,
                                    layout=args.layout), args.layer_names, args.quick)
    primary = PRIMARY[args.suite]
    out = Path(args.out) if args.out else results_path("compare" if args.suite == "winograd" else "compare-direct")
    try:
        bench = Bench(args, primary)
    except Exception as err:           # no CuPy / no GPU: say so in the JSON too
        traceback.print_exc()
        write_json(out, {"tool": "bench/compare.py", "suite": args.suite, "complete": False,
                         "error": f"setup failed: {short_error(err)}", "layers": []})
        return 2
    doc = {"tool": "bench/compare.py", "suite": args.suite, "primary": primary,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "argv": sys.argv[1:] if argv is None else list(argv),
           "settings": {"reps": args.reps, "warmup": args.warmup, "layout": args.layout,
                        "batch": args.batch, "backends": args.backends,
                        "legacy_algos": args.legacy_algos, "seed": args.seed, "tol": args.tol,
                        "quick": args.quick, **bench.settings},
           "environment": bench.environment, "complete": False, "layers": [], "summary": None}
    write_json(out, doc)
    t0 = time.perf_counter()
    for i, spec in enumerate(specs):
        t_layer = time.perf_counter()
        try:
            rec = bench.run_layer(spec, i)
        except Exception as err:                 # belt and braces: run_layer guards itself
            traceback.print_exc()
            rec = layer_record(spec)
            rec["error"] = short_error(err)
        rec["derived"] = derive(rec, primary)
        rec["wall_s"] = round(time.perf_counter() - t_layer, 2)
        doc["layers"].append(rec)
        doc["summary"] = build_summary(doc["layers"], primary, args.tol)
        write_json(out, doc)
        x = rec["derived"]
        print(f"[{i + 1}/{len(specs)}] {spec.name}: {primary} {_ms(x['ours_us'])} ms, "
              f"cuDNN best {_ms(x['cudnn_best_us'])} ms, ratio {_num(x['ratio_cudnn_best_over_ours'])}, "
              f"x TF32 {_num(x['ratio_cudnn_tf32_over_ours'])}, "
              f"{rec['wall_s']} s", file=sys.stderr, flush=True)
    doc["complete"] = not bench.dead
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    bench.close()
    write_json(out, doc)
    gpu = bench.environment.get("gpu", "?")
    print_table(doc["layers"], primary, f"{args.suite} suite on {gpu}, median of {args.reps} "
                f"(warm-up {args.warmup}), times in ms")
    print(json.dumps(json_clean(doc["summary"]), indent=1))
    print(f"wrote {out} ({doc['wall_s']} s)")
    return 1 if bench.dead else 0


if __name__ == "__main__":
    sys.exit(main())
