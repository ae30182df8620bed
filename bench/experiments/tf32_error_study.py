"""CPU error study for a TF32-grade Winograd mode (issue 16): the relative L2 error against a
float64 direct convolution of Winograd variants whose batched GEMM runs fewer TF32 products than
today's 3xTF32, side by side with PyTorch's TF32 convolution (emulated), on every suite layer.

Emulation (NumPy, no GPU):
- TF32 rounding as the kernel's ``split_tf32`` does it (``cuda/gemm.cuh``): fp32 bits + 0x1000,
  masked with 0xFFFFE000 (round to nearest, ties away, as cvt.rna.tf32.f32); the small part is
  ``x - big`` truncated to TF32.
- "PyTorch TF32": x and w rounded to TF32, the convolution in float64 (the products of two TF32
  numbers are exact and fp32 accumulation error is far below TF32's rounding); "trunc" rounds
  toward zero instead, what the tensor core does with fp32 bits that were never converted.
- Winograd: U = G g G^T and V = B^T d B in fp32 (megawino.winograd's references), the GEMM as one
  fp32 matmul over the concatenated TF32 products (a product of two TF32 numbers is exact in
  fp32, so only the fp32 accumulation rounds, as on the tensor core), y = A^T M A in fp32.

Cost: tensor-core time per output element and input channel, alpha^2 / m^2 Winograd points per
output times the GEMM's products per point (F(4x4): 36 / 16, F(2x2): 16 / 4; a BF16 product
counts half a TF32 one, the H100's dense rates being 989 and 495 TFLOP/s), relative to today's
default F(4x4) 3xTF32 (6.75); a direct TF32 convolution does 9.

    PYTHONPATH=$PWD python3 bench/experiments/tf32_error_study.py [--layers a,b] [--batch 1]
        [--max-size 56] [--seed 0] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from megawino.core import abi, winograd  # noqa: E402
from megawino.core.suite import load_suite, select_specs  # noqa: E402

TF32_ROUND_BIT = np.uint32(0x1000)
TF32_MASK = np.uint32(0xFFFFE000)
DEFAULT_COST = 36 / 16 * 3          # F(4x4) 3xTF32, today's default
DIRECT_PRODUCTS = 9                 # a direct 3x3 convolution's products per output and channel

POINT_SETS = {
    "half": winograd.POINTS_F4_HALF,                     # megawino's F(4x4) default
    "classic": winograd.POINTS_F4_CLASSIC,
    "symhalf": tuple(Fraction(p) for p in ("0", "1", "-1", "1/2", "-1/2")),
    "third": tuple(Fraction(p) for p in ("0", "1", "-1", "1/2", "-1/3")),
    "f6": tuple(Fraction(p) for p in ("0", "1", "-1", "1/2", "-1/2", "2", "-2")),   # F(6x6)'s
}

# GEMM products: which (V part, U part) pairs are multiplied; "big" is V or U rounded to TF32,
# "small" the truncated TF32 remainder, "hi" / "lo" the same split in BF16 (round to nearest even
# both, as cvt.rn.bf16x2.f32), whose products the H100 runs at twice the TF32 rate.
PRODUCTS = {
    "fp32": None,                                          # plain fp32 GEMM (FFMA), no TF32
    "1x": (("big", "big"),),
    "2xV": (("big", "big"), ("small", "big")),             # V split, U rounded once
    "2xU": (("big", "big"), ("big", "small")),             # U split, V rounded once
    "3x": (("small", "big"), ("big", "small"), ("big", "big")),   # today's default
    "1xT": (("trunc", "trunc"),),                          # fp32 bits fed to the MMA unconverted
    "bf16x3": (("lo", "hi"), ("hi", "lo"), ("hi", "hi")),
    "bf16x2V": (("hi", "hi"), ("lo", "hi")),
}
BF16_PRODUCT_COST = 0.5   # H100 dense BF16 tensor-core rate: twice TF32's (989 against 495 TFLOP/s)

# (label, m, point set, row scaling, products); "eq" scales B^T's rows to equal L2 norms.
VARIANTS = [(f"F2 {p}", 2, None, None, p) for p in ("1x", "2xV", "2xU", "3x", "1xT", "bf16x3")]
VARIANTS += [(f"F4{'' if s == 'half' else '-' + s} {p}", 4, s, None, p)
             for s in POINT_SETS if s != "f6"
             for p in ("1x", "2xV", "2xU", "3x") + (("1xT", "bf16x3", "bf16x2V") if s == "half" else ())]
VARIANTS += [(f"F4-eq {p}", 4, "half", "eq", p) for p in ("1x", "2xV")]
VARIANTS += [(f"F6 {p}", 6, "f6", None, p) for p in ("2xV", "3x", "bf16x3")]

DISTRIBUTIONS = {
    # name: (how x is drawn, how w is drawn); std of w 1/sqrt(9C) as He-like initialisation.
    "normal": "x ~ N(0, 1), w ~ N(0, 1/sqrt(9C))",
    "relu": "x ~ U(0, 1) (non-negative, mean 0.5, like post-ReLU activations), w ~ N(0, 1/sqrt(9C))",
    "shifted": "x ~ U(0, 1), w ~ U(-0.5, 1) / sqrt(9C) (both with non-zero mean)",
}


def round_tf32(a: np.ndarray) -> np.ndarray:
    """fp32 -> TF32 as split_tf32's big part: add half an ulp of TF32 to the bits, mask."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + TF32_ROUND_BIT) & TF32_MASK).view(np.float32)


def truncate_tf32(a: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (bits & TF32_MASK).view(np.float32)


def round_bf16(a: np.ndarray) -> np.ndarray:
    """fp32 -> BF16 (kept in fp32), round to nearest even: the split BF16 operands' rounding."""
    return abi.bf16_value(abi.bf16_round(a))


def split_parts(a: np.ndarray) -> dict[str, np.ndarray]:
    """Every operand part a variant may multiply (see PRODUCTS)."""
    a = a.astype(np.float32)
    big, hi = round_tf32(a), round_bf16(a)
    return {"big": big, "small": truncate_tf32(a - big), "trunc": truncate_tf32(a),
            "hi": hi, "lo": round_bf16(a - hi)}


def split_gemm(V: np.ndarray, U: np.ndarray, products: str) -> np.ndarray:
    """M[p] = V[p] @ U[p] with the given TF32 products, summed in one fp32 matmul."""
    if PRODUCTS[products] is None:
        return np.matmul(V, U)
    v_parts, u_parts = split_parts(V), split_parts(U)
    pairs = PRODUCTS[products]
    lhs = np.concatenate([v_parts[v] for v, _ in pairs], axis=2)
    rhs = np.concatenate([u_parts[u] for _, u in pairs], axis=1)
    return np.matmul(lhs, rhs)


def row_scaling(tf: winograd.WinogradTransform, scaling: str | None) -> np.ndarray | None:
    """Per-point factors s (V[i][j] *= s_i s_j, U[i][j] /= s_i s_j: the same product)."""
    if scaling is None:
        return None
    if scaling == "eq":
        return (1.0 / np.linalg.norm(tf.BT, axis=1)).astype(np.float32)
    raise ValueError(f"unknown scaling {scaling!r}")


def winograd_conv(x_nhwc, w, m, point_set, scaling, products, cache):
    """y[N][H][W][K] of the Winograd variant; transforms cached per (m, points, scaling)."""
    key = (m, point_set, scaling)
    if key not in cache:
        tf = winograd.transform(m, POINT_SETS[point_set] if point_set else None)
        n, h, wd, _ = x_nhwc.shape
        U = winograd.filter_transform(w, tf, np.float32)
        V = winograd.input_transform(x_nhwc, 1, tf, h, wd, np.float32)
        s = row_scaling(tf, scaling)
        if s is not None:
            s2 = np.outer(s, s).reshape(-1, 1, 1).astype(np.float32)
            V, U = (V * s2).astype(np.float32), (U / s2).astype(np.float32)
        cache[key] = (tf, U, V)
    tf, U, V = cache[key]
    n, h, wd, _ = x_nhwc.shape
    return winograd.output_transform(split_gemm(V, U, products), tf, n, h, wd, np.float32)


def cost(m: int, products: str) -> float:
    """Tensor-core time per output and input channel (a TF32 product 1, a BF16 product
    BF16_PRODUCT_COST), relative to today's default."""
    per_product = BF16_PRODUCT_COST if products.startswith("bf16") else 1.0
    count = 1 if PRODUCTS[products] is None else len(PRODUCTS[products])
    return (m + 2) ** 2 / m ** 2 * count * per_product / DEFAULT_COST


def draw(distribution: str, spec, batch: int, size: int, rng: np.random.Generator):
    x_shape, w_shape = (batch, spec.C, size, size), (spec.K, spec.C, 3, 3)
    w_std = 1.0 / np.sqrt(9 * spec.C)
    if distribution == "normal":
        x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape) * w_std
    elif distribution == "relu":
        x, w = rng.random(x_shape), rng.standard_normal(w_shape) * w_std
    elif distribution == "shifted":
        x, w = rng.random(x_shape), rng.uniform(-0.5, 1.0, w_shape) * w_std
    else:
        raise ValueError(f"unknown distribution {distribution!r}")
    return x.astype(np.float32), w.astype(np.float32)


def measure_layer(spec, distribution, batch, size, rng, variants):
    """Rel. L2 errors vs float64 of the references and every variant on one drawn input."""
    x, w = draw(distribution, spec, batch, size, rng)
    ref = winograd.direct_conv_nchw(x.astype(np.float64), w.astype(np.float64), 1, 1)
    to_nhwc = lambda y: np.ascontiguousarray(y.transpose(0, 2, 3, 1))   # noqa: E731
    ref_nhwc = to_nhwc(ref)
    errors = {
        "pytorch-tf32": winograd.rel_l2(to_nhwc(winograd.direct_conv_nchw(
            round_tf32(x).astype(np.float64), round_tf32(w).astype(np.float64), 1, 1)), ref_nhwc),
        "pytorch-tf32-trunc": winograd.rel_l2(to_nhwc(winograd.direct_conv_nchw(
            truncate_tf32(x).astype(np.float64), truncate_tf32(w).astype(np.float64), 1, 1)), ref_nhwc),
        "fp32-direct": winograd.rel_l2(to_nhwc(winograd.direct_conv_nchw(x, w, 1, 1, np.float32)),
                                       ref_nhwc),
    }
    x_nhwc = to_nhwc(x)
    cache = {}
    for label, m, point_set, scaling, products in variants:
        y = winograd_conv(x_nhwc, w, m, point_set, scaling, products, cache)
        errors[label] = winograd.rel_l2(y, ref_nhwc)
    return errors


def summarise(records, variants):
    """Per variant: cost, worst and median ratio to emulated PyTorch TF32, worst layer, max error,
    and the worst ratio to PyTorch TF32 emulated with truncated operands."""
    rows = []
    for label, m, _, _, products in variants:
        ratios = [(r["errors"][label] / r["errors"]["pytorch-tf32"], r) for r in records]
        trunc_ratios = [r["errors"][label] / r["errors"]["pytorch-tf32-trunc"] for r in records]
        worst_ratio, worst = max(ratios, key=lambda item: item[0])
        rows.append({
            "variant": label, "m": m, "products": products, "cost": cost(m, products),
            "worst_ratio": worst_ratio, "median_ratio": float(np.median([q for q, _ in ratios])),
            "worst_layer": f"{worst['layer']} ({worst['distribution']})",
            "worst_by_distribution": {d: max(q for q, r in ratios if r["distribution"] == d)
                                      for d in dict.fromkeys(r["distribution"] for r in records)},
            "max_error": max(r["errors"][label] for r in records),
            "worst_ratio_vs_trunc": max(trunc_ratios),
        })
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default=None, help="comma-separated suite layer names (default: all)")
    ap.add_argument("--batch", type=int, default=1, help="images per layer (default 1)")
    ap.add_argument("--max-size", type=int, default=56,
                    help="crop H and W to at most this (default 56; the error is a per-element property)")
    ap.add_argument("--distributions", default=",".join(DISTRIBUTIONS),
                    help=f"comma-separated, of {', '.join(DISTRIBUTIONS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every record and the summary here")
    args = ap.parse_args(argv)
    distributions = [d.strip() for d in args.distributions.split(",") if d.strip()]
    unknown = [d for d in distributions if d not in DISTRIBUTIONS]
    if unknown or not distributions:
        ap.error(f"unknown distributions {unknown}; choose from {', '.join(DISTRIBUTIONS)}")
    if args.batch < 1 or args.max_size < 4:
        ap.error("--batch must be >= 1 and --max-size >= 4")
    specs = select_specs(load_suite(), args.layers)
    console = Console()
    rng = np.random.default_rng(args.seed)
    records = []
    started = time.perf_counter()
    for spec in specs:
        size = min(spec.H, args.max_size)
        for distribution in distributions:
            errors = measure_layer(spec, distribution, args.batch, size, rng, VARIANTS)
            records.append({"layer": spec.name, "C": spec.C, "K": spec.K, "H": spec.H, "size": size,
                            "cropped": size < spec.H, "distribution": distribution, "errors": errors})
        console.print(f"[dim]{spec.name}: {size}x{size}{' (cropped)' if size < spec.H else ''} "
                      f"done at {time.perf_counter() - started:.0f} s[/dim]")
    summary = summarise(records, VARIANTS)

    detail = Table(title="error / emulated PyTorch TF32 error, worst over the distributions "
                         f"({', '.join(distributions)})")
    detail.add_column("layer")
    detail.add_column("TF32 (normal)", justify="right")
    detail.add_column("trunc (normal)", justify="right")
    detail.add_column("fp32", justify="right")
    shown = [v for v in VARIANTS if v[1] == 2 or v[2] == "half" and v[3] is None]
    for v in shown:
        detail.add_column(v[0], justify="right")
    for spec in specs:
        recs = [r for r in records if r["layer"] == spec.name]
        normal = [r for r in recs if r["distribution"] == "normal"] or recs
        cells = [f"{normal[0]['errors']['pytorch-tf32']:.1e}", f"{normal[0]['errors']['pytorch-tf32-trunc']:.1e}",
                 f"{max(r['errors']['fp32-direct'] / r['errors']['pytorch-tf32'] for r in recs):.3f}"]
        for v in shown:
            ratio = max(r["errors"][v[0]] / r["errors"]["pytorch-tf32"] for r in recs)
            cells.append(f"[{'red' if ratio > 1 else 'green'}]{ratio:.2f}[/]")
        crop = " *" if recs[0]["cropped"] else ""
        detail.add_row(spec.name + crop, *cells)
    console.print(detail)
    if any(r["cropped"] for r in records):
        console.print(f"* input cropped to {args.max_size}x{args.max_size} (batch {args.batch})")

    table = Table(title="per variant, over every layer and distribution (ratio = error / emulated "
                        "PyTorch TF32 error; cost = tensor-core time relative to F(4x4) 3xTF32; "
                        "vs trunc = worst ratio to PyTorch TF32 with truncated operands)")
    for col in ("variant", "cost", "worst ratio", *distributions, "median", "max error", "worst layer",
                "vs trunc"):
        table.add_column(col, justify="left" if col in ("variant", "worst layer") else "right")
    for row in summary:
        colour = "green" if row["worst_ratio"] <= 1 and row["max_error"] <= 1e-3 else "red"
        table.add_row(row["variant"], f"{row['cost']:.2f}", f"[{colour}]{row['worst_ratio']:.2f}[/]",
                      *(f"{row['worst_by_distribution'][d]:.2f}" for d in distributions),
                      f"{row['median_ratio']:.2f}", f"{row['max_error']:.1e}", row["worst_layer"],
                      f"{row['worst_ratio_vs_trunc']:.2f}")
    console.print(table)
    tf32 = [r["errors"]["pytorch-tf32"] for r in records]
    trunc = [r["errors"]["pytorch-tf32-trunc"] / r["errors"]["pytorch-tf32"] for r in records]
    console.print(f"emulated PyTorch TF32 error {min(tf32):.1e} .. {max(tf32):.1e}; rounding toward "
                  f"zero instead gives {min(trunc):.2f} .. {max(trunc):.2f}x that; a direct TF32 "
                  f"conv costs {DIRECT_PRODUCTS / DEFAULT_COST:.2f} on the cost scale")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "tool": "bench/experiments/tf32_error_study.py", "argv": sys.argv[1:],
            "settings": {"batch": args.batch, "max_size": args.max_size, "seed": args.seed,
                         "distributions": {d: DISTRIBUTIONS[d] for d in distributions}},
            "variants": [{"label": v[0], "m": v[1], "points": v[2] or "default", "scaling": v[3],
                          "products": v[4]} for v in VARIANTS],
            "summary": summary, "records": records}, indent=1))
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
