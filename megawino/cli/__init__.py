"""The ``megawino`` command line: argument parsing and rendering only.

Commands::

    megawino layers NETWORK      conv layers of a network (shapes, counts, FLOPs)
    megawino tune TARGET         tune mappings and task sizes on the GPU
    megawino sweep NETWORK       run and check each layer; time, error, TFLOP/s
    megawino mapping LAYER       task counts and the ticket order of one layer
    megawino timeline LAYER      simulated (or measured) timeline of one layer
    megawino info                versions, GPU, nvcc

LAYER is a network layer name (``resnet50.conv2_x``, batch 64 unless ``--batch``)
or a shape string (``n64c64k64h56w56``, see :func:`megawino.core.spec.parse_shape`).
The work happens in the library (:mod:`megawino.sweep`, :mod:`megawino.schedule.mapping`,
:mod:`megawino.schedule.simulator`, ...), imported lazily so that ``--help`` and the CPU
commands never touch CUDA.  Every failure is one red ``megawino: error:`` line on
stderr: bad input, a refused run or an unwritable path exit 2, an unexpected error 3
(``--debug`` shows its traceback instead).

One module per command (:mod:`.layers`, :mod:`.tune`, :mod:`.sweep`, :mod:`.mapping`,
:mod:`.timeline`, :mod:`.info`), each with ``add_parser(sub)`` and ``cmd_<name>``;
:mod:`.common` holds layer resolution and the shared formatting helpers.
"""
from __future__ import annotations

import argparse
import sys

from rich.console import Console

from . import info, layers, mapping, sweep, timeline, tune
from .common import DEFAULT_LAYER_BATCH, PROG, _error, console_stream, resolve_layer

__all__ = ["main", "build_parser", "resolve_layer", "DEFAULT_LAYER_BATCH"]

_strip_lines = mapping._strip_lines      # importable from here, as before the split (tests)


class UsageError(Exception):
    """argparse's usage error, raised instead of printing usage and exiting."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)     # --sim must not mean --simulate
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")


# What a LAYER shape string spells (megawino.core.spec.parse_shape), shown by --help.
SHAPE_STRING_HELP = ("LAYER shape strings: n64c64k64h56w56[r3s3][u1][p1]: batch n, channels c -> k, image "
                     "h x w (h alone: w = h), filter r x s (default 3x3; r alone: s = r), stride u "
                     "(default 1), padding p (default 1, r // 2 with r); u and p take an h x w pair "
                     "where the two dimensions differ: n8c64k64h17w17r1s7p0x3, n1c3k8h32w32u2x1.")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    parser = _Parser(
        prog=PROG,
        description="Winograd F(4x4,3x3) convolution as one persistent CUDA megakernel: "
                    "network sweeps, mappings and timelines (CPU executor and simulator "
                    "without a GPU).",
        epilog=SHAPE_STRING_HELP)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="raise errors with their Python traceback (anywhere on the line)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for command in (layers, tune, sweep, mapping, timeline, info):   # the order of --help
        command.add_parser(sub)
    return parser


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc}: {exc.filename}"
    return str(exc) or type(exc).__name__


def main(argv: list[str] | None = None, console: Console | None = None,
         err_console: Console | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 a check failed, 2 bad input or
    a refused run, 3 an unexpected error, 130 interrupted).  Every failure is one line on
    stderr; ``--debug`` raises unexpected errors with their traceback instead."""
    err = err_console if err_console is not None else Console(file=console_stream(sys.stderr))
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv                 # taken anywhere on the line, not only first
    try:
        args = build_parser().parse_args([a for a in argv if a != "--debug"])
    except SystemExit as exc:          # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except UsageError as exc:
        _error(err, str(exc))
        return 2
    out = console if console is not None else Console(file=console_stream(sys.stdout))
    try:
        return args.func(args, out, err)
    except KeyboardInterrupt:
        _error(err, "interrupted")
        return 130
    except Exception as exc:
        if debug:
            raise
        if isinstance(exc, MemoryError):
            _error(err, f"out of memory ({exc or 'the arrays do not fit'}); try a smaller --batch")
            return 2
        if isinstance(exc, (ValueError, OSError)):     # bad input, a path that cannot be written
            _error(err, _message(exc))
            return 2
        # a bug or a broken environment: still one line
        _error(err, f"unexpected {type(exc).__name__}: {_message(exc)} "
                    "(rerun with --debug for the traceback)")
        return 3
