"""``MegawinoConv2d`` and ``convert``: nn.Conv2d layers of a model run on megawino.

``convert`` turns every plain ``nn.Conv2d`` that megawino can run into a
:class:`MegawinoConv2d` in place (the same module object with a new class: parameters,
buffers, hooks and ``state_dict`` keys are unchanged, so checkpoints still load) and leaves
the others alone; :func:`report` says per layer what runs it and why.
"""
from __future__ import annotations

import dataclasses
import io
import shutil

import torch
from torch import nn

from ..gpu.nvrtc import DEFAULT_GEMM_MATH, check_gemm_math
from .functional import ALGO_DESCRIPTIONS, ALGOS, BACKENDS, conv2d_with_algo, conv_arguments
from .gpu import MEGAWINO_ALGOS, current_stream_handle, fast_call
from .ops import register_layer
from .routing import note_pytorch, pytorch_reason, traced_conv2d, tracing
from .precision import conv2d_ieee_fp32

# What ran megawino's kernels (the others are PyTorch's convolution, for a reason the report gives).
MEGAWINO_RUNS = frozenset(MEGAWINO_ALGOS) | {"cpu-executor"}

# (input shape, stream) pairs a converted layer keeps a FastCall for (a model calls a layer
# with one or two).
MAX_FAST_CALLS = 8

__all__ = ["MegawinoConv2d", "convert", "report", "unsupported_reason", "ConvertReport", "LayerRow"]


def _max_filter() -> int:
    from ..direct import MAX_FILTER
    return MAX_FILTER


def unsupported_reason(conv: nn.Conv2d) -> str | None:
    """Why megawino cannot run ``conv`` (None when it can): the ValueError text of
    :func:`conv_arguments`, a padding mode, a dtype, or a filter above the direct path's size."""
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r}: megawino pads with zeros only"
    if conv.weight.dtype != torch.float32:
        return f"weight dtype {conv.weight.dtype}: megawino runs float32 only"
    try:
        conv_arguments(conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.groups)
    except ValueError as err:
        return str(err)
    if max(conv.kernel_size) > _max_filter():
        r, s = conv.kernel_size
        return f"filter {r}x{s} is larger than the direct path's {_max_filter()}x{_max_filter()}"
    return None


def _check_settings(backend: str, algo: str, gemm_math: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
    check_gemm_math(gemm_math)


class MegawinoConv2d(nn.Conv2d):
    """An nn.Conv2d whose forward runs :func:`megawino.torch.conv2d` (same parameters and
    ``state_dict`` keys as nn.Conv2d).  ``backend``, ``algo`` and ``gemm_math`` as there;
    after a forward, ``megawino_algo`` names what ran and ``megawino_input_shape`` the input.

    Traced (torch.compile, torch.export, torch.jit.trace) the layer is the registered operator
    ``torch.ops.megawino.conv2d``, which finds the layer by ``megawino_id``.  An input megawino
    does not run (another dtype, torch.autocast, an empty batch, a device the backend does not
    run) takes nn.Conv2d's own forward, with one note per reason and process."""

    def __init__(self, *args, backend: str = "auto", algo: str = "auto",
                 gemm_math: str = DEFAULT_GEMM_MATH, **kwargs):
        _check_settings(backend, algo, gemm_math)
        super().__init__(*args, **kwargs)
        reason = unsupported_reason(self)
        if reason is not None:
            raise ValueError(reason)
        self._set_megawino(backend, algo, gemm_math)

    def _set_megawino(self, backend: str, algo: str, gemm_math: str) -> None:
        self.megawino_backend = backend
        self.megawino_request = algo
        self.megawino_gemm_math = gemm_math
        self.megawino_algo: str | None = None
        self.megawino_input_shape: tuple[int, ...] | None = None
        self.__dict__["_megawino_fast"] = {}     # (input shape, stream) -> gpu.FastCall (or None)
        self.__dict__["megawino_id"] = register_layer(self)

    def __setstate__(self, state):
        # A copied or unpickled layer is a layer of its own for the operator (a new id).
        super().__setstate__(state)
        if "megawino_backend" in self.__dict__:
            self.__dict__["megawino_id"] = register_layer(self)

    def megawino_arguments(self) -> tuple:
        """The operator's arguments besides the tensors and the layer id: stride and padding
        as pairs ("same" / "valid" resolved), backend, algo and gemm_math."""
        padding = self.padding
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":        # odd filters only (unsupported_reason)
            padding = tuple(size // 2 for size in self.kernel_size)
        return (list(self.stride), list(padding), self.megawino_backend, self.megawino_request,
                self.megawino_gemm_math)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if tracing(input):
            # torch.compile / export / jit.trace: the registered operator, which runs
            # megawino_forward at run time.
            weight, bias = self.weight, self.bias
            if pytorch_reason(input, weight, bias, self.megawino_backend, traced=True) is not None or (
                    torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad
                                                 or (bias is not None and bias.requires_grad))):
                return self._conv_forward(input, weight, bias)
            stride, padding, backend, algo, gemm_math = self.megawino_arguments()
            return traced_conv2d(input, weight, bias, stride, padding, self.megawino_id, backend, algo, gemm_math)
        return self.megawino_forward(input, self.weight, self.bias)

    def megawino_forward(self, input: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        """The eager forward with these parameters (the registered operator runs it too)."""
        # A layer whose later calls can repeat an earlier call's launches goes straight there.
        fasts = self.__dict__.get("_megawino_fast")
        if fasts is None:                     # a module converted by an earlier megawino
            fasts = self.__dict__["_megawino_fast"] = {}
        if fasts and not torch.is_autocast_enabled("cuda"):    # FastCalls are CUDA only
            stream = current_stream_handle(input)
            fast = fasts.get((input.shape, stream))
        else:
            stream = fast = None
        if fast is not None:
            out = fast(input, weight, bias, stream)
            if out is not None:
                if bias is not None:
                    out.add_(bias.view(1, -1, 1, 1))
                return out
        reason = pytorch_reason(input, weight, bias, self.megawino_backend)
        if reason is not None:
            # What nn.Conv2d does with this input (a model converted, then .half()-ed, included).
            note_pytorch(reason, input)
            self._record(reason, input.shape)
            return self._conv_forward(input, weight, bias)
        # A layer whose measured choice is PyTorch goes straight there: at batch 1 the host
        # time of the checks would otherwise cost more than the convolution.
        signature = (input.shape, input.device, input.dtype, input.is_contiguous(), input.requires_grad,
                     weight.requires_grad, torch.is_grad_enabled())
        if self.__dict__.get("_megawino_pytorch_signature") == signature:
            return conv2d_ieee_fp32(input, weight, bias, self.stride, self.padding)
        out, algo = conv2d_with_algo(
            input, weight, bias, self.stride, self.padding, self.dilation, self.groups,
            backend=self.megawino_backend, algo=self.megawino_request, gemm_math=self.megawino_gemm_math)
        self._record(algo, input.shape)
        self.__dict__["_megawino_pytorch_signature"] = signature if algo == "pytorch" else None
        if algo in MEGAWINO_ALGOS and input.is_cuda:
            if len(fasts) >= MAX_FAST_CALLS:
                fasts.clear()
            args = conv_arguments(self.kernel_size, self.stride, self.padding, self.dilation, self.groups)
            fasts[(input.shape, current_stream_handle(input))] = fast_call(input, weight, args.stride, args.padding, algo,
                                           self.megawino_gemm_math)
        return out

    def _record(self, algo: str, shape) -> None:
        shape = tuple(shape)
        if algo != self.megawino_algo or shape != self.megawino_input_shape:   # nn.Module's setattr is slow
            self.megawino_algo, self.megawino_input_shape = algo, shape

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, backend={self.megawino_backend!r}, "
                f"algo={self.megawino_request!r}, gemm_math={self.megawino_gemm_math!r}")


def convert(model: nn.Module, *, backend: str = "auto", algo: str = "auto",
            gemm_math: str = DEFAULT_GEMM_MATH, example_input=None, verbose: bool = True) -> nn.Module:
    """Run ``model``'s convolutions on megawino: every plain ``nn.Conv2d`` megawino can run
    becomes a :class:`MegawinoConv2d` **in place** (``model`` is returned); the others, and
    subclasses of nn.Conv2d with their own forward, stay as they are.

    ``example_input``: one forward under ``torch.inference_mode()`` right away, which makes
    the per-layer choice of ``algo="auto"`` (shown in the report).  ``verbose``: print the
    report (:func:`report`) as a rich table."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_settings(backend, algo, gemm_math)
    for module in model.modules():
        if type(module) is nn.Conv2d and unsupported_reason(module) is None:
            module.__class__ = MegawinoConv2d
        if isinstance(module, MegawinoConv2d):
            module._set_megawino(backend, algo, gemm_math)
    if example_input is not None:
        with torch.inference_mode():
            model(example_input)
    if verbose:
        from rich.console import Console
        Console().print(report(model).table())
    return model


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One nn.Conv2d of a model: its shape, whether megawino runs it and what ran last."""

    name: str
    in_channels: int
    out_channels: int
    kernel_size: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] | str
    replaced: bool
    algo: str | None          # what ran at the last forward (None: not run since convert)
    input_shape: tuple[int, ...] | None
    note: str                 # why it was left alone, or what a non-megawino algorithm means

    @property
    def shape(self) -> str:
        """``C->K RxS sSTRIDE pPADDING``, a pair shown once when both values agree."""
        def pair(value) -> str:
            if isinstance(value, str):
                return value
            return str(value[0]) if len(set(value)) == 1 else "x".join(map(str, value))
        r, s = self.kernel_size
        return f"{self.in_channels}->{self.out_channels} {r}x{s} s{pair(self.stride)} p{pair(self.padding)}"


@dataclasses.dataclass(frozen=True)
class ConvertReport:
    rows: tuple[LayerRow, ...]

    @property
    def replaced(self) -> list[str]:
        return [row.name for row in self.rows if row.replaced]

    @property
    def left_alone(self) -> dict[str, str]:
        return {row.name: row.note for row in self.rows if not row.replaced}

    @property
    def on_megawino(self) -> list[str]:
        """The converted layers whose last call ran megawino's kernels (not PyTorch's)."""
        return [row.name for row in self.rows if row.replaced and row.algo in MEGAWINO_RUNS]

    def title(self) -> str:
        converted, total = len(self.replaced), len(self.rows)
        ran = [row for row in self.rows if row.replaced and row.algo is not None]
        if not ran:
            return f"megawino.torch: {converted} of {total} Conv2d layers converted (each chooses at its first call)"
        return (f"megawino.torch: {len(self.on_megawino)} of {total} Conv2d layers ran on megawino at their "
                f"last call ({converted} converted, {len(ran) - len(self.on_megawino)} of those ran PyTorch)")

    def table(self):
        from rich.table import Table
        table = Table(title=self.title())
        for column in ("layer", "shape", "input", "runs on", "note"):
            table.add_column(column)
        for row in self.rows:
            if not row.replaced:
                runs_on = "[yellow]PyTorch (left alone)[/]"
            elif row.algo is None:
                runs_on = "megawino (chosen at first call)"
            else:
                runs_on = f"[green]{row.algo}[/]" if row.algo in MEGAWINO_RUNS else row.algo
            shape = "" if row.input_shape is None else "x".join(map(str, row.input_shape))
            table.add_row(row.name or "(model)", row.shape, shape, runs_on, row.note)
        return table

    def __rich__(self):
        return self.table()

    def __str__(self) -> str:
        # print(report) shows the table, as rich's console does, without colours.
        from rich.console import Console
        out = io.StringIO()
        Console(file=out, width=max(120, shutil.get_terminal_size().columns), color_system=None,
                force_terminal=False).print(self.table())
        return out.getvalue().rstrip("\n")


def report(model: nn.Module) -> ConvertReport:
    """Every nn.Conv2d of ``model`` (converted or not), in module order."""
    rows = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Conv2d):
            continue
        replaced = isinstance(module, MegawinoConv2d)
        algo = module.megawino_algo if replaced else None
        if replaced:
            note = ALGO_DESCRIPTIONS.get(algo, "")
        elif type(module) is not nn.Conv2d:
            note = f"{type(module).__name__} subclasses nn.Conv2d with its own forward"
        else:
            note = unsupported_reason(module) or "not converted"
        rows.append(LayerRow(name, module.in_channels, module.out_channels, tuple(module.kernel_size),
                             tuple(module.stride), module.padding if isinstance(module.padding, str)
                             else tuple(module.padding), replaced, algo,
                             module.megawino_input_shape if replaced else None, note))
    return ConvertReport(tuple(rows))
