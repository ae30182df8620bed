"""Shared by the commands: layer resolution, number formatting, the error line."""
from __future__ import annotations

import difflib
import math
import re

from rich.console import Console
from rich.text import Text

DEFAULT_LAYER_BATCH = 64      # layer names resolve at the paper's evaluation batch size


def add_network_arguments(p, batch_default: int | None, batch_help: str) -> None:
    """NETWORK, --batch and --resolution, as the network commands take them."""
    p.add_argument("network", metavar="NETWORK", help="vgg16, resnet50, yolov3, densenet161, alexnet")
    p.add_argument("--batch", type=int, default=batch_default, help=batch_help)
    p.add_argument("--resolution", type=int, default=None, help="input resolution")


# ---------------------------------------------------------------------------
# Layer resolution (shared by every command)
# ---------------------------------------------------------------------------

def _all_layer_names() -> list[str]:
    from ..networks import NETWORKS, network_layers
    names = []
    for network in NETWORKS:
        try:
            names += [l.name for l in network_layers(network, 1, None, winograd_only=False)]
        except ValueError:
            pass
    return names


def _suggest(text: str) -> list[str]:
    key = text.strip().lower()
    names = _all_layer_names()
    suffix = [n for n in names if n.endswith("." + key)]
    close = difflib.get_close_matches(key, names, n=4, cutoff=0.6)
    short = {n.split(".", 1)[1]: n for n in names}
    close += [short[s] for s in difflib.get_close_matches(key, list(short), n=4, cutoff=0.75)]
    return list(dict.fromkeys(suffix + close))[:5]


_SHAPE_LIKE = re.compile(r"^(?:[a-z]\d+)+$")


def resolve_layer(text: str, batch: int | None = None, resolution: int | None = None):
    """A LayerSpec from a layer name (``resnet50.conv2_x``; batch defaults to 64) or a
    shape string (``n64c64k64h56w56``; ``batch`` replaces its N when given).
    ValueError with close matches when ``text`` is neither."""
    from ..networks import find_layer
    from ..spec import parse_shape
    text = text.strip()
    if "." in text:
        return find_layer(text, DEFAULT_LAYER_BATCH if batch is None else batch, resolution)
    if _SHAPE_LIKE.match(text.lower()):
        spec = parse_shape(text)    # its own errors name the bad field
    else:
        close = _suggest(text)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown layer {text!r}: not a layer name (NETWORK.LAYER, e.g. "
                         f"resnet50.conv2_x) nor a shape string (e.g. n64c64k64h56w56){hint}")
    if resolution is not None:
        raise ValueError("--resolution applies to network layer names, not to shape strings")
    if batch is not None:
        spec = spec.with_(N=batch)
    return spec.with_(name=spec.shape_string)


# ---------------------------------------------------------------------------
# Small formatting helpers
# ---------------------------------------------------------------------------

def _fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "—"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def _fmt_err(err: float | None) -> str:
    if err is None:
        return "—"
    return "nan" if not math.isfinite(err) else f"{err:.1e}"


def _filter_text(spec) -> str:
    return f"{spec.R}x{spec.S}/{spec.stride}/{spec.padding}"


def _compact_shape(spec) -> str:
    """C→K HxW, plus the filter when it is not 3x3 stride 1."""
    text = f"{spec.C}→{spec.K} {spec.H}x{spec.W}"
    if not spec.winograd_eligible:
        text += f" {spec.R}x{spec.S}" + (f"/{spec.stride}" if spec.stride != 1 else "")
    return text


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")


def _error(err: Console, message: str) -> None:
    err.print(Text("error: ", style="bold red") + Text(message, style="red"), soft_wrap=True)
