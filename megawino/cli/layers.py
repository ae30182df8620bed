"""``megawino layers NETWORK``: the conv layers of a network (shapes, counts, FLOPs)."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .common import DEFAULT_LAYER_BATCH, _filter_text, add_network_arguments


def add_parser(sub) -> None:
    p = sub.add_parser("layers", help="conv layers of a network")
    add_network_arguments(p, DEFAULT_LAYER_BATCH, f"batch size (default {DEFAULT_LAYER_BATCH})")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every conv layer (the default)")
    which.add_argument("--winograd", action="store_true", help="only the 3x3 stride-1 layers")
    p.set_defaults(func=cmd_layers)


def cmd_layers(args, out: Console, err: Console) -> int:
    from ..core.networks import DEFAULT_RESOLUTION, network_layers
    layers = network_layers(args.network, args.batch, args.resolution, winograd_only=args.winograd)
    network = args.network.strip().lower()
    resolution = args.resolution or DEFAULT_RESOLUTION[network]
    table = Table(title=f"{network}: {'3x3 stride-1' if args.winograd else 'conv'} layers, "
                        f"batch {args.batch}, {resolution}x{resolution} input",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_footer=True,
                  collapse_padding=True, show_edge=False)
    table.add_column("layer", footer="total", overflow="fold")
    table.add_column("×", justify="right", footer=str(sum(l.count for l in layers)))
    for col in ("N", "C", "K"):
        table.add_column(col, justify="right")
    table.add_column("HxW", justify="right")
    table.add_column("RxS/s/p", justify="right")
    total = sum(l.total_flops for l in layers)
    table.add_column("GFLOP", justify="right", footer=f"{total / 1e9:.1f}")
    table.add_column("wino", justify="center")
    for layer in layers:
        s = layer.spec
        table.add_row(s.name, str(layer.count), str(s.N), str(s.C), str(s.K), f"{s.H}x{s.W}",
                      _filter_text(s), f"{s.direct_flops / 1e9:.2f}",
                      Text("yes", style="green") if s.winograd_eligible else Text("-", style="dim"))
    out.print(table)
    out.print(Text(f"GFLOP: direct convolution, one occurrence (total: × count); "
                   f"wino: 3x3 stride 1, runs as Winograd F(4x4,3x3). "
                   f"{len(layers)} distinct layers.", style="dim"))
    return 0
