"""Shared by the commands: layer resolution, number formatting, the error line."""
from __future__ import annotations

import difflib
import math
import os
import re
import stat
import tempfile

from rich.console import Console
from rich.text import Text

from ..core.arguments import positive_int

DEFAULT_LAYER_BATCH = 64      # layer names resolve at the paper's evaluation batch size
PROG = "megawino"


# ---------------------------------------------------------------------------
# Argument types (megawino.core.arguments): argparse refuses bad numbers with its own one-line error
# ---------------------------------------------------------------------------

def add_network_arguments(p, batch_default: int | None, batch_help: str) -> None:
    """NETWORK, --batch and --resolution, as the network commands take them."""
    p.add_argument("network", metavar="NETWORK", help="vgg16, resnet50, yolov3, densenet161, alexnet")
    p.add_argument("--batch", type=positive_int, default=batch_default, help=batch_help)
    p.add_argument("--resolution", type=positive_int, default=None, help="input resolution")


# ---------------------------------------------------------------------------
# Output files: checked and opened before the work starts
# ---------------------------------------------------------------------------

OUTPUT_PATH_HELP = ("a regular file (replaced whole when the work is done) or a new path; a symlink "
                    "is written through to its target; a device, FIFO or socket is refused")


def _node_kind(mode: int) -> str | None:
    """What a non-regular, non-directory node is, in words (None for a regular file)."""
    for test, words in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return None if stat.S_ISREG(mode) else "not a regular file"


class OutputFile:
    """An output path (``--json``, ``--export``) checked before any work: a temporary file is
    opened beside the file it names at once (so a directory, a missing folder or an unwritable
    place fails first, as a ValueError), and :meth:`write_text` renames it over that file.

    Only a regular file or a new path is ever replaced: a symlink is followed to its final
    target (the link stays, its target gets the result), and a device, FIFO or socket is
    refused, since renaming over it would replace the node itself."""

    def __init__(self, path: str, option: str):
        given = os.path.abspath(os.path.expanduser(path))
        self.path = os.path.realpath(given)          # a symlink's final target
        where = path if self.path == given else f"{path} (a link to {self.path})"
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise ValueError(f"{option} {where}: cannot check it ({exc.strerror or exc})") from None
        if mode is not None and stat.S_ISDIR(mode):
            raise ValueError(f"{option} {where}: is a directory; give a file name")
        if mode is not None and _node_kind(mode):
            raise ValueError(f"{option} {where}: is {_node_kind(mode)}; megawino writes only regular "
                             "files (its result replaces the file whole)")
        parent = os.path.dirname(self.path)
        if not os.path.isdir(parent):
            raise ValueError(f"{option} {where}: directory {parent} does not exist")
        if mode is not None and not os.access(self.path, os.W_OK):
            raise ValueError(f"{option} {where}: not writable")
        try:
            self._handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=parent,
                                                       prefix=".megawino-", suffix=".tmp", delete=False)
        except OSError as exc:
            raise ValueError(f"{option} {where}: cannot write in {parent} ({exc.strerror or exc})") from None

    def write_text(self, text: str) -> None:
        with self._handle as fh:
            fh.write(text)
        umask = os.umask(0)
        os.umask(umask)
        # the temporary file is private (0600); the result gets a new file's usual mode
        mode = os.stat(self.path).st_mode & 0o777 if os.path.exists(self.path) else 0o666 & ~umask
        os.chmod(fh.name, mode)
        os.replace(fh.name, self.path)

    def discard(self) -> None:
        """Remove the temporary file (the work failed; ``path`` is left as it was)."""
        self._handle.close()
        if os.path.exists(self._handle.name):
            os.unlink(self._handle.name)


# ---------------------------------------------------------------------------
# Layer resolution (shared by every command)
# ---------------------------------------------------------------------------

def _all_layer_names() -> list[str]:
    from ..core.networks import NETWORKS, network_layers
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
    from ..core.networks import find_layer
    from ..core.spec import parse_shape
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


def _error(err: Console, message: str) -> None:
    """One line on stderr: ``megawino: error: message``."""
    message = " ".join(str(message).split())      # one line, whatever the message held
    err.print(Text(f"{PROG}: error: ", style="bold red") + Text(message, style="red"), soft_wrap=True)


# ---------------------------------------------------------------------------
# Consoles that cannot print the symbols (e.g. PYTHONIOENCODING=cp1252)
# ---------------------------------------------------------------------------

SYMBOLS = "→×—–·…▁▂▃▄▅▆▇█━"
ASCII_SYMBOLS = str.maketrans({"→": "->", "×": "x", "—": "-", "–": "-", "·": ".", "…": "...",
                               "▁": ".", "▂": ":", "▃": "-", "▄": "=", "▅": "+", "▆": "*",
                               "▇": "#", "█": "@", "━": "-"})


class AsciiStream:
    """A text stream that writes the output's symbols as ASCII look-alikes (anything else
    it cannot encode as '?'), for consoles whose encoding lacks them."""

    def __init__(self, stream):
        self._stream = stream
        self.encoding = stream.encoding

    def write(self, text: str) -> int:
        ascii_text = text.translate(ASCII_SYMBOLS)
        self._stream.write(ascii_text.encode(self.encoding, "replace").decode(self.encoding))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def console_stream(stream):
    """``stream`` itself when its encoding can print the symbols, else an AsciiStream."""
    try:
        SYMBOLS.encode(getattr(stream, "encoding", None) or "utf-8")
        return stream
    except (UnicodeEncodeError, LookupError):
        return AsciiStream(stream)
