"""``bench/models.py --zoo``: every torchvision classification model that builds without
downloaded weights (``torchvision.models.list_models(module=torchvision.models)``, random
weights, eval mode), converted with ``megawino.torch.convert`` and run as a user would.

Per model: layers replaced and left alone (with the reasons), what ran each converted layer,
relative L2 error of megawino's and PyTorch fp32's outputs against a float64 run of the same
model, top-1 agreement with it, eager and CUDA-graph forward times against PyTorch fp32 (TF32
off) and PyTorch's default TF32, and the time ``convert`` took (its first forward makes the
per-layer choices).  A model that fails anywhere is a row with its error; the run goes on and
exits non-zero.  ``--device cpu`` runs the same records on megawino's CPU executor without
timings (a dry run: slow, use a small ``--resolution``).

    python3 bench/models.py --zoo                              # bench/results/<gpu>/models-zoo.json
    python3 bench/models.py --zoo --models resnet18,inception_v3 --batch 2
    python3 bench/models.py --zoo --device cpu --models resnet18 --batch 1 --resolution 64
"""
from __future__ import annotations

import collections
import copy
import json
import statistics
import sys
import time
from pathlib import Path

from common import free_gpu_memory, git_commit, json_clean, results_path, set_fp32_precision, short_error

BENCH_DIR = Path(__file__).resolve().parent
RESOLUTIONS = {"inception_v3": 299}     # the input size a model needs, where it is not 224
ERROR_FACTOR, ERROR_FLOOR = 1.5, 3e-6   # megawino's error bar: 1.5x PyTorch fp32's own, or 3e-6
ROUNDS = 2                              # alternating timing rounds of the three variants


def zoo_names() -> list[str]:
    """torchvision's classification models (not detection, segmentation, video, ...)."""
    import torchvision
    return sorted(torchvision.models.list_models(module=torchvision.models))


def build_torchvision(name: str):
    """``name`` with random weights, as built (train mode), zero-initialised layers made random."""
    import torchvision
    kwargs = {"init_weights": True} if name in ("googlenet", "inception_v3") else {}
    return randomize_zero_weights(torchvision.models.get_model(name, weights=None, **kwargs))


def randomize_zero_weights(model):
    """``model`` with every all-zero weight of a linear or convolution layer drawn from N(0, 0.02^2):
    some models start their classifier at zero (the ViTs), which makes every output 0 and leaves
    nothing to compare against float64 or to rank for top-1."""
    import torch
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and weight is not None \
                    and not weight.any():
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.02)
    return model


def reason_kind(reason: str) -> str:
    """A left-alone reason without the layer's own values ("groups=32: megawino runs groups=1
    only ..." -> "megawino runs groups=1 only ..."), so that layers left alone alike count together."""
    return reason.split(": ", 1)[-1]


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def model_record(name: str, build, batch: int, resolution: int, *, device: str = "cuda", reps: int = 10,
                 seed: int = 0, gemm_math: str | None = None, graphs: bool = True,
                 error_sources: bool = False) -> dict:
    """The zoo's row for one model (``build()`` makes it); every failure is caught into
    ``row["error"]`` with the stage it happened in.  ``error_sources``: also the error with one
    family of layers at a time on megawino (:func:`family_errors`)."""
    row = {"model": name, "batch": batch, "resolution": resolution, "device": device}
    stage = "build"
    try:
        import torch
        import megawino.torch as mwt
        from models import graph_forwards, rel_l2, time_forwards, top1_agreement
        torch.manual_seed(seed)
        model = build().eval().to(device)
        generator = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(batch, 3, resolution, resolution, device=device, generator=generator)
        inputs = [x] + [torch.randn_like(x) for _ in range(2)]
        cuda = device == "cuda"
        stage = "float64 reference"
        with torch.no_grad():
            references = [t.clone() for t in _outputs(copy.deepcopy(model).double()(x.double()))]
        free_gpu_memory()
        stage = "convert"
        converted = copy.deepcopy(model)        # outside inference mode, as a user's model is made
        if cuda:
            set_fp32_precision("ieee")
        start = time.perf_counter()
        mwt.convert(converted, backend="auto" if cuda else "cpu", example_input=x, verbose=False,
                    **({} if gemm_math is None else {"gemm_math": gemm_math}))
        if cuda:
            torch.cuda.synchronize()
        row["convert_s"] = time.perf_counter() - start
        report = mwt.report(converted)
        row["layers"] = len(report.rows)
        row["replaced"] = len(report.replaced)
        row["on_megawino"] = len(report.on_megawino)
        row["left_alone"] = report.left_alone
        row["left_alone_reasons"] = dict(collections.Counter(map(reason_kind, report.left_alone.values())))
        row["algos"] = dict(collections.Counter(r.algo or "not run" for r in report.rows if r.replaced))
        stage = "outputs"
        variants = {"pytorch_fp32": (model, "ieee"), "megawino": (converted, "ieee")}
        if cuda:
            variants["pytorch_tf32"] = (model, "tf32")
        with torch.inference_mode():
            for label, (net, precision) in variants.items():
                if cuda:
                    set_fp32_precision(precision)
                outputs = _outputs(net(x))
                row.setdefault("rel_l2", {})[label] = rel_l2(outputs, references)
                if len(outputs) == 1 and outputs[0].dim() == 2:
                    row.setdefault("top1", {})[label] = top1_agreement(outputs, references)
            error, fp32 = row["rel_l2"]["megawino"], row["rel_l2"]["pytorch_fp32"]
            row["error_within_bar"] = error <= max(ERROR_FACTOR * fp32, ERROR_FLOOR)
            if error_sources:
                stage = "error sources"
                if cuda:
                    set_fp32_precision("ieee")
                row["error_sources"] = family_errors(model, x, references, "auto" if cuda else "cpu", gemm_math)
            if cuda:
                stage = "eager timing"
                samples = {label: [] for label in variants}
                for _ in range(ROUNDS):
                    for label, (net, precision) in variants.items():
                        set_fp32_precision(precision)
                        samples[label] += time_forwards(net, inputs, max(2, reps // ROUNDS))
                for label in variants:
                    row[f"{label}_ms"] = statistics.median(samples[label])
                stage = "CUDA-graph timing"
                for label, (net, precision) in variants.items():
                    if not graphs:
                        break
                    set_fp32_precision(precision)
                    try:
                        times, _ = graph_forwards(net, inputs, reps)
                        row[f"{label}_graph_ms"] = statistics.median(times)
                    except Exception as err:     # a failed capture stays in its column
                        row.setdefault("graph_errors", {})[label] = short_error(err)
                    free_gpu_memory()
                set_fp32_precision("ieee")
                for base in ("fp32", "tf32"):
                    for kind in ("", "_graph"):
                        ours, theirs = row.get(f"megawino{kind}_ms"), row.get(f"pytorch_{base}{kind}_ms")
                        if ours and theirs:
                            row[f"{kind.lstrip('_')}{'_' if kind else ''}speedup_vs_{base}"] = theirs / ours
    except Exception as err:           # one model failing must not lose the others
        row["error"] = f"{stage}: {short_error(err)}"
    finally:
        free_runtime_caches()
        free_gpu_memory()
    return row


# Layer families for family_errors: which layers give a converted model its error.
FAMILIES = {"3x3": lambda conv: conv.kernel_size == (3, 3), "1x1": lambda conv: conv.kernel_size == (1, 1)}


def family_errors(model, x, references, backend: str, gemm_math: str | None) -> dict:
    """The relative L2 error of ``model`` converted with only one family of layers (3x3, 1x1, the
    others) left on megawino's choice and the rest sent to PyTorch: an error over the bar is
    traced to the family that carries it."""
    import torch
    import megawino.torch as mwt
    from models import rel_l2
    families = {**FAMILIES, "other": lambda conv: not any(test(conv) for test in FAMILIES.values())}
    errors = {}
    for family, keep in families.items():
        net = mwt.convert(copy.deepcopy(model), backend=backend, verbose=False,
                          **({} if gemm_math is None else {"gemm_math": gemm_math}))
        for conv in net.modules():
            if isinstance(conv, mwt.MegawinoConv2d) and not keep(conv):
                conv.megawino_request = "pytorch"
        with torch.inference_mode():
            net(x)                               # the per-layer choice
            errors[f"{family} only"] = rel_l2(_outputs(net(x)), references)
        errors[f"{family} layers on megawino"] = len(mwt.report(net).on_megawino)
        del net
        free_gpu_memory()
    return errors


# (N, C, K, H=W, filter) of --scale-bias: 1x1 layers of a wide ResNet's kind and two 3x3 ones.
SCALE_BIAS_SHAPES = ((8, 1024, 256, 14, 1), (8, 256, 1024, 14, 1), (64, 256, 64, 56, 1), (8, 512, 512, 14, 3),
                     (64, 64, 64, 56, 3))


def error_and_scale_bias(y, ref) -> dict:
    """For an output ``y`` and its float64 reference: the relative L2 error and the scale bias
    (y - ref).ref / ref.ref, the part of the error along the output itself (y = (1 + s) ref gives
    s), which adds up layer after layer where a random error does not."""
    err = y.double() - ref
    return {"rel_l2": float(err.norm() / ref.norm()), "scale_bias": float((err * ref).sum() / (ref * ref).sum())}


def run_scale_bias(args) -> int:
    """``--scale-bias``: megawino's and cuDNN fp32's error and scale bias on SCALE_BIAS_SHAPES,
    ReLU'd normal inputs and Kaiming-normal weights (a network's activations)."""
    import torch
    import torch.nn.functional as F
    import megawino.torch as mwt
    from rich.console import Console
    console = Console()
    if not torch.cuda.is_available():
        console.print("[red]bench/models.py --scale-bias needs a CUDA GPU[/]")
        return 1
    set_fp32_precision("ieee")
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    rows = []
    for n, c, k, h, r in SCALE_BIAS_SHAPES:
        w = torch.randn(k, c, r, r, device="cuda", generator=generator) * (2.0 / (k * r * r)) ** 0.5
        x = torch.randn(n, c, h, h, device="cuda", generator=generator).relu()
        ref = F.conv2d(x.double(), w.double(), padding=r // 2)
        row = {"shape": f"n{n}c{c}k{k}h{h} {r}x{r}", "cudnn_fp32": error_and_scale_bias(F.conv2d(x, w, padding=r // 2), ref)}
        algo = "pointwise" if r == 1 else "megakernel"
        row[algo] = error_and_scale_bias(mwt.conv2d(x, w, padding=r // 2, algo=algo), ref)
        rows.append(row)
        console.print(row)
    out = Path(args.json) if args.json else results_path("scale-bias")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_clean({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                          "git_commit": git_commit(BENCH_DIR.parent), "seed": args.seed,
                                          "rows": rows}), indent=1) + "\n")
    console.print(f"wrote {out}")
    return 0


def free_runtime_caches() -> None:
    import megawino
    try:
        megawino.synchronize()
        megawino.clear_cache()
    except Exception:          # no GPU, or a failed model's error was recorded with it
        pass


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def progress_line(index: int, total: int, row: dict, seconds: float) -> str:
    head = f"[{index}/{total}] {row['model']} ({seconds:.1f} s): "
    if "error" in row:
        return head + f"[red]FAILED[/] {row['error']}"
    err = row["rel_l2"]
    return head + (f"{row['replaced']}/{row['layers']} converted, {row['on_megawino']} on megawino, rel. L2 "
                   f"{err['megawino']:.1e} (fp32 {err['pytorch_fp32']:.1e}), top-1 "
                   f"{_fmt(row.get('top1', {}).get('megawino'), '.0%')}, x fp32 {_fmt(row.get('speedup_vs_fp32'), '.2f')}")


def zoo_table(rows: list[dict], title: str):
    from rich.table import Table
    table = Table(title=title)
    for column in ("model", "conv layers", "converted", "on megawino", "left alone (why)", "rel. L2 megawino",
                   "rel. L2 fp32", "top-1", "×fp32", "×TF32", "graph ×fp32", "graph ×TF32", "convert s"):
        table.add_column(column, justify="left" if column in ("model", "left alone (why)") else "right")
    for row in rows:
        if "error" in row:
            table.add_row(row["model"], f"[red]{row['error']}[/]")
            continue
        reasons = "; ".join(f"{count}x {reason}" for reason, count in row["left_alone_reasons"].items())
        err = row["rel_l2"]
        mark = "" if row["error_within_bar"] else " [red]![/]"
        table.add_row(row["model"], str(row["layers"]), str(row["replaced"]), str(row["on_megawino"]), reasons,
                      f"{err['megawino']:.2e}{mark}", f"{err['pytorch_fp32']:.2e}",
                      _fmt(row.get("top1", {}).get("megawino"), ".0%"), _fmt(row.get("speedup_vs_fp32"), ".2f"),
                      _fmt(row.get("speedup_vs_tf32"), ".2f"), _fmt(row.get("graph_speedup_vs_fp32"), ".2f"),
                      _fmt(row.get("graph_speedup_vs_tf32"), ".2f"), f"{row['convert_s']:.1f}")
    return table


def run_zoo(args, names=None, build=build_torchvision) -> int:
    """``--zoo``: every model of ``names`` (default: all of torchvision's classification models,
    or ``--models``); writes the JSON and prints the table; 0 when no model failed."""
    import torch
    from rich.console import Console
    console = Console() if sys.stdout.isatty() else Console(width=220)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        console.print("[red]bench/models.py --zoo needs a CUDA GPU (--device cpu: a dry run on the CPU executor)[/]")
        return 1
    if names is None:
        try:
            names = zoo_names()
        except ImportError:
            console.print("[red]bench/models.py --zoo needs torchvision (pip install torchvision)[/]")
            return 1
    every = names
    wanted = args.models if args.models else every
    unknown = [name for name in wanted if name not in every]
    if unknown:
        console.print(f"[red]unknown model(s) {', '.join(unknown)}; --zoo runs {', '.join(every)}[/]")
        return 2
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = Path(args.json) if args.json else results_path("models-zoo")
    try:
        import torchvision
        torchvision_version = torchvision.__version__
    except ImportError:
        torchvision_version = None
    commit = git_commit(BENCH_DIR.parent)
    rows = []

    def write(complete: bool) -> list[str]:
        # Written after every model, so a run stopped part-way keeps what it measured.
        failed = [row["model"] for row in rows if "error" in row]
        record = {"gpu": gpu, "torch": torch.__version__, "torchvision": torchvision_version,
                  "git_commit": commit, "argv": list(args.argv), "batch": args.batch,
                  "reps": args.reps, "gemm_math": args.gemm_math, "error_bar": [ERROR_FACTOR, ERROR_FLOOR],
                  "complete": complete, "models_wanted": len(wanted), "failed": failed, "rows": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(json_clean(record), indent=1) + "\n")
        return failed

    for index, name in enumerate(wanted, 1):
        start = time.perf_counter()
        resolution = args.resolution or RESOLUTIONS.get(name, 224)
        rows.append(model_record(name, lambda name=name: build(name), args.batch, resolution, device=device,
                                 reps=args.reps, seed=args.seed, gemm_math=args.gemm_math, graphs=args.graphs,
                                 error_sources=args.error_sources))
        console.print(progress_line(index, len(wanted), rows[-1], time.perf_counter() - start))
        write(complete=False)
    failed = write(complete=True)
    console.print(zoo_table(rows, f"megawino.torch.convert on {len(rows)} torchvision models, batch {args.batch} "
                                  f"({gpu}; {len(failed)} failed)"))
    console.print(f"wrote {out}")
    return 2 if failed else 0
