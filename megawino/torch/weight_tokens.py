"""Weight tokens: a hashable identity of a weight tensor's current contents, under which the
runtime keeps its prepared (transformed or packed) filter; a changed weight gets a new token."""
from __future__ import annotations

import itertools
import warnings
import weakref

import torch

__all__ = ["weight_token", "weights_changed", "generation", "tracked"]

_SERIALS = itertools.count()
_generation = 0


class _Tracked:
    """What megawino.torch keeps about a weight tensor while it lives: a serial no other tensor
    shares, and its CuPy views per stream with the token they were made under."""

    __slots__ = ("ref", "serial", "token", "views")


# id(tensor) -> _Tracked.  Kept here, not as tensor attributes, which deepcopy and pickling
# would copy onto other tensors.
_TRACKED: dict = {}


def _forget(key: int):
    def callback(ref):
        entry = _TRACKED.get(key)
        if entry is not None and entry.ref is ref:
            del _TRACKED[key]
    return callback


def tracked(tensor: torch.Tensor) -> _Tracked:
    key = id(tensor)
    entry = _TRACKED.get(key)
    if entry is None or entry.ref() is not tensor:
        entry = _Tracked()
        entry.ref = weakref.ref(tensor, _forget(key))
        entry.serial, entry.token, entry.views = next(_SERIALS), None, {}
        _TRACKED[key] = entry
    return entry


def weights_changed() -> None:
    """Invalidate every cached transformed filter: call this after changing weights in a way
    PyTorch's version counter does not see (writes through ``tensor.data``)."""
    global _generation
    _generation += 1


def weight_token(weight: torch.Tensor):
    """Hashable identity of ``weight``'s current contents, or None where it cannot be known.

    A per-object serial (a new tensor at a reused address gets a new token), the address,
    PyTorch's version counter (bumped by every in-place write, load_state_dict included),
    shape, device and the :func:`weights_changed` generation.  The runtime keys prepared
    weights by token, path and layout, so one token serves every algorithm."""
    try:
        version = weight._version
    except RuntimeError:          # inference tensors carry no version counter: never cache
        _warn_inference_weight()
        return None
    return (tracked(weight).serial, weight.data_ptr(), version, tuple(weight.shape),
            weight.device.index, _generation)


_inference_warned = False


def _warn_inference_weight() -> None:
    global _inference_warned
    if not _inference_warned:
        _inference_warned = True
        warnings.warn("megawino.torch: a weight is an inference tensor (made or copied under "
                      "torch.inference_mode()), whose changes PyTorch does not track, so megawino "
                      "prepares it again at every call; make, copy or load the model outside "
                      "inference_mode (and run it inside) to reuse its prepared weights", stacklevel=4)


def generation() -> int:
    """The :func:`weights_changed` generation (the last field of every token)."""
    return _generation
