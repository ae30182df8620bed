"""cuDNN's fp32 precision flags as ATen reads them: whether PyTorch's convolutions run in IEEE
fp32 or TF32 now, and PyTorch's convolution in IEEE fp32 under any setting (the user's flags
restored after), which is what a layer that megawino hands to PyTorch runs."""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F

__all__ = ["convolutions_are_ieee", "ieee_fp32_convolutions", "conv2d_ieee_fp32"]


@functools.cache
def _conv_flags():
    """torch's per-operator cuDNN convolution flags where it has them (mixing them with the
    legacy ``allow_tf32`` is an error), else None."""
    flags = getattr(torch.backends.cudnn, "conv", None)
    return flags if flags is not None and hasattr(flags, "fp32_precision") else None


@functools.cache
def _conv_flag_access():
    """(read, write) of the per-operator conv flag through the C functions behind
    ``torch.backends.cudnn.conv.fp32_precision``, which skip the attribute's Python lookup that a
    PyTorch-chosen layer would otherwise pay at every read and write; None where this torch has no
    such functions or they do not read what the attribute reads."""
    flags = _conv_flags()
    read = getattr(torch._C, "_get_fp32_precision_getter", None)
    write = getattr(torch._C, "_set_fp32_precision_setter", None)
    names = vars(flags) if flags is not None else {}
    backend, op = names.get("backend"), names.get("op")
    if None in (read, write, backend, op):
        return None
    try:
        agrees = read(backend, op) == flags.fp32_precision
    except (RuntimeError, TypeError):
        return None
    if not agrees:
        return None
    return functools.partial(read, backend, op), functools.partial(write, backend, op)


def _resolves_to_ieee(conv_precision: str) -> bool:
    """Whether the per-operator conv flag ``conv_precision`` means IEEE fp32: "none" defers to
    the next flag up (cuDNN's, then every backend's, as ATen's ``Context::float32Precision``
    resolves it), and only "tf32" turns TF32 on.  A torch without a parent flag's attribute gives
    None: not known to be IEEE."""
    precision = conv_precision
    if precision == "none":
        precision = getattr(torch.backends.cudnn, "fp32_precision", None)
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", None)
    return precision is not None and precision != "tf32"


def _ieee_switch():
    """What sets cuDNN convolutions to IEEE fp32 -- (write, the user's value, the IEEE value),
    ``write`` taking one value -- or None when they already run in IEEE.  The legacy
    ``allow_tf32 = False`` leaves the per-operator conv flag at "none", which counts as IEEE."""
    access = _conv_flag_access()
    if access is not None:
        read, write = access
        saved = read()
        return None if _resolves_to_ieee(saved) else (write, saved, "ieee")
    flags = _conv_flags()
    if flags is None:
        legacy = torch.backends.cudnn.allow_tf32
        return (functools.partial(setattr, torch.backends.cudnn, "allow_tf32"), legacy, False) if legacy else None
    saved = flags.fp32_precision
    return None if _resolves_to_ieee(saved) else (functools.partial(setattr, flags, "fp32_precision"), saved, "ieee")


def convolutions_are_ieee() -> bool:
    """Whether cuDNN convolutions already run in IEEE fp32 (no TF32)."""
    return _ieee_switch() is None


@contextlib.contextmanager
def ieee_fp32_convolutions():
    """cuDNN convolutions in IEEE fp32 (no TF32) inside, the user's setting restored after."""
    switch = _ieee_switch()
    if switch is None:
        yield
        return
    write, saved, ieee = switch
    write(ieee)
    try:
        yield
    finally:
        write(saved)


def conv2d_ieee_fp32(x: torch.Tensor, weight: torch.Tensor, bias, stride, padding) -> torch.Tensor:
    """F.conv2d inside :func:`ieee_fp32_convolutions`, without the generator, which costs more host
    time than the switch itself on a layer called at batch 1."""
    switch = _ieee_switch()
    if switch is None:
        return F.conv2d(x, weight, bias, stride, padding)
    write, saved, ieee = switch
    write(ieee)
    try:
        return F.conv2d(x, weight, bias, stride, padding)
    finally:
        write(saved)
