"""Where a converted model's time and error come from (GPU; the error part also runs on the CPU
for a smoke test).

``--part timing``: whole forwards of the plain and the converted model, each as eager calls
(CUDA events, back-to-back, as bench/models.py times them), as the host time of one forward
issued to an idle GPU, and as a CUDA-graph replay (GPU time only, no host cost); then each layer
megawino took is handed back to PyTorch one at a time and the model is timed again (eager and
graph), which gives every converted layer's gain inside the model.

``--part floor``: the float32 model with every convolution exact (float64, rounded once): the
error of everything but the convolutions, the floor under any float32 convolution.

``--part error``: each convolution's contribution to the model's output error.  The model runs in
float64 with one convolution computed in float32 by one path (cuDNN IEEE fp32, or a megawino
algorithm), so the output's rel. L2 error against the all-float64 run is that layer's share;
for each layer also its own rel. L2 error and its signed scale error <e, y> / <y, y> (a bias
that shrinks or grows outputs adds up over layers; random errors add in quadrature).

    python3 bench/experiments/model_diagnose.py --part timing --model densenet161 --batch 16
    python3 bench/experiments/model_diagnose.py --part error --model yolov3 --batch 1 --json e.json
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import set_fp32_precision  # noqa: E402
from models import MODELS, build_model, flat_outputs, graph_forwards, rel_l2, time_forwards  # noqa: E402


def outside_inference_copy(model):
    """A copy of ``model`` whose weights are ordinary tensors (a copy made under inference_mode
    has inference tensors, which megawino cannot track and so re-prepares at every call)."""
    import torch
    with torch.inference_mode(False):
        return copy.deepcopy(model)


def host_ms(model, x, reps: int = 7) -> float:
    """Median host time of one forward issued to an idle GPU."""
    import torch
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        model(x)
        times.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def graph_ms(model, x, reps: int = 20) -> float:
    """Median time of a CUDA-graph replay of one forward (GPU time, no host cost)."""
    return statistics.median(graph_forwards(model, [x], reps)[0])


def profile(model, inputs, reps: int) -> dict:
    return {"eager_ms": statistics.median(time_forwards(model, inputs, reps)),
            "host_ms": host_ms(model, inputs[0]), "graph_ms": graph_ms(model, inputs[0])}


def timing(args, model, inputs) -> dict:
    import torch
    import megawino.torch as mwt
    converted = mwt.convert(outside_inference_copy(model), example_input=inputs[0], verbose=False)
    result = {"plain": profile(model, inputs, args.reps), "converted": profile(converted, inputs, args.reps)}
    megawino_layers = [(name, m) for name, m in converted.named_modules()
                       if isinstance(m, mwt.MegawinoConv2d) and m.megawino_algo not in (None, "pytorch")
                       and args.ablation]
    ablation = []
    for name, module in megawino_layers:
        module.__class__ = torch.nn.Conv2d          # this layer back on PyTorch
        row = {"layer": name, "algo": module.megawino_algo, "input": list(module.megawino_input_shape),
               "shape": f"{module.in_channels}->{module.out_channels} {module.kernel_size[0]}x{module.kernel_size[1]}"}
        row.update({f"without_{k}": v for k, v in profile(converted, inputs, args.reps).items()})
        module.__class__ = mwt.MegawinoConv2d
        ablation.append(row)
        print(f"  {name:40s} {row['algo']:10s} eager {row['without_eager_ms']:.3f} "
              f"graph {row['without_graph_ms']:.3f} host {row['without_host_ms']:.3f}", flush=True)
    result["converted_again"] = profile(converted, inputs, args.reps)
    if args.profile:
        import cProfile
        import io
        import pstats
        for label, net in (("plain", model), ("converted", converted)):
            profiler = cProfile.Profile()
            torch.cuda.synchronize()
            profiler.enable()
            for _ in range(5):
                net(inputs[0])
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(22)
            print(f"--- host profile, 5 forwards, {label} ---\n{text.getvalue()}")
    result["ablation"] = ablation
    for label in ("plain", "converted", "converted_again"):
        p = result[label]
        print(f"{label:16s} eager {p['eager_ms']:8.3f} ms  host {p['host_ms']:8.3f} ms  graph {p['graph_ms']:8.3f} ms")
    return result


def error(args, model, inputs) -> dict:
    import torch
    import torch.nn.functional as F
    import megawino.torch as mwt
    from megawino import LayerSpec
    from megawino.runtime import candidate_algos
    x = inputs[0]
    on_gpu = x.is_cuda
    # The CPU smoke test compares cuDNN's stand-in only: megawino's CPU executor is too slow.
    converted = mwt.convert(outside_inference_copy(model), example_input=x, verbose=False) if on_gpu else model
    chosen = {name: (m.megawino_algo if isinstance(m, mwt.MegawinoConv2d) else "pytorch")
              for name, m in converted.named_modules() if isinstance(m, torch.nn.Conv2d)}
    reference = copy.deepcopy(model).double()
    x64 = x.double()
    y_ref = [t.clone() for t in flat_outputs(reference(x64))]
    totals = {"pytorch_fp32": rel_l2(flat_outputs(model(x)), y_ref),
              "converted": rel_l2(flat_outputs(converted(x)), y_ref)}
    rows = []
    convs = [(name, m) for name, m in reference.named_modules() if isinstance(m, torch.nn.Conv2d)]
    input_shapes = {}
    def record(mod, inp, _out):
        input_shapes[mod] = tuple(inp[0].shape)
    handles = [m.register_forward_hook(record) for _, m in convs]
    reference(x64)
    for handle in handles:
        handle.remove()
    for index, (name, module) in enumerate(convs):
        n, c, h, w = input_shapes[module]
        row = {"layer": name, "chosen": chosen[name], "input": [n, c, h, w], "paths": {}}
        paths = ["cudnn"]
        if on_gpu and module.groups == 1 and module.dilation == (1, 1):
            spec = LayerSpec(n, c, module.out_channels, h, w, *module.kernel_size,
                             module.stride[0], module.padding[0], "NCHW")
            paths += list(candidate_algos(spec))
        for path in paths:
            stats = {}

            def replace(mod, inp, out, path=path, stats=stats):
                xi, wi = inp[0].float(), mod.weight.float()
                if path == "cudnn":
                    y = F.conv2d(xi, wi, None, mod.stride, mod.padding)
                else:
                    y = mwt.conv2d(xi, wi, None, mod.stride, mod.padding, algo=path)
                y = y.double()
                if mod.bias is not None:
                    y = y + mod.bias.view(1, -1, 1, 1)
                e = y - out
                stats["layer_rel_l2"] = float(e.norm() / out.norm())
                stats["scale_error"] = float((e * out).sum() / (out * out).sum())
                return y
            handle = module.register_forward_hook(replace)
            stats["model_rel_l2"] = rel_l2(flat_outputs(reference(x64)), y_ref)
            handle.remove()
            row["paths"][path] = stats
        rows.append(row)
        summary = "  ".join(f"{p}: {s['layer_rel_l2']:.2e}/{s['scale_error']:+.1e}->{s['model_rel_l2']:.2e}"
                            for p, s in row["paths"].items())
        print(f"{index:3d} {name:36s} [{row['chosen']}] {summary}", flush=True)
    quadrature = {}
    for label, pick in (("cudnn", lambda r: "cudnn"), ("chosen", lambda r: "cudnn" if r["chosen"] in (None, "pytorch") else r["chosen"])):
        quadrature[label] = math.sqrt(sum(r["paths"][pick(r)]["model_rel_l2"] ** 2 for r in rows))
    best = math.sqrt(sum(min(s["model_rel_l2"] for s in r["paths"].values()) ** 2 for r in rows))
    quadrature["most_accurate_path"] = best
    print("model rel. L2:", {k: f"{v:.3e}" for k, v in totals.items()},
          "quadrature sums:", {k: f"{v:.3e}" for k, v in quadrature.items()})
    return {"totals": totals, "quadrature": quadrature, "layers": rows}


def floor(args, model, inputs) -> dict:
    """The float32 model's error with every convolution exact (computed in float64, rounded once
    to float32): what the model's other operations and the rounding of activations cost, the
    least any float32 convolution can give."""
    import torch
    import torch.nn.functional as F
    x = inputs[0]
    reference = copy.deepcopy(model).double()
    y_ref = [t.clone() for t in flat_outputs(reference(x.double()))]

    def exact(mod, inp, _out):
        y = F.conv2d(inp[0].double(), mod.weight.double(), None, mod.stride, mod.padding, mod.dilation, mod.groups)
        if mod.bias is not None:
            y = y + mod.bias.double().view(1, -1, 1, 1)
        return y.float()
    handles = [m.register_forward_hook(exact) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    exact_convs = rel_l2(flat_outputs(model(x)), y_ref)
    for handle in handles:
        handle.remove()
    result = {"pytorch_fp32": rel_l2(flat_outputs(model(x)), y_ref), "exact_convolutions": exact_convs}
    print({k: f"{v:.3e}" for k, v in result.items()})
    return result


def fastcalls(args, model, inputs) -> dict:
    """For each layer megawino runs: its kept FastCalls and, for the next call, the first
    condition that sends it to the full path (None: the fast path runs)."""
    import torch
    import megawino.torch as mwt
    from megawino.torch import gpu
    converted = mwt.convert(outside_inference_copy(model), example_input=inputs[0], verbose=False)
    for x in inputs:
        converted(x)
    torch.cuda.synchronize()
    rows = []
    for name, m in converted.named_modules():
        if not isinstance(m, mwt.MegawinoConv2d) or m.megawino_algo in (None, "pytorch"):
            continue
        fasts = m.__dict__.get("_megawino_fast")
        row = {"layer": name, "algo": m.megawino_algo, "fasts": {str(k): type(v).__name__ for k, v in fasts.items()}}
        captured = {}
        hook = m.register_forward_pre_hook(lambda mod, inp: captured.setdefault("x", inp[0]))
        converted(inputs[0])
        hook.remove()
        x = captured["x"]
        fast = fasts.get((x.shape, gpu.current_stream_handle(x)))
        if isinstance(fast, gpu.FastCall):
            checks = {"shape": x.shape == fast.shape, "device": x.device == fast.device,
                      "weight": m.weight is fast.weight, "version": m.weight._version == fast.weight_version,
                      "weight_ptr": m.weight.data_ptr() == fast.weight_ptr,
                      "generation": gpu.generation() == fast.generation,
                      "contiguous": x.is_contiguous(), "aligned": x.data_ptr() % 16 == 0,
                      "stream": fast._stream_of(fast.index) == fast.stream,
                      "current_device": torch.cuda.current_device() == fast.index,
                      "not_capturing": not torch.cuda.is_current_stream_capturing(),
                      "valid": fast.launcher.valid()}
            row["failing"] = [k for k, ok in checks.items() if not ok]
        rows.append(row)
        print(row, flush=True)
    return {"layers": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("timing", "error", "floor", "fastcalls"), required=True)
    ap.add_argument("--profile", action="store_true", help="timing: cProfile of 5 forwards of each model")
    ap.add_argument("--no-ablation", dest="ablation", action="store_false",
                    help="timing: skip handing each megawino layer back to PyTorch")
    ap.add_argument("--model", default="densenet161", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--resolution", type=int, help="input size (default: the model's)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    import torch
    torch.manual_seed(0)
    model = build_model(args.model).eval().to(args.device)
    resolution = args.resolution or MODELS[args.model][1]
    generator = torch.Generator(device=args.device).manual_seed(0)
    inputs = [torch.randn(args.batch, 3, resolution, resolution, device=args.device, generator=generator)
              for _ in range(3)]
    torch.backends.cudnn.benchmark = True
    set_fp32_precision("ieee")
    with torch.inference_mode():
        result = {"timing": timing, "error": error, "floor": floor, "fastcalls": fastcalls}[args.part](args, model, inputs)
    result.update(model=args.model, batch=args.batch, resolution=resolution)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
