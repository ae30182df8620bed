"""``megawino timeline LAYER``: the simulated (or measured) timeline of one layer."""
from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from .common import _positive, resolve_layer
from .mapping import _add_mapping_options, _build_mapping


def add_parser(sub) -> None:
    p = sub.add_parser("timeline", help="simulated (or measured) timeline of one layer")
    _add_mapping_options(p)
    p.add_argument("--workers", type=int, default=None,
                   help="persistent workers (default 132 SMs x 2)")
    p.add_argument("--width", type=int, default=None, help="columns (default: the terminal's)")
    p.add_argument("--lanes", type=int, default=16, help="worker lanes shown (default 16)")
    p.add_argument("--export", metavar="PATH", default=None,
                   help="write the timeline as Perfetto / Chrome trace JSON")
    p.add_argument("--measured", action="store_true",
                   help="run on the GPU with tracing and show the measured timeline")
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

    from ..timeline import Timeline
    x, w = sweep.random_inputs(spec, np.random.default_rng(0))
    if spec.layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    xd, wd = cupy.asarray(x), cupy.asarray(w)
    for _ in range(2):
        plan(xd, wd)
    cupy.cuda.Device().synchronize()
    return Timeline.from_gpu_trace(plan.trace(), mapping.order, graph, label=label)


def cmd_timeline(args, out: Console, err: Console) -> int:
    from ..timeline import render
    _positive("--workers", args.workers)
    _positive("--lanes", args.lanes)
    width = args.width if args.width is not None else out.width
    if width < 30:
        raise ValueError(f"--width must be at least 30, got {width}")
    if args.export:
        parent = os.path.dirname(os.path.abspath(args.export))
        if not os.path.isdir(parent):
            raise ValueError(f"--export {args.export}: directory {parent} does not exist")
    spec = resolve_layer(args.layer, args.batch, args.resolution)
    graph, mapping = _build_mapping(spec, args)
    desc = "sequential mapping" if args.sequential else \
        f"interleaved DIG {args.dig} DGO {args.dgo} M {args.m}"
    if args.measured:
        timeline = _measured_timeline(spec, graph, mapping, spec.name)
    else:
        from ..simulator import default_workers, simulate
        workers = args.workers if args.workers is not None else default_workers()
        timeline = simulate(graph, mapping.order, workers, label=f"{spec.name}, cost model")
    out.print(Text(f"{spec.name}  ", style="bold") + Text(spec.describe()))
    out.print(Text(f"{graph.num_tasks} tasks, {desc}, {timeline.num_workers} workers"
                   + ("" if args.measured else " (simulated: roofline cost model)"), style="dim"))
    out.print(render(timeline, width=width, lanes=args.lanes))
    if args.export:
        timeline.to_perfetto(args.export)
        out.print(f"wrote Perfetto trace {escape(args.export)}")
        out.print(Text("open it in https://ui.perfetto.dev (or chrome://tracing)", style="dim"))
    return 0
