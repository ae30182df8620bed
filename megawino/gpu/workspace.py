"""Device memory of the GPU runtime, allocated so that CUDA-graph capture keeps working.

* :func:`set_allocator` / :func:`alloc`: every runtime buffer comes from one allocator
  (CuPy's pool by default; ``megawino.torch`` installs PyTorch's caching allocator, so that
  buffers made while a stream is captured come from the graph's pool).
* :class:`PinnedArena`: host data reaches the device through pinned staging memory, taken
  before any capture, and an asynchronous copy on the current stream (neither a pageable copy
  nor a pinned allocation is allowed under capture; a captured graph replays the copy).
* :class:`PlanWorkspace`: the scratch of one Winograd plan on one stream.
* :class:`StatusRing`: each megakernel launch writes the scheduler's status line into a pinned
  host slot of its own at its end, so the host learns which launch fired its watchdog without
  waiting and without a copy in the stream.

Nothing here touches CUDA at import time.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from ..core import abi
from ..core.tasks import COUNTER_STRIDE
from .nvrtc import cupy_module

# A megakernel plan whose whole V and M would take more than this share of the GPU's memory makes
# them a ring of slots: the ring's waits cost a little time, running out of memory costs the call.
RING_MEMORY_SHARE = 0.25


def workspace_needs_ring(layout, device_bytes: int) -> bool:
    """Whether ``plan(ring_buffers=None)`` makes V and M of ``layout`` a ring on a GPU of
    ``device_bytes`` bytes."""
    whole = 4 * (np.prod(layout.v_shape, dtype=np.int64) + np.prod(layout.m_shape, dtype=np.int64))
    return bool(whole > RING_MEMORY_SHARE * device_bytes)

_MEMCPY_HOST_TO_DEVICE = 1

_allocator = None
_allocator_lock = threading.Lock()


def set_allocator(fn) -> None:
    """``fn(nbytes) -> CuPy uint8 array`` serves every buffer the runtime allocates from now on
    (``None``: CuPy's memory pool)."""
    global _allocator
    if fn is not None and not callable(fn):
        raise ValueError(f"the allocator must be callable or None, got {type(fn).__name__}")
    with _allocator_lock:
        _allocator = fn


def alloc(shape, dtype):
    """An uninitialised device array from the runtime's allocator."""
    cupy = cupy_module()
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    fn = _allocator
    if fn is None:
        return cupy.empty(shape, dtype=dtype)
    raw = fn(max(1, count) * dtype.itemsize)
    return raw[:count * dtype.itemsize].view(dtype).reshape(shape)


def current_stream_ptr() -> int:
    return int(cupy_module().cuda.get_current_stream().ptr)


def is_capturing() -> bool:
    """Whether the current stream is being captured into a CUDA graph."""
    stream = cupy_module().cuda.get_current_stream()
    try:
        return bool(stream.is_capturing())
    except Exception:   # the null stream cannot be captured
        return False


class StreamBuffers:
    """One zero-filled float32 buffer of ``shape`` per stream: what a plan packs weights into on
    calls without a weight token (a buffer another stream's launch may still read is never
    refilled)."""

    def __init__(self, shape):
        self.shape = tuple(shape)
        self._buffers = {}
        self._lock = threading.Lock()

    def get(self, stream_ptr: int):
        with self._lock:
            buf = self._buffers.get(stream_ptr)
            if buf is None:
                buf = self._buffers[stream_ptr] = alloc(self.shape, np.float32)
                cupy_module().cuda.runtime.memsetAsync(buf.data.ptr, 0, buf.nbytes, stream_ptr)
        return buf


class PinnedArena:
    """Pinned host memory for asynchronous uploads, taken before any capture: pinned allocation
    is not allowed while a stream is captured, and a captured graph replays its copies, so the
    host bytes stay as they are for the life of the owner."""

    ALIGN = 64

    def __init__(self, nbytes: int):
        self._chunks = []
        self._free = 0
        self._grow(nbytes)

    def _grow(self, nbytes: int) -> None:
        self._chunks.append(cupy_module().cuda.alloc_pinned_memory(nbytes))
        self._used, self._free = 0, nbytes

    def take(self, nbytes: int):
        """(pointer, NumPy uint8 view) of ``nbytes`` fresh pinned bytes."""
        size = -(-max(1, nbytes) // self.ALIGN) * self.ALIGN
        if size > self._free:
            if is_capturing():
                raise RuntimeError("megawino ran out of pinned staging memory during CUDA-graph capture: "
                                   "call the layer once on this stream before capturing")
            self._grow(max(size, 2 * self._chunks[-1].size()))
        chunk = self._chunks[-1]
        offset = self._used
        self._used += size
        self._free -= size
        return chunk.ptr + offset, np.frombuffer(chunk, np.uint8, nbytes, offset)

    def upload(self, dst, host: np.ndarray) -> None:
        """Copy ``host`` into the device array ``dst`` on the current stream."""
        host = np.ascontiguousarray(host)
        if host.nbytes != dst.nbytes:
            raise ValueError(f"upload of {host.nbytes} bytes into a {dst.nbytes}-byte buffer")
        ptr, view = self.take(host.nbytes)
        view[:] = host.view(np.uint8).ravel()
        cupy_module().cuda.runtime.memcpyAsync(dst.data.ptr, ptr, host.nbytes, _MEMCPY_HOST_TO_DEVICE,
                                               current_stream_ptr())


def memset(arr, byte: int, offset_words: int = 0, words: int | None = None) -> None:
    """Set bytes of a device array on the current stream (capturable)."""
    itemsize = arr.itemsize
    count = arr.size - offset_words if words is None else words
    cupy_module().cuda.runtime.memsetAsync(arr.data.ptr + offset_words * itemsize, byte, count * itemsize,
                                           current_stream_ptr())


class PlanWorkspace:
    """Scratch of one plan on one stream: V, M, an own U, counters, state, parameter blocks."""

    def __init__(self, plan, capturing: bool):
        lay = plan.task_layout
        self.pinned = plan.pinned
        self.created_in_capture = capturing
        self.U = alloc(lay.u_shape, np.float32)
        self.V = alloc(lay.v_shape, np.float32)
        self.M = alloc(lay.m_shape, np.float32)
        self.counters = alloc((lay.num_counters * COUNTER_STRIDE,), np.uint32)
        self.state = alloc((abi.STATE_WORDS,), np.int32)
        self.trace = (alloc((plan.graph.num_tasks, len(abi.TRACE_FIELDS)), np.int64)
                      if plan.traced else None)
        self._params = {}
        self.initialize()

    def initialize(self) -> None:
        """Counters and state to their launch-ready values, on the current stream."""
        memset(self.counters, 0)
        memset(self.state, 0)
        memset(self.state, 0xFF, abi.state_offset("BREAK"), 1)     # BREAK = -1: none
        if self.trace is not None:
            memset(self.trace, 0)
        for values, device in self._params.values():
            self.pinned.upload(device, values)

    def params(self, plan, form, U):
        key = (id(form), U.data.ptr)
        found = self._params.get(key)
        if found is None:
            values = plan.param_values(self, form, U)
            device = alloc(values.shape, values.dtype)
            self.pinned.upload(device, values)
            found = self._params[key] = (values, device)
        return found[1]


class WatchdogError(RuntimeError):
    """A megakernel launch whose scheduler wait timed out (its outputs are not valid)."""


class StatusRing:
    """Pinned host slots, one per launch in flight; the launch's last block writes the status line
    of the workspace it used into its slot.

    A slot reads ``-1`` in its FIRED word until the launch has written it; a workspace's FIRED grows by one
    for every launch that fired, so comparing it with the last value seen names the launch that
    fired.  Launches made during stream capture write into a slot of their own that is read at
    every synchronising check (each replay overwrites it).
    """

    SLOTS = 256
    WORDS = len(abi.STATUS_FIELDS)
    FIRED = abi.STATUS_FIELDS.index("FIRED")

    def __init__(self):
        cupy = cupy_module()
        self._pinned = cupy.cuda.alloc_pinned_memory(self.SLOTS * self.WORDS * 4)
        self._slots = np.frombuffer(self._pinned, np.int32, self.SLOTS * self.WORDS).reshape(
            self.SLOTS, self.WORDS)
        self._slots[:] = -1
        # The kernels write the slots through the device's address of this pinned memory.
        get_device_pointer = getattr(cupy.cuda.runtime, "hostGetDevicePointer", None)
        self._device_base = (int(get_device_pointer(self._pinned.ptr, 0)) if get_device_pointer
                             else int(self._pinned.ptr))
        self._next = 0
        self._pending = collections.deque()      # (launch number, slot, workspace key, describe)
        self._captured = {}                      # slot -> (launch number, workspace key, describe)
        self._busy = set()                       # slots pending or captured
        self._fired_seen = collections.Counter()
        self._launches = 0
        self._stashed = []                       # reports collected while making room

    def claim(self, key, capturing: bool, describe=str) -> int:
        """The pinned slot the next launch (of workspace ``key``) writes its status line into, as
        an address the kernel takes; ``describe(task id)`` names a task of that launch."""
        cupy = cupy_module()
        self._launches += 1
        if capturing and len(self._captured) >= self.SLOTS // 2:
            raise RuntimeError("too many captured megakernel launches of one plan (limit "
                               f"{self.SLOTS // 2})")
        if not capturing and len(self._pending) >= self.SLOTS - len(self._captured) - 1:
            cupy.cuda.Device().synchronize()
            self._stashed += self.collect(done_only=True)
        slot = self._free_slot()
        self._busy.add(slot)
        self._slots[slot, self.FIRED] = -1
        if capturing:
            self._captured[slot] = (self._launches, key, describe)
        else:
            self._pending.append((self._launches, slot, key, describe))
        return self._device_base + slot * self.WORDS * 4

    def abandon(self, address: int) -> None:
        """Forget the slot of a launch that never started (its launch call raised)."""
        slot = (address - self._device_base) // (self.WORDS * 4)
        self._captured.pop(slot, None)
        self._pending = collections.deque(e for e in self._pending if e[1] != slot)
        self._busy.discard(slot)

    def _free_slot(self) -> int:
        for _ in range(self.SLOTS):
            slot = self._next
            self._next = (self._next + 1) % self.SLOTS
            if slot not in self._busy:
                return slot
        raise RuntimeError("every watchdog status slot is in use")

    def collect(self, done_only: bool) -> list[str]:
        """Reports of launches that fired, oldest first.  ``done_only``: stop at the first
        launch whose copy has not landed (no waiting); otherwise the caller has synchronised."""
        reports, self._stashed = self._stashed, []
        while self._pending:
            launch, slot, key, describe = self._pending[0]
            fired = int(self._slots[slot, self.FIRED])
            if fired < 0:
                if done_only:
                    break
                raise RuntimeError(f"the watchdog status of launch {launch} did not arrive after a "
                                   "synchronize")
            self._pending.popleft()
            self._busy.discard(slot)
            reports += self._check(launch, slot, key, describe, fired)
        if not done_only:
            for slot, (launch, key, describe) in self._captured.items():
                fired = int(self._slots[slot, self.FIRED])
                if fired >= 0:
                    reports += self._check(launch, slot, key, describe, fired, graph=True)
        return reports

    def _check(self, launch: int, slot: int, key, describe, fired: int, graph: bool = False) -> list[str]:
        if fired <= self._fired_seen[key]:
            return []
        extra = fired - self._fired_seen[key]
        self._fired_seen[key] = fired
        words = dict(zip(abi.STATUS_FIELDS, (int(v) for v in self._slots[slot])))
        where = f"a CUDA-graph replay of launch {launch}" if graph else f"launch {launch}"
        more = f" ({extra - 1} earlier launch(es) also fired)" if extra > 1 else ""
        return [f"{where}: ticket {words['TICKET']} ({describe(words['TASK'])}) waited on counter "
                f"{words['COUNTER']} (value {words['VALUE']}, need {words['NEED']}){more}"]
