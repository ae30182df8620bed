"""The ``megawino`` command line: argument parsing and rendering only.

Commands::

    megawino layers NETWORK      conv layers of a network (shapes, counts, FLOPs)
    megawino sweep NETWORK       run and check each layer; time, error, TFLOP/s
    megawino mapping LAYER       task counts and the ticket order of one layer
    megawino timeline LAYER      simulated (or measured) timeline of one layer
    megawino info                versions, GPU, nvcc

LAYER is a network layer name (``resnet50.conv2_x``, batch 64 unless ``--batch``)
or a shape string (``n64c64k64h56w56``, see :func:`megawino.spec.parse_shape`).
The work happens in the library (:mod:`megawino.sweep`, :mod:`megawino.mapping`,
:mod:`megawino.simulator`, ...), imported lazily so that ``--help`` and the CPU
commands never touch CUDA.  Bad input (ValueError) prints one red ``error:``
line on stderr and exits 2.

One module per command (:mod:`.layers`, :mod:`.tune`, :mod:`.sweep`, :mod:`.mapping`,
:mod:`.timeline`, :mod:`.info`), each with ``add_parser(sub)`` and ``cmd_<name>``;
:mod:`.common` holds layer resolution and the shared formatting helpers.
"""
from __future__ import annotations

import argparse

from rich.console import Console

from . import info, layers, mapping, sweep, timeline, tune
from .common import DEFAULT_LAYER_BATCH, _error, resolve_layer

__all__ = ["main", "build_parser", "resolve_layer", "DEFAULT_LAYER_BATCH"]

_strip_lines = mapping._strip_lines      # importable from here, as before the split (tests)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megawino",
        description="Winograd F(4x4,3x3) convolution as one persistent CUDA megakernel: "
                    "network sweeps, mappings and timelines (CPU executor and simulator "
                    "without a GPU).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for command in (layers, tune, sweep, mapping, timeline, info):   # the order of --help
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None, console: Console | None = None,
         err_console: Console | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 a check failed, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:          # --help, or argparse's own usage error (code 2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out = console if console is not None else Console()
    err = err_console if err_console is not None else Console(stderr=True)
    try:
        return args.func(args, out, err)
    except ValueError as exc:          # bad input: one line, no traceback
        _error(err, str(exc))
        return 2
    except OSError as exc:             # e.g. --json / --export path not writable
        _error(err, f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        return 2
    except KeyboardInterrupt:
        _error(err, "interrupted")
        return 130
