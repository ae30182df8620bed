"""``megawino timeline LAYER``: the simulated (or measured) timeline of one layer."""
from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from ..core.arguments import positive_int
from .common import OUTPUT_PATH_HELP, OutputFile, resolve_layer
from .mapping import _add_mapping_options, _build_mapping


def add_parser(sub) -> None:
    p = sub.add_parser("timeline", help="simulated (or measured) timeline of one layer")
    _add_mapping_options(p)
    p.add_argument("--workers", type=positive_int, default=None,
                   help="simulated persistent workers (default: the modelled GPU's SMs x 2)")
    p.add_argument("--width", type=positive_int, default=None, help="columns (default: the terminal's)")
    p.add_argument("--lanes", type=positive_int, default=16, help="worker lanes shown (default 16)")
    p.add_argument("--export", metavar="PATH", default=None,
                   help="write the timeline as Perfetto / Chrome trace JSON: " + OUTPUT_PATH_HELP)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--measured", action="store_true",
                      help="run on the GPU with tracing (the default when there is a GPU)")
    mode.add_argument("--simulate", action="store_true",
                      help="simulate with the cost model even when there is a GPU")
    p.add_argument("--compare-sim", action="store_true",
                   help="with a measured run: also the simulator's prediction for the same "
                        "mapping, its cost model calibrated on this trace, and the makespan error")
    p.set_defaults(func=cmd_timeline)


def _measured_timeline(spec, graph, mapping, label: str):
    """Run the layer on the GPU with tracing (twice: the second launch is traced
    warm) and return the measured Timeline."""
    from .. import sweep
    runtime = sweep.gpu_runtime()
    if runtime is None:
        raise ValueError("--measured needs a GPU and the GPU runtime; none was found")
    try:
        plan = runtime.plan(spec, params=graph.layout.params, mapping=mapping.order,
                            algo="megakernel", trace=True)
    except (TypeError, NotImplementedError) as exc:
        raise ValueError(f"the GPU runtime has no tracing ({exc})") from None
    if not callable(getattr(plan, "trace", None)):
        raise ValueError("the GPU runtime has no tracing (its plan has no trace())")
    import cupy
    import numpy as np

    from ..schedule.timeline import Timeline
    x, w = sweep.random_inputs(spec, np.random.default_rng(0))
    if spec.layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    xd, wd = cupy.asarray(x), cupy.asarray(w)
    for _ in range(2):
        plan(xd, wd)
    cupy.cuda.Device().synchronize()
    return Timeline.from_gpu_trace(plan.trace(), mapping.order, graph, label=label)


def _model_words(model) -> str:
    """Which GPU the cost model stands for, in words."""
    return (f"the roofline cost model of an {model.device} ({model.sms} SMs x "
            f"{model.residents_per_sm} resident blocks, {model.flops_per_s / 1e12:.1f} TFLOP/s, "
            f"{model.bytes_per_s / 1e12:.2f} TB/s)")


def cmd_timeline(args, out: Console, err: Console) -> int:
    width = args.width if args.width is not None else out.width
    if width < 30:
        raise ValueError(f"--width must be at least 30, got {width}")
    export = OutputFile(args.export, "--export") if args.export else None
    try:
        return _timeline(args, out, width, export)
    except BaseException:
        if export is not None:
            export.discard()
        raise


def _timeline(args, out: Console, width: int, export: OutputFile | None) -> int:
    from ..schedule.timeline import render
    spec = resolve_layer(args.layer, args.batch, args.resolution)
    graph, mapping = _build_mapping(spec, args)
    desc = "sequential mapping" if args.sequential else \
        f"interleaved DIG {args.dig} DGO {args.dgo} M {args.groups_per_column}"
    from .. import sweep
    from ..schedule.simulator import CostModel, default_workers, simulate
    measured = args.measured or (not args.simulate and sweep.gpu_runtime() is not None)
    if args.compare_sim and not measured:
        raise ValueError("--compare-sim compares the simulator with a measured run: it needs a GPU")
    if measured and args.workers is not None:
        raise ValueError("--workers sets the simulated workers; a measured run uses the plan's grid "
                         "(add --simulate)")
    from ..gpu import identity
    # The GPU in use (its measured ceilings, or ones from its attributes), else the default target's.
    gpu = identity.current_identity() if sweep.gpu_runtime() is not None else identity.DEFAULT_TARGET
    model = CostModel.for_ceilings(identity.ceilings(gpu))
    if measured:
        timeline = _measured_timeline(spec, graph, mapping, spec.name)
    else:
        workers = args.workers if args.workers is not None else default_workers(model.sms,
                                                                                model.residents_per_sm)
        timeline = simulate(graph, mapping.order, workers, model, label=f"{spec.name}, cost model")
    out.print(Text(f"{spec.name}  ", style="bold") + Text(spec.describe()))
    out.print(Text(f"{graph.num_tasks} tasks, {desc}, {timeline.num_workers} workers"
                   + (" (measured on the GPU)" if measured else f" (simulated: {_model_words(model)})"),
                   style="dim"))
    out.print(render(timeline, width=width, lanes=args.lanes))
    if not measured:
        out.print(Text(f"simulated wait: from claiming a ticket to starting its task; every ticket "
                       f"pays the modelled hand-off of {model.handoff_us:.2f} us (ticket atomic, "
                       "mapping read, counter acquire), more when its parents are still running",
                       style="dim"))
    if args.compare_sim:
        calibrated = model.calibrate(timeline, graph)
        predicted = simulate(graph, mapping.order, timeline.num_workers, calibrated,
                             label=f"{spec.name}, calibrated cost model")
        out.print(render(predicted, width=width, lanes=args.lanes))
        error = (predicted.makespan - timeline.makespan) / timeline.makespan
        out.print(Text(f"makespan: measured {timeline.makespan:.1f} us, simulated "
                       f"{predicted.makespan:.1f} us, error {100 * error:+.1f}%", style="bold"))
    if export is not None:
        export.write_text(json.dumps(timeline.to_perfetto()))
        out.print(f"wrote Perfetto trace {escape(args.export)}")
        out.print(Text("open it in https://ui.perfetto.dev (or chrome://tracing)", style="dim"))
    return 0
