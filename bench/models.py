"""Whole PyTorch models on megawino (GPU): ``megawino.torch.convert`` against the same model in
PyTorch, in one process.

For each model and batch: the converted model, PyTorch fp32 (cuDNN and cuBLAS TF32 off) and
PyTorch's default TF32 convolutions, all with ``cudnn.benchmark`` on; median of CUDA-event
timings of whole forwards (warm-up first, inputs rotated among three tensors), and of the same
forwards captured as CUDA graphs and replayed (the GPU's time without the host's); relative L2
error of the outputs against a float64 run of the same model (``model.double()`` on the GPU)
and top-1 agreement with it on random inputs (classification models; the YOLOv3-style
model's outputs are detection maps: no top-1).  Then the host time per call of
``megawino.torch.conv2d`` on a tiny cached layer against ``F.conv2d``.

    python3 bench/models.py                        # every model, writes bench/results/<gpu>/models.json
    python3 bench/models.py --models resnet50 --batches 1 --quick
    python3 bench/models.py --models resnet50 --gemm-math bf16x3 --json models-bf16x3.json

``--gemm-math`` picks the converted model's GEMM arithmetic (``convert(..., gemm_math=...)``),
recorded in the JSON, in each row beside its errors and in the table's title; the PyTorch TF32
column is the natural comparison for the TF32-grade ``bf16x3``.

Models: torchvision's ResNet-50, VGG-16 and DenseNet-161 (random weights, eval mode) and the
YOLOv3-style network of bench/darknet.py at 416x416.  One model failing records its error and
the run goes on.  ``--zoo``: every torchvision classification model instead (bench/zoo.py).
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import statistics
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from common import free_gpu_memory, git_commit, json_clean, results_path, set_fp32_precision, short_error  # noqa: E402
from host_overhead import host_overhead, overhead_table  # noqa: E402
from megawino.gpu.nvrtc import DEFAULT_GEMM_MATH, GEMM_MATHS  # noqa: E402

# model -> (batches, input resolution, classification: top-1 is meaningful)
MODELS = {
    "resnet50": ((1, 8, 64), 224, True),
    "vgg16": ((1, 32), 224, True),
    "densenet161": ((16,), 224, True),
    "yolov3": ((1, 16), 416, False),
}
ROUNDS = 4                # alternating timing rounds of the three variants
INPUT_SETS = 3            # inputs rotated among, so no forward reuses its predecessor's input


def build_model(name: str):
    """The model with random weights (torch's global seed), in train mode as built."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}")
    if name == "yolov3":
        from darknet import YOLOv3
        return YOLOv3()
    import torchvision
    return getattr(torchvision.models, name)(weights=None)


def flat_outputs(out) -> list:
    """A model's output(s) as a list of tensors."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def rel_l2(outputs: list, references: list) -> float:
    """||outputs - references|| / ||references|| over all tensors together, in float64."""
    num = sum(float((o.double() - r.double()).square().sum()) for o, r in zip(outputs, references))
    den = sum(float(r.double().square().sum()) for r in references)
    return (num / den) ** 0.5


def top1_agreement(outputs: list, references: list) -> float:
    """Fraction of samples whose arg-max class matches the reference's (one [N, classes] output)."""
    (out,), (ref,) = outputs, references
    return float((out.argmax(1) == ref.argmax(1)).double().mean())


def time_forwards(model, inputs: list, reps: int, warmup: int = 2) -> list[float]:
    """ms of each of ``reps`` forwards (CUDA events around each, inputs rotated)."""
    import torch
    for i in range(warmup):
        model(inputs[i % len(inputs)])
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for i, (start, end) in enumerate(events):
        start.record()
        model(inputs[i % len(inputs)])
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def graph_forwards(model, inputs: list, reps: int) -> tuple[list[float], list]:
    """ms of ``reps`` CUDA-graph replays of one forward (GPU time, no host cost), and the outputs
    of a last replay on ``inputs[0]``: the forward is captured once on a static input, into which
    each replay's input is copied outside the timing."""
    import torch
    static_x = inputs[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):           # the warm-up torch asks for before a capture
        model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_x)
    times = []
    for i in range(reps + 1):
        static_x.copy_(inputs[i % len(inputs)])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    static_x.copy_(inputs[0])
    graph.replay()
    outputs = [t.clone() for t in flat_outputs(static_out)]
    del graph
    return times[1:], outputs                # the first replay uploads the graph


def convert_model(model, example_input, gemm_math: str = DEFAULT_GEMM_MATH):
    """``model`` on megawino in place with the GEMM arithmetic ``gemm_math``; one forward on
    ``example_input`` makes the per-layer choices."""
    import megawino.torch as mwt
    return mwt.convert(model, gemm_math=gemm_math, example_input=example_input, verbose=False)


def bench_model(name: str, batch: int, reps: int, seed: int, gemm_math: str = DEFAULT_GEMM_MATH,
                graphs: bool = True) -> dict:
    import torch
    import megawino
    import megawino.torch as mwt
    _, resolution, classification = MODELS[name]
    row = {"model": name, "batch": batch, "resolution": resolution, "gemm_math": gemm_math}
    torch.manual_seed(seed)
    model = build_model(name).eval().cuda()
    generator = torch.Generator(device="cuda").manual_seed(seed)
    inputs = [torch.randn(batch, 3, resolution, resolution, device="cuda", generator=generator)
              for _ in range(INPUT_SETS)]
    torch.backends.cudnn.benchmark = True
    # Copied outside inference_mode, as a user's model is made: a copy made inside has inference
    # tensors for weights, whose changes PyTorch does not track (megawino re-prepares those).
    converted = copy.deepcopy(model)
    with torch.inference_mode():
        reference_model = copy.deepcopy(model).double()
        references = [t.clone() for t in flat_outputs(reference_model(inputs[0].double()))]
        del reference_model
        free_gpu_memory()

        set_fp32_precision("ieee")
        start = time.perf_counter()
        convert_model(converted, inputs[0], gemm_math)    # choices made here
        megawino.synchronize()
        row["first_call_s"] = time.perf_counter() - start
        variants = {"pytorch_fp32": (model, "ieee"), "pytorch_tf32": (model, "tf32"),
                    "megawino": (converted, "ieee")}
        # Rounds alternate the variants, so a drift of the machine (host-bound forwards at small
        # batches move by 2x within one process) hits each alike; the medians decide.
        samples = {label: [] for label in variants}
        for _ in range(ROUNDS):
            for label, (net, precision) in variants.items():
                set_fp32_precision(precision)
                samples[label] += time_forwards(net, inputs, max(3, reps // ROUNDS))
        graph_outputs = {}
        if graphs:   # the same forwards as CUDA-graph replays: the GPU's time without the host's
            for label, (net, precision) in variants.items():
                set_fp32_precision(precision)
                try:
                    times, graph_outputs[label] = graph_forwards(net, inputs, reps)
                    row[f"{label}_graph_ms"] = statistics.median(times)
                    row.setdefault("rel_l2_graph", {})[label] = rel_l2(graph_outputs[label], references)
                except Exception as err:     # a failed capture stays in its column
                    row.setdefault("graph_errors", {})[label] = short_error(err)
                free_gpu_memory()
        for label, (net, precision) in variants.items():
            set_fp32_precision(precision)
            row[f"{label}_ms"] = statistics.median(samples[label])
            outputs = flat_outputs(net(inputs[0]))
            row.setdefault("rel_l2", {})[label] = rel_l2(outputs, references)
            if label in graph_outputs:       # megawino's replay must give its eager call's bits (cuDNN's may differ)
                row.setdefault("graph_bits_equal_eager", {})[label] = all(
                    torch.equal(g, o) for g, o in zip(graph_outputs[label], outputs))
            if classification:
                row.setdefault("top1", {})[label] = top1_agreement(outputs, references)
        set_fp32_precision("ieee")
        megawino.synchronize()
        model = converted
    report = mwt.report(model)
    row["algos"] = dict(collections.Counter(r.algo if r.replaced else "left alone" for r in report.rows))
    row["layers"] = [{"name": r.name, "shape": r.shape, "input": r.input_shape, "algo": r.algo,
                      "note": r.note} for r in report.rows]
    for base in ("pytorch_fp32", "pytorch_tf32"):
        row[f"speedup_vs_{base.removeprefix('pytorch_')}"] = row[f"{base}_ms"] / row["megawino_ms"]
        if row.get(f"{base}_graph_ms") and row.get("megawino_graph_ms"):
            row[f"graph_speedup_vs_{base.removeprefix('pytorch_')}"] = row[f"{base}_graph_ms"] / row["megawino_graph_ms"]
    return row


def cudnn_version() -> int | None:
    """cuDNN's version, None where torch cannot say (a CUDA build of torch without a GPU raises)."""
    import torch
    try:
        return torch.backends.cudnn.version()
    except Exception:
        return None


def free_runtime_caches() -> None:
    """Drop megawino's plans and prepared weights (their memory is torch's until then)."""
    import megawino
    try:
        megawino.synchronize()
        megawino.clear_cache()
    except Exception:          # a failed model's error was recorded with it
        pass


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=None,
                   help=f"comma-separated, of {', '.join(MODELS)} (default: all); with --zoo, torchvision names")
    p.add_argument("--batches", default=None,
                   help="comma-separated batch sizes for every model (default: each model's own)")
    p.add_argument("--reps", type=int, default=None, help="timed forwards per variant (default 20; 5 with --quick)")
    p.add_argument("--overhead-calls", type=int, default=2000, help="back-to-back calls per overhead row")
    p.add_argument("--json", default=None,
                   help="results file (its folder is created; default bench/results/<gpu>/models.json, "
                        "with --zoo models-zoo.json)")
    p.add_argument("--quick", action="store_true", help="5 reps, each model's smallest batch only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gemm-math", choices=tuple(GEMM_MATHS), default=DEFAULT_GEMM_MATH,
                   help="the converted model's GEMM arithmetic (convert(gemm_math=...); "
                        f"default {DEFAULT_GEMM_MATH})")
    p.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="skip the CUDA-graph replays of each variant (timed by default)")
    zoo = p.add_argument_group("--zoo: every torchvision classification model (bench/zoo.py)")
    zoo.add_argument("--zoo", action="store_true", help="run the zoo instead of the models above")
    zoo.add_argument("--batch", type=int, default=8, help="the zoo's batch size (default 8)")
    zoo.add_argument("--resolution", type=int, default=None,
                     help="the zoo's input size (default 224; 299 for inception_v3)")
    zoo.add_argument("--error-sources", action="store_true",
                     help="also each model's error with one family of layers (3x3, 1x1, others) on megawino")
    zoo.add_argument("--scale-bias", action="store_true",
                     help="instead: the error and scale bias of single layers (bench/zoo.py run_scale_bias)")
    zoo.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                     help="cpu: a dry run of the zoo's records on the CPU executor, no timings")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    names = args.models.split(",") if args.models is not None else ([] if args.zoo else list(MODELS))
    args.models = [m.strip() for m in names if m.strip()]
    if args.zoo:
        if args.batch < 1 or (args.resolution is not None and args.resolution < 32):
            p.error("--batch must be positive and --resolution at least 32")
        args.reps = args.reps if args.reps is not None else 10
        if args.reps < 1:
            p.error("--reps must be positive")
        return args
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.batches is not None:
        try:
            args.batches = [int(b) for b in args.batches.split(",")]
        except ValueError:
            p.error(f"--batches takes comma-separated integers, got {args.batches!r}")
        if not args.batches or min(args.batches) < 1:
            p.error("--batches must be positive integers")
    args.reps = args.reps if args.reps is not None else (5 if args.quick else 20)
    if args.reps < 1 or args.overhead_calls < 1:
        p.error("--reps and --overhead-calls must be positive")
    return args


def jobs(args) -> list[tuple[str, int]]:
    """(model, batch) pairs in run order."""
    out = []
    for name in args.models:
        batches = args.batches or MODELS[name][0]
        out += [(name, b) for b in (batches[:1] if args.quick else batches)]
    return out


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def results_table(rows: list[dict], gemm_math: str = DEFAULT_GEMM_MATH):
    from rich.table import Table
    table = Table(title=f"megawino.torch.convert (gemm_math={gemm_math}) vs PyTorch (median ms per forward)")
    for column in ("model", "batch", "PyTorch fp32", "PyTorch TF32", "megawino", "×fp32", "×TF32",
                   "graph ×fp32", "graph ×TF32", "rel. L2 megawino", "rel. L2 fp32", "rel. L2 TF32",
                   "top-1 megawino", "layers on"):
        table.add_column(column, justify="left" if column in ("model", "layers on") else "right")
    for row in rows:
        if "error" in row:
            table.add_row(row["model"], str(row["batch"]), f"[red]{row['error']}[/]")
            continue
        err, top1 = row["rel_l2"], row.get("top1", {})
        algos = ", ".join(f"{name} {count}" for name, count in sorted(row["algos"].items()))
        table.add_row(row["model"], str(row["batch"]), _fmt(row["pytorch_fp32_ms"], ".2f"),
                      _fmt(row["pytorch_tf32_ms"], ".2f"), _fmt(row["megawino_ms"], ".2f"),
                      _fmt(row["speedup_vs_fp32"], ".2f"), _fmt(row["speedup_vs_tf32"], ".2f"),
                      _fmt(row.get("graph_speedup_vs_fp32"), ".2f"), _fmt(row.get("graph_speedup_vs_tf32"), ".2f"),
                      _fmt(err["megawino"], ".2e"), _fmt(err["pytorch_fp32"], ".2e"),
                      _fmt(err["pytorch_tf32"], ".2e"),
                      _fmt(top1.get("megawino"), ".0%") if top1 else "n/a (detection)", algos)
    return table


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.scale_bias:
        from zoo import run_scale_bias
        return run_scale_bias(args)
    if args.zoo:
        from zoo import run_zoo
        return run_zoo(args)
    import torch
    from rich.console import Console
    from rich.progress import Progress
    # A log file or pipe gets the whole table, not 80 columns of it.
    console = Console() if sys.stdout.isatty() else Console(width=220)
    if not torch.cuda.is_available():
        console.print("[red]bench/models.py needs a CUDA GPU[/]")
        return 1
    rows, overhead = [], []
    with Progress(console=console) as progress:
        todo = jobs(args)
        task = progress.add_task("models", total=len(todo) + 1)
        for name, batch in todo:
            progress.update(task, description=f"{name} batch {batch}")
            try:
                rows.append(bench_model(name, batch, args.reps, args.seed, args.gemm_math, args.graphs))
            except Exception as err:       # one model failing must not lose the others
                rows.append({"model": name, "batch": batch, "gemm_math": args.gemm_math,
                             "error": short_error(err)})
            free_runtime_caches()
            free_gpu_memory()
            progress.advance(task)
        progress.update(task, description="host overhead")
        try:
            overhead = host_overhead(args.overhead_calls)
        except Exception as err:
            overhead = [{"call": "overhead", "error": short_error(err)}]
        progress.advance(task)
    console.print(results_table(rows, args.gemm_math))
    console.print(overhead_table(overhead))
    from megawino.gpu.algo_choice import timing as choice_timing
    from megawino.torch.gpu import choice_margin
    try:
        import torchvision
        torchvision_version = torchvision.__version__
    except ImportError:
        torchvision_version = None
    record = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": cudnn_version(), "torchvision": torchvision_version,
              "git_commit": git_commit(REPO_ROOT), "argv": args.argv,
              "reps": args.reps, "input_sets": INPUT_SETS, "quick": args.quick,
              "gemm_math": args.gemm_math, "choice_margin": choice_margin(),
              "choice_timing": choice_timing(), "rows": rows,
              "host_overhead": overhead}
    out = Path(args.json) if args.json else results_path("models")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_clean(record), indent=1) + "\n")
    console.print(f"wrote {out}")
    return 0 if all("error" not in row for row in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
