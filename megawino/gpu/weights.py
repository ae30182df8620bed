"""Prepared weights: the transformed filter U of the Winograd path and the packed filter matrix
of the direct path, kept per *weight token* so inference reuses them while the weights stay the
same.

A weight token is any hashable value the caller derives from the weight's identity and version
(``megawino.torch`` uses the storage address, PyTorch's version counter, shape and device), so a
changed weight arrives under a new token and is prepared again; the old entry ages out of the
least-recently-used cache, bounded in bytes (``MEGAWINO_WEIGHT_CACHE_MB``, default 4096); an
entry a captured CUDA graph reads is never evicted.
"""
from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from . import workspace

ENV_LIMIT = "MEGAWINO_WEIGHT_CACHE_MB"
DEFAULT_LIMIT_MB = 4096


def limit_bytes() -> int:
    from .call_checks import env_number
    return env_number(ENV_LIMIT, DEFAULT_LIMIT_MB, int, 0, 1 << 30) << 20      # up to a petabyte


@dataclasses.dataclass
class Entry:
    """One prepared weight.  ``ready``: some launch has written it; ``stream`` / ``event``: where
    and after what that happened (another stream waits on the event before reading)."""

    array: object
    ready: bool = False
    stream: int = 0
    event: object = None
    pinned: bool = False          # read by a captured CUDA graph: never evicted
    evicted: bool = False         # dropped from the cache (a launcher that holds it stops using it)


    def mark_ready(self, stream_ptr: int) -> None:
        """Called on the current stream (``stream_ptr``) right after the preparing launch."""
        from .nvrtc import cupy_module
        cupy = cupy_module()
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(cupy.cuda.get_current_stream())
        self.stream, self.event, self.ready = stream_ptr, event, True

    def wait_on(self, stream_ptr: int) -> None:
        """Order the current stream (``stream_ptr``) after the launch that prepared this entry."""
        if stream_ptr != self.stream and self.event is not None:
            from .nvrtc import cupy_module
            cupy_module().cuda.get_current_stream().wait_event(self.event)


class WeightCache:
    """Thread-safe LRU of prepared weights, bounded in bytes."""

    def __init__(self):
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def lookup(self, key) -> Entry | None:
        """The entry for ``key``, or None."""
        with self._lock:
            return self._entries.get(key)

    def ready(self, key) -> Entry | None:
        """The entry for ``key`` once a launch has written it, else None (also for key None)."""
        entry = self.lookup(key)
        return entry if entry is not None and entry.ready else None

    def get(self, key, shape, dtype=np.float32, zero: bool = False) -> Entry:
        """The entry for ``key``, made (uninitialised, or zero-filled) when missing."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
        array = workspace.alloc(shape, dtype)
        if zero:
            from .nvrtc import cupy_module
            cupy_module().cuda.runtime.memsetAsync(array.data.ptr, 0, array.nbytes,
                                                   workspace.current_stream_ptr())
        entry = Entry(array)
        with self._lock:
            if key in self._entries:          # another thread made it meanwhile
                return self._entries[key]
            self._entries[key] = entry
            self._bytes += array.nbytes
            limit = limit_bytes()
            for old_key in [k for k, e in self._entries.items() if not e.pinned and k != key]:
                if self._bytes <= limit:
                    break
                old = self._entries.pop(old_key)
                old.evicted = True
                self._bytes -= old.array.nbytes
        return entry

    def clear(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                entry.evicted = True
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


CACHE = WeightCache()


def prepared(key, shape, stream_ptr: int, capturing: bool, fill, stream_buffers):
    """The prepared weight array a launch reads.  ``key`` None (no weight token): the stream's
    buffer of ``stream_buffers`` (workspace.StreamBuffers), refilled by ``fill`` on every call;
    else the cache entry for ``key``, filled once and then reused (refilled while a CUDA graph
    is captured, whose replays must write it themselves)."""
    if key is None:
        scratch = stream_buffers.get(stream_ptr)
        fill(scratch)
        return scratch
    entry = CACHE.get(key, shape, zero=True)
    entry.pinned = entry.pinned or capturing
    if entry.ready and not capturing:
        entry.wait_on(stream_ptr)
    else:
        fill(entry.array)
        if not capturing:
            entry.mark_ready(stream_ptr)
    return entry.array
