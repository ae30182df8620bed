"""Render the README's result tables from the committed result files, so no figure is typed by
hand: the suite status (``bench/results/<gpu>/compare.json`` of bench/compare.py) and the whole
models (``bench/results/<gpu>/models.json`` of bench/models.py) and the torchvision model zoo by
family (``bench/results/<gpu>/models-zoo.json`` of bench/models.py --zoo).

    python3 bench/readme_tables.py status [--gpu h100] [PATH]
    python3 bench/readme_tables.py models [--gpu h100] [PATH]
    python3 bench/readme_tables.py zoo [--gpu h200] [PATH]
    python3 bench/readme_tables.py status --gpu h200 --readme   # rewrite README.md's table in place

``--readme`` replaces the lines between ``<!-- readme_tables TABLE GPU -->`` (any GPU) and
``<!-- /readme_tables -->`` in README.md, and the marker's GPU.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent.parent / "README.md"
MISSING = "—"        # a column the results file does not have (an older run)
MODEL_NAMES = {"resnet50": "ResNet-50", "vgg16": "VGG-16", "densenet161": "DenseNet-161",
               "yolov3": "YOLOv3-style"}


def _optional(value, spec: str) -> str:
    return MISSING if value is None else format(value, spec)


def status_table(data: dict) -> str:
    lines = ["| layer | megakernel ms | non-fused ms | cuDNN via PyTorch ms | best cuDNN fp32 ms (algorithm) "
             "| ×PyTorch | ×best | ×TF32 | ×TF32, weights prepared | ×TF32, either layout "
             "| GEMM TFLOP/s (cuBLAS SGEMM) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for layer in data["layers"]:
        d, b = layer["derived"], layer["backends"]
        source = d["cudnn_best_any_from"].replace("cudnn_legacy_", "").replace("cudnn_nchw", "PyTorch NCHW") \
            .replace("cudnn_nhwc", "PyTorch NHWC")
        lines.append(f"| {layer['name']} | {d['ours_us'] / 1e3:.3f} | {b['nonfused']['median_us'] / 1e3:.3f} "
                     f"| {d['cudnn_best_us'] / 1e3:.3f} | {d['cudnn_best_any_us'] / 1e3:.3f} ({source}) "
                     f"| {d['ratio_cudnn_best_over_ours']:.2f} | {d['ratio_cudnn_best_any_over_ours']:.2f} "
                     f"| {_optional(d.get('ratio_cudnn_tf32_over_ours'), '.2f')} "
                     f"| {_optional(d.get('ratio_cudnn_tf32_over_ours_prepared'), '.2f')} "
                     f"| {_optional(d.get('ratio_cudnn_tf32_over_ours_either_layout'), '.2f')} "
                     f"| {d['gemm_tflops_ours']:.1f} ({d['gemm_tflops_cublas']:.1f}) |")
    s = data["summary"]
    # Issue 15's GEMM bar is the median over the layers with C >= 256 (their GEMM dominates).
    wide = sorted(x["derived"]["gemm_efficiency_vs_cublas"] for x in data["layers"]
                  if x.get("C", 0) >= 256 and x["derived"].get("gemm_efficiency_vs_cublas") is not None)
    wide_median = f" ({wide[len(wide) // 2]:.2f} on the {len(wide)} layers with C >= 256)" if wide else ""
    lines.append("")
    lines.append(f"Geomean of cuDNN time / megakernel time: {s['geomean_cudnn_best_over_megakernel']:.2f} against "
                 f"PyTorch's cuDNN choice, **{s['geomean_cudnn_best_any_over_megakernel']:.3f}** against the best "
                 f"of every cuDNN float32 algorithm; megakernel over the own non-fused path "
                 f"{s['geomean_nonfused_over_megakernel']:.3f} (geomean); against PyTorch's TF32 default "
                 f"{_optional(s.get('geomean_cudnn_tf32_over_megakernel'), '.2f')} (geomean, ×TF32: TF32 time "
                 f"/ megakernel time; TF32's max rel. error {_optional(s.get('max_cudnn_tf32_rel_err'), '.1e')}), "
                 f"with the weights prepared once {_optional(s.get('geomean_cudnn_tf32_over_megakernel_prepared'), '.2f')} "
                 f"(as a converted model runs a layer: no filter transform in the timed calls; against the best cuDNN "
                 f"fp32 algorithm {_optional(s.get('geomean_cudnn_best_any_over_megakernel_prepared'), '.3f')}), "
                 f"in the faster of NCHW and NHWC {_optional(s.get('geomean_cudnn_tf32_over_megakernel_either_layout'), '.2f')} "
                 f"(as cuDNN's columns are timed: a model in either memory format; against the best cuDNN fp32 "
                 f"algorithm {_optional(s.get('geomean_cudnn_best_any_over_megakernel_either_layout'), '.3f')}); "
                 f"GEMM stage at a median "
                 f"{s['median_gemm_efficiency_vs_cublas']:.2f} of cuBLAS SGEMM{wide_median}; max rel. error vs cuDNN "
                 f"{s['max_rel_err_vs_cudnn']:.1e} ({data.get('date', '')}).")
    return "\n".join(lines)


def _graph_times(row: dict) -> str:
    times = [row.get(f"{v}_graph_ms") for v in ("pytorch_fp32", "pytorch_tf32", "megawino")]
    return MISSING if all(t is None for t in times) else " / ".join(_optional(t, ".2f") for t in times)


def models_table(data: dict) -> str:
    lines = ["| model | batch | PyTorch fp32 ms | PyTorch TF32 ms | megawino ms | ×fp32 | ×TF32 "
             "| CUDA graphs: ms (fp32 / TF32 / megawino) | graph ×fp32 | graph ×TF32 "
             "| rel. L2 vs float64 (fp32 / TF32 / megawino) | top-1 | layers on megawino |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        name = MODEL_NAMES.get(row["model"], row["model"])
        if "error" in row and "megawino_ms" not in row:
            lines.append(f"| {name} | {row['batch']} | failed: {row['error']} | | | | | | | | | | |")
            continue
        err = row["rel_l2"]
        top1 = row.get("top1", {}).get("megawino")
        algos = row.get("algos", {})
        ours = sum(v for k, v in algos.items() if k not in ("pytorch", "left alone"))
        lines.append(f"| {name} | {row['batch']} | {row['pytorch_fp32_ms']:.2f} | {row['pytorch_tf32_ms']:.2f} "
                     f"| {row['megawino_ms']:.2f} | {row['speedup_vs_fp32']:.3f} | {row['speedup_vs_tf32']:.3f} "
                     f"| {_graph_times(row)} | {_optional(row.get('graph_speedup_vs_fp32'), '.3f')} "
                     f"| {_optional(row.get('graph_speedup_vs_tf32'), '.3f')} "
                     f"| {err['pytorch_fp32']:.1e} / {err['pytorch_tf32']:.1e} / {err['megawino']:.1e} "
                     f"| {'' if top1 is None else f'{top1 * 100:.0f}%'} | {ours} of {sum(algos.values())} |")
    return "\n".join(lines)


def _geomean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def zoo_table(data: dict) -> str:
    """One row per model family (the name's leading letters): how many layers megawino took and
    why others were left alone, the worst error against float64, top-1 and the geomean speeds."""
    families: dict[str, list[dict]] = {}
    for row in data["rows"]:
        families.setdefault(re.match(r"[a-z]+", row["model"]).group(0), []).append(row)
    lines = ["| family | models | failed | conv layers: converted / on megawino | left alone (why) "
             "| max rel. L2 vs float64: megawino (PyTorch fp32) | top-1 | ×fp32 | graph ×fp32 | graph ×TF32 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for family, rows in sorted(families.items()):
        ran = [r for r in rows if "error" not in r]
        reasons: dict[str, int] = {}
        for r in ran:
            for why, count in r.get("left_alone_reasons", {}).items():
                reasons[why] = reasons.get(why, 0) + count
        # The reason's own gloss where it has one: "groups=1 only (no grouped ... convolution)".
        why = "; ".join(f"{count}: {text.rsplit('(', 1)[-1].rstrip(')') if '(' in text else text}"
                        for text, count in reasons.items()) or "none"
        err = max((r["rel_l2"]["megawino"] for r in ran), default=None)
        fp32 = max((r["rel_l2"]["pytorch_fp32"] for r in ran), default=None)
        top1 = min((r["top1"]["megawino"] for r in ran if r.get("top1")), default=None)
        lines.append(f"| {family} | {len(rows)} | {len(rows) - len(ran)} "
                     f"| {sum(r['replaced'] for r in ran)} / {sum(r['on_megawino'] for r in ran)} | {why} "
                     f"| {_optional(err, '.1e')} ({_optional(fp32, '.1e')}) "
                     f"| {MISSING if top1 is None else f'{top1 * 100:.0f}%'} "
                     f"| {_optional(_geomean(r.get('speedup_vs_fp32') for r in ran), '.2f')} "
                     f"| {_optional(_geomean(r.get('graph_speedup_vs_fp32') for r in ran), '.2f')} "
                     f"| {_optional(_geomean(r.get('graph_speedup_vs_tf32') for r in ran), '.2f')} |")
    ran = [r for r in data["rows"] if "error" not in r]
    lines.append(f"\n{len(data['rows'])} models, {len(data.get('failed', []))} failed, batch {data['batch']} "
                 f"({data.get('gpu', '')}, torch {data.get('torch', '')}); errors within 1.5x of PyTorch fp32's or "
                 f"3e-6 on {sum(bool(r.get('error_within_bar')) for r in ran)} of {len(ran)}; geomean ×fp32 "
                 f"{_optional(_geomean(r.get('speedup_vs_fp32') for r in ran), '.2f')} eager, "
                 f"{_optional(_geomean(r.get('graph_speedup_vs_fp32') for r in ran), '.2f')} as CUDA graphs.")
    return "\n".join(lines)


RENDER = {"status": ("compare.json", status_table), "models": ("models.json", models_table),
          "zoo": ("models-zoo.json", zoo_table)}


def replace_in_readme(text: str, table: str, gpu: str, rendered: str) -> str:
    """README text with the block of ``table`` replaced by ``rendered`` (ValueError: no block)."""
    pattern = re.compile(rf"<!-- readme_tables {table} \S+ -->\n.*?<!-- /readme_tables -->", re.S)
    if not pattern.search(text):
        raise ValueError(f"README.md has no '<!-- readme_tables {table} GPU -->' block")
    block = f"<!-- readme_tables {table} {gpu} -->\n{rendered}\n<!-- /readme_tables -->"
    return pattern.sub(lambda _: block, text, count=1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=tuple(RENDER))
    parser.add_argument("path", nargs="?", help="results file (default: the GPU's committed one)")
    parser.add_argument("--gpu", default="h100", help="the folder of bench/results/ to read (default h100)")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args(argv)
    file_name, render = RENDER[args.table]
    data = json.loads(Path(args.path or RESULTS / args.gpu / file_name).read_text())
    rendered = render(data)
    if args.readme:
        README.write_text(replace_in_readme(README.read_text(), args.table, args.gpu, rendered))
        print(f"wrote the {args.table} table into {README}")
    else:
        print(rendered)


if __name__ == "__main__":
    main()
