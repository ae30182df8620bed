"""megawino.gpu.launch on the CPU: the argument array handed to cuLaunchKernel (read back through
the addresses it holds, against a recording stand-in for CuPy's driver module), the per-call
pointer slots and the hooks around a launch."""
import ctypes
import sys
import types

import numpy as np
import pytest

from megawino.gpu import launch


class FakeArray:
    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


@pytest.fixture
def driver(monkeypatch):
    """Every cuLaunchKernel call: function, grid, block, shared bytes, stream and the argument
    values, read back as (uint64, int32, int64, uint64, int32) through the pointer array."""
    calls = []

    def launchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * 5).from_address(params)
        kinds = (ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int32)
        values = tuple(kind.from_address(p).value for kind, p in zip(kinds, pointers))
        calls.append((f, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra))

    api = types.SimpleNamespace(driver=types.SimpleNamespace(launchKernel=launchKernel))
    for name, value in (("cupy_backends", types.SimpleNamespace(cuda=None)),
                        ("cupy_backends.cuda", types.SimpleNamespace(api=api)),
                        ("cupy_backends.cuda.api", api)):
        monkeypatch.setitem(sys.modules, name, value)
    return calls


def test_kernel_launch_hands_every_argument_by_address(driver):
    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xF00))   # a RawKernel's Function
    args = (FakeArray(0x7000_0000_1000), np.int32(-3), np.int64(1 << 40), np.uint64(2 ** 64 - 1), 5)
    k = launch.KernelLaunch(kernel, (4, 2), (256,), args, stream_ptr=77)
    k()
    k.set(0, 0x1234)
    k.set(1, 9)
    k()
    first, second = driver
    assert first[:5] == (0xF00, (4, 2, 1), (256, 1, 1), 0, 77) and first[6] == 0
    assert first[5] == (0x7000_0000_1000, -3, 1 << 40, 2 ** 64 - 1, 5)
    assert second[5] == (0x1234, 9, 1 << 40, 2 ** 64 - 1, 5)


def test_kernel_launch_passes_the_dynamic_shared_memory_of_a_gemm_kernel(driver):
    """A kernel that keeps the GEMM's shared memory dynamic (nvrtc.GemmSmemKernel) gets its
    shared_bytes on every launch; one without gets none."""
    gemm = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xB0), shared_bytes=65536)
    args = (np.uint64(1), np.int32(2), np.int64(3), np.uint64(4), 5)
    launch.KernelLaunch(gemm, (8,), (256,), args, stream_ptr=3)()
    launch.KernelLaunch(types.SimpleNamespace(ptr=0xB1), (8,), (256,), args, stream_ptr=3)()
    assert [(call[0], call[3]) for call in driver] == [(0xB0, 65536), (0xB1, 0)]


def test_kernel_launch_refuses_an_argument_it_cannot_pass(driver):
    with pytest.raises(TypeError, match="float"):
        launch.KernelLaunch(types.SimpleNamespace(ptr=1), (1,), (1,), (1.5,), 0)


def test_launcher_sets_the_pointers_of_each_call_and_runs_the_hooks(driver):
    kernel = types.SimpleNamespace(ptr=0xA)
    first = launch.KernelLaunch(kernel, (1,), (32,), (np.uint64(0), np.int32(1), np.int64(2), np.uint64(0), 3), 5)
    second = launch.KernelLaunch(kernel, (2,), (32,), (np.uint64(0), np.int32(4), np.int64(5), np.uint64(0), 6), 5)
    events = []

    def before(launches):
        launches[1].set(4, 40 + len(events))
        events.append("before")
        return "claimed"

    launcher = launch.Launcher([first, second], x_slots=[(0, 0)], out_slots=[(0, 3), (1, 3)],
                               before=before, after=lambda result, ok: events.append((result, ok)))
    launcher.launch(0x100, 0x200)
    launcher.launch(0x300, 0x400)
    assert [c[5] for c in driver] == [(0x100, 1, 2, 0x200, 3), (0, 4, 5, 0x200, 40),
                                      (0x300, 1, 2, 0x400, 3), (0, 4, 5, 0x400, 42)]
    assert events == ["before", ("claimed", True), "before", ("claimed", True)]
    assert launcher.valid()


def test_launcher_reports_a_failed_launch_to_its_after_hook(driver, monkeypatch):
    k = launch.KernelLaunch(types.SimpleNamespace(ptr=1), (1,), (1,), (np.uint64(0),) * 5, 0)

    def fail(*args):
        raise RuntimeError("launch failed")
    monkeypatch.setattr(k, "_launch_kernel", fail)
    seen = []
    launcher = launch.Launcher([k], [(0, 0)], [(0, 1)], before=lambda launches: "slot",
                               after=lambda result, ok: seen.append((result, ok)))
    with pytest.raises(RuntimeError, match="launch failed"):
        launcher.launch(1, 2)
    assert seen == [("slot", False)]
