"""Repeated launches of one layer call: the kernels, grids and arguments fixed, the input and
output pointers set per call.

A plan's ``launcher(x, w, weight_token)`` (on the stream the launches will run on, outside
CUDA-graph capture, after a ``run`` with that weight token) returns a :class:`Launcher`; its
``launch(x_ptr, out_ptr)`` costs a few microseconds of host time, because the kernels' argument
arrays are built once and handed to ``cuLaunchKernel`` as they are, without CuPy's per-call
argument packing.  ``megawino.torch`` uses it for the later calls of a converted layer.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np


# numpy scalar type -> the ctypes type of its kernel parameter slot
_SLOT_TYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
               np.dtype(np.uint64): ctypes.c_uint64}


def _slot(value):
    """A ctypes slot holding ``value``: a CuPy array (its pointer), a NumPy scalar, a bool or an
    int32 Python int."""
    if hasattr(value, "data") and hasattr(value.data, "ptr"):
        return ctypes.c_uint64(int(value.data.ptr))
    if isinstance(value, (bool, np.bool_)):
        return ctypes.c_int32(int(value))
    if isinstance(value, np.generic):
        return _SLOT_TYPES[value.dtype](int(value))
    if isinstance(value, int):
        return ctypes.c_int32(value)
    raise TypeError(f"no kernel parameter slot for {type(value).__name__}")


class KernelLaunch:
    """One kernel with its grid, block and argument values (CuPy arrays stand for their
    pointers, and are not kept alive: the launcher's ``keep`` does that for the buffers it
    reads); :meth:`set` changes one argument, calling it launches on ``stream_ptr``."""

    __slots__ = ("_launch_kernel", "_kernel", "_function", "_shared_bytes", "_values", "_pointers", "_address", "_grid",
                 "_block", "_stream")

    def __init__(self, kernel, grid, block, args, stream_ptr: int):
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        from cupy_backends.cuda.api import driver
        self._launch_kernel = driver.launchKernel
        self._kernel = kernel                    # keeps its module loaded
        self._function = int(getattr(kernel, "kernel", kernel).ptr)
        self._shared_bytes = int(getattr(kernel, "shared_bytes", 0))   # nvrtc.GemmSmemKernel's
        self._values = [_slot(a) for a in args]
        self._pointers = (ctypes.c_void_p * len(args))(*(ctypes.addressof(v) for v in self._values))
        self._address = ctypes.addressof(self._pointers)
        self._grid, self._block, self._stream = grid, block, int(stream_ptr)

    def set(self, index: int, value: int) -> None:
        self._values[index].value = value

    def __call__(self) -> None:
        self._launch_kernel(self._function, *self._grid, *self._block, self._shared_bytes, self._stream, self._address,
                            0)


class Launcher:
    """The launches of one layer call in order; ``x_slots`` / ``out_slots`` name the (launch,
    argument) pairs that take the input / output pointer.  ``before(launches)`` runs first and
    may set more arguments (its result goes to ``after(result, launched)``, which runs last);
    both run under ``lock`` (default: the launcher's own), which also keeps two threads from
    mixing their pointers.  ``keep``: what the launches read (the plan, prepared weights,
    workspaces), kept alive with the launcher; :meth:`valid` is False once a cache has dropped
    (marked ``evicted``) any of them."""

    def __init__(self, launches, x_slots, out_slots, before=None, after=None, lock=None, keep=()):
        self._launches = list(launches)
        self._keep = tuple(keep)
        self._cached = [owner for owner in self._keep if hasattr(owner, "evicted")]
        self._x_slots, self._out_slots = tuple(x_slots), tuple(out_slots)
        self._before, self._after = before, after
        self._lock = lock if lock is not None else threading.Lock()

    def valid(self) -> bool:
        """Whether every cached object the launches read is still in its cache."""
        return not any(owner.evicted for owner in self._cached)

    def launch(self, x_ptr: int, out_ptr: int) -> None:
        with self._lock:
            context = self._before(self._launches) if self._before is not None else None
            for i, slot in self._x_slots:
                self._launches[i].set(slot, x_ptr)
            for i, slot in self._out_slots:
                self._launches[i].set(slot, out_ptr)
            try:
                for launch in self._launches:
                    launch()
            except BaseException:
                if self._after is not None:
                    self._after(context, False)
                raise
            if self._after is not None:
                self._after(context, True)
